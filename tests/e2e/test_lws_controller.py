"""The LeaderWorkerSet controller's build pin and loopback set-up (e2e/lws_controller.py), no
cluster needed (tests/operator/test_op_lws_controller_cluster.py runs the controller)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from kvtune.e2e import binaries
from kvtune.e2e import lws_controller as ctl
from kvtune.operator.render.leader_worker_set import LWS_VERSION

# The shape of the release's config/webhook/manifests.yaml (one webhook of each kind kept).
MANIFESTS = """
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system,
              path: /validate-leaderworkerset-x-k8s-io-v1-leaderworkerset}
  failurePolicy: Fail
  name: vleaderworkerset.kb.io
  rules:
  - {apiGroups: [leaderworkerset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE],
     resources: [leaderworkersets]}
  sideEffects: None
"""


def test_the_controller_is_built_at_the_version_kvtune_renders_for() -> None:
    component = binaries.COMPONENTS[ctl.COMPONENT]
    assert ctl.pinned_version() == LWS_VERSION
    assert binaries.build_dir(component).name == f"lws-{LWS_VERSION}"
    assert component.executables == (ctl.EXECUTABLE,)
    # build-binaries.sh knows the component and renames `go build`'s `cmd` to the executable.
    script = binaries.BUILD_SCRIPT.read_text()
    assert "build lws " in script and f'"$out.tmp/{ctl.EXECUTABLE}"' in script


def test_the_webhooks_are_served_on_loopback_for_the_given_namespaces_only() -> None:
    configs = ctl.webhook_configurations(MANIFESTS, "https://127.0.0.1:9443", b"PEM", ["a"])
    assert [c["metadata"]["name"] for c in configs] == [
        "kvtune-test-lws-mutating-webhook-configuration",
        "kvtune-test-lws-validating-webhook-configuration"]
    pod_hook, set_hook = configs[0]["webhooks"][0], configs[1]["webhooks"][0]
    assert pod_hook["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate--v1-pod",
                                        "caBundle": base64.b64encode(b"PEM").decode()}
    for hook in (pod_hook, set_hook):
        assert hook["namespaceSelector"]["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a"]}]
        assert "service" not in hook["clientConfig"]
    # Only pods of a set meet the pod webhook (the release's kustomize patch); LWSs all do.
    assert pod_hook["objectSelector"]["matchExpressions"] == [
        {"key": ctl.SET_NAME_LABEL, "operator": "Exists"}]
    assert "objectSelector" not in set_hook


def test_the_manager_listens_on_loopback_only_with_its_own_certificate(tmp_path: Path) -> None:
    config = ctl.configuration(9443, tmp_path, 8081, 8443)
    assert config["webhook"]["host"] == "127.0.0.1"
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    assert config["metrics"]["bindAddress"] == "127.0.0.1:8443"
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    yaml.safe_dump(config)  # what is written to the --config file
    pem = ctl.write_serving_cert(tmp_path)
    assert (tmp_path / "tls.crt").read_bytes() == pem
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
