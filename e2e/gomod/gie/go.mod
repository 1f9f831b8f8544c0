// The Gateway API Inference Extension release whose CRDs (InferencePool v1) the routing tests
// install into the local control plane, and whose endpoint picker (cmd/epp) reads the
// configuration kvtune renders. Read by kvtune.e2e.inference_extension.
module kvtune.local/gie

go 1.25.0

require sigs.k8s.io/gateway-api-inference-extension v1.5.0
