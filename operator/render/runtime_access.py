"""What the runtime entrypoint may do on the API server, and how its pods are set up for it.

With ``spec.runtime.entrypoint: kvtune`` the vLLM pods run kvtune's entrypoint, which writes
its decisions under its pod's name into the ConfigMap ``kvtune-runtime-reports`` of its
namespace (``kvtune.runtime.report``); the operator reads them back
(``operator/monitoring/runtime_reports.py``).

The pods run as the ServiceAccount ``kvtune-runtime``, whose only right is ``get`` and
``patch`` on that one ConfigMap (``resourceNames``): no pod can be patched, nothing in any
other namespace touched. The Helm chart creates these four objects in every namespace listed
in ``runtime.namespaces`` (namespaced mode: every watched namespace), so the operator itself
creates no ServiceAccount, Role or RoleBinding and needs no right on pods beyond ``list``
(docs/rbac.md). ``namespace_objects`` is the one description of them: the chart's template
is checked against it (tests/packaging/test_pkg_chart.py) and the operator's tests create
them from it where no chart is installed.
"""

from __future__ import annotations

from typing import Any

ENTRYPOINT_COMMAND = ("python3", "-m", "kvtune.runtime")
SERVICE_ACCOUNT = "kvtune-runtime"
REPORTS_CONFIG_MAP = "kvtune-runtime-reports"
ROLE = "kvtune-runtime-reporter"
# What kvtune.runtime.report.publish reads: the pod's name and namespace (downward API) and
# where to write (POD_NAMESPACE: else the mounted service account's namespace file).
POD_ENV = (
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "KVTUNE_REPORT_CONFIGMAP", "value": REPORTS_CONFIG_MAP},
)
_RBAC = "rbac.authorization.k8s.io"


def namespace_objects(namespace: str, labels: dict[str, str] | None = None
                      ) -> list[dict[str, Any]]:
    """ServiceAccount, ConfigMap, Role and RoleBinding that let the runtime pods of one
    namespace report (created by the chart, in this order)."""
    def meta(name: str) -> dict[str, Any]:
        return {"name": name, "namespace": namespace, "labels": dict(labels or {})}

    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(SERVICE_ACCOUNT),
         "automountServiceAccountToken": True},
        # No data: each pod adds its own key; the chart must not own (and reset) the keys.
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(REPORTS_CONFIG_MAP)},
        {"apiVersion": f"{_RBAC}/v1", "kind": "Role", "metadata": meta(ROLE),
         # By name: the one ConfigMap; no pod, no other ConfigMap, no Secret.
         "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": [REPORTS_CONFIG_MAP], "verbs": ["get", "patch"]}]},
        {"apiVersion": f"{_RBAC}/v1", "kind": "RoleBinding", "metadata": meta(ROLE),
         "roleRef": {"apiGroup": _RBAC, "kind": "Role", "name": ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                       "namespace": namespace}]},
    ]


def use_runtime_access(pod: dict[str, Any], container: str = "vllm") -> None:
    """Run ``pod`` (a pod template, changed in place) as ``kvtune-runtime``, with the pod's
    name, namespace and the reports ConfigMap in the env of the vLLM container (else the
    first)."""
    spec = pod["spec"]
    spec["serviceAccountName"] = SERVICE_ACCOUNT
    spec["automountServiceAccountToken"] = True
    containers = spec["containers"]
    target = next((c for c in containers if c.get("name") == container), containers[0])
    env = list(target.get("env") or [])
    present = {e.get("name") for e in env if isinstance(e, dict)}
    env += [dict(e) for e in POD_ENV if e["name"] not in present]
    target["env"] = env
