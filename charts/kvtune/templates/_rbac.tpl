{{/*
The operator's permissions, one concern per block, exactly what it calls (docs/rbac.md).
Namespaced rules go into a ClusterRole in cluster mode and into a Role per watched namespace
in namespaced mode; the cluster-scoped reads (Nodes, CRDs) always need a ClusterRole.
*/}}

{{/* InferenceDeployments: kopf lists and watches them, the retune timer reads one, kopf
patches its bookkeeping annotations; the status subresource is its own rule (merge patches
of status only when it changed), so it can be audited and granted apart. */}}
{{- define "kvtune.rules.inferencedeployments" -}}
- apiGroups: [kvtune.io]
  resources: [inferencedeployments]
  verbs: [get, list, watch, patch]
- apiGroups: [kvtune.io]
  resources: [inferencedeployments/status]
  verbs: [patch]
{{- end -}}

{{/* What the operator renders per pool: server-side apply (patch, and create when the
object is new), prune by label (list, delete); the rollout timer reads Deployments and
LeaderWorkerSets (a pool whose replicas span nodes, docs/multi-node.md); get: before
applying, the operator checks an object of that name is absent or its own. */}}
{{- define "kvtune.rules.rendered" -}}
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, create, patch, delete]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, create, patch, delete]
{{- end -}}

{{/* spec.runtime.entrypoint: kvtune. The runtime-reports timer lists the pools' pods (by
label) to match the reports in each namespace's ConfigMap kvtune-runtime-reports (read with
the "reads" concern's get on configmaps) to the pods that run the current plan. Nothing else
on pods: the runtime's ServiceAccount, Role and RoleBinding are the chart's
(templates/runtime-access.yaml), so the operator creates no RBAC object and patches no pod. */}}
{{- define "kvtune.rules.pods" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
{{- end -}}

{{/* Each InferenceDeployment's alert rules (SLO, KV cache) and its pools' PodMonitors or
ServiceMonitors, server-side applied by the retune timer when the Prometheus operator's API is
served; get + delete to remove kvtune's own when spec.monitoring switches them off. */}}
{{- define "kvtune.rules.alerting" -}}
- apiGroups: [monitoring.coreos.com]
  resources: [prometheusrules, podmonitors, servicemonitors]
  verbs: [create, patch, get, delete]
{{- end -}}

{{/* The KV-quality calibration (docs/quality.md): the Job that measures a narrower KV dtype
on the pool's nodes (server-side apply after the ownership check's get; list by label to find
this InferenceDeployment's Jobs and read their status) and the report ConfigMap per
InferenceDeployment and model revision (server-side apply; read with the "reads" concern's
get). The Job's pods are listed with the "pods" concern's list. Granted by a Role in each
runtime namespace only, in both modes (templates/rbac.yaml). */}}
{{- define "kvtune.rules.calibration" -}}
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, create, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, patch]
{{- end -}}

{{/* search.mode job or auto (operator/search/search_jobs.py, docs/search-jobs.md): a pool's goodput
search as a Job, its input (and then its answer) in a ConfigMap, both owned by the
InferenceDeployment and named by the input's digest. get: the ownership check before an
apply and the Job's status; list: the Job's pods (the "pods" concern) and the pool's Jobs and
ConfigMaps of older inputs, deleted with delete (the Job once its answer is kept). The Job's
pods get no token and need no right. Granted in the namespaces the operator serves. */}}
{{- define "kvtune.rules.searchjobs" -}}
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, create, patch, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [list, create, patch, delete]
{{- end -}}

{{/* spec.routing (operator/routing/inference_pool.py): each pool's Gateway API Inference Extension
InferencePool and its endpoint picker's configuration ConfigMap, and with spec.routing.gateway
the InferenceDeployment's HTTPRoute (operator/routing/http_route.py), server-side applied (get: the
ownership check before an apply; list + delete: kvtune's own InferencePools of pools removed
from the spec, and everything routing rendered once spec.routing turns it off). The endpoint
picker's Deployment and Service are "rendered". RoutingReady (operator/monitoring/routing_status.py)
reads the HTTPRoute's status with the get above, the pickers' Deployments with "rendered"'s
get, and whether the pickers' ServiceAccount exists: get on that one name only. Granted only
with the chart value routing.enabled. */}}
{{- define "kvtune.rules.routing" -}}
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, list, create, patch, delete]
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [serviceaccounts]
  resourceNames: [kvtune-endpoint-picker]
  verbs: [get]
{{- end -}}

{{/* Model configs (config.json) and pod templates that the spec references by name. */}}
{{- define "kvtune.rules.reads" -}}
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
{{- end -}}

{{/* Events about plans and rollouts (kvtune's own and kopf's warnings). */}}
{{- define "kvtune.rules.events" -}}
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* GPU pool discovery reads Node labels (nvidia.com/gpu.product …) and kopf watches
them; kopf observes CRDs to notice when the InferenceDeployment CRD appears or changes. */}}
{{- define "kvtune.rules.cluster" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.operator.namespaced }}
{{- /* kopf serving named namespaces observes which exist (it retries for ~20 s, then
falls back to assuming them, when it cannot): names only, no content. */}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end -}}

{{/* kopf peering: list/watch the peering kind, patch only this release's peering object. */}}
{{- define "kvtune.rules.peering" -}}
{{- $resource := ternary "kopfpeerings" "clusterkopfpeerings" .Values.operator.namespaced -}}
- apiGroups: [kopf.dev]
  resources: [{{ $resource }}]
  verbs: [list, watch]
- apiGroups: [kopf.dev]
  resources: [{{ $resource }}]
  resourceNames: [{{ include "kvtune.peeringName" . }}]
  verbs: [get, patch]
{{- end -}}

{{/* The namespaces the namespaced rules are granted in (namespaced mode). */}}
{{- define "kvtune.rbacNamespaces" -}}
{{- include "kvtune.watchNamespaces" . -}}
{{- end -}}
