"""What the runtime entrypoint may do on the API server: its ServiceAccount, Role, RoleBinding.

With ``spec.runtime.entrypoint: kvtune`` the vLLM pods run kvtune's entrypoint, which patches
its decisions into its own pod's ``kvtune.io/runtime-report`` annotation
(``kvtune.runtime.report``). These three objects, one set per InferenceDeployment, give the
pods exactly that: ``get`` and ``patch`` on pods in the InferenceDeployment's namespace. Pure
builders; the reconcile applies them with the pool's objects (owner reference included).
"""

from __future__ import annotations

from typing import Any

ENTRYPOINT_COMMAND = ("python3", "-m", "kvtune.runtime")
# The downward-API variables kvtune.runtime.report.publish reads (POD_NAMESPACE: else the
# mounted service account's namespace file).
POD_ENV = (
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
)
_RBAC = "rbac.authorization.k8s.io"


def runtime_access_objects(service_account: str, namespace: str,
                           labels: dict[str, str]) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding (all named ``service_account``) of one
    InferenceDeployment's runtime pods."""
    sa = service_account
    meta = {"name": sa, "namespace": namespace, "labels": dict(labels)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta),
         "automountServiceAccountToken": True},
        {"apiVersion": f"{_RBAC}/v1", "kind": "Role", "metadata": dict(meta),
         # resourceNames cannot narrow this to the pool's pods: a Deployment's pods get
         # generated names (<replicaset>-<random>) that are unknown when the Role is written,
         # and RBAC matches names exactly (no prefixes, no label selectors). So the pods may
         # patch any pod of this namespace, and nothing in any other namespace.
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]},
        {"apiVersion": f"{_RBAC}/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": _RBAC, "kind": "Role", "name": sa},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]},
    ]


def use_runtime_access(pod: dict[str, Any], service_account: str,
                       container: str = "vllm") -> None:
    """Run ``pod`` (a pod template, changed in place) as ``service_account``, with the pod's
    name and namespace in the env of the vLLM container (else the first)."""
    spec = pod["spec"]
    spec["serviceAccountName"] = service_account
    spec["automountServiceAccountToken"] = True
    containers = spec["containers"]
    target = next((c for c in containers if c.get("name") == container), containers[0])
    env = list(target.get("env") or [])
    present = {e.get("name") for e in env if isinstance(e, dict)}
    env += [dict(e) for e in POD_ENV if e["name"] not in present]
    target["env"] = env
