"""Tells the operator what the runtime decided: a key in a ConfigMap, else a status file.

The report goes under the pod's own name into the ConfigMap ``KVTUNE_REPORT_CONFIGMAP``
(``kvtune-runtime-reports``) of the pod's namespace, written with the pod's own service
account (token, CA and namespace mounted at the standard path; the pod name from the
downward API as ``POD_NAME``), using only the standard library so the vLLM image needs
nothing more. That account (``kvtune-runtime``, created by the chart) may ``get`` and
``patch`` that one ConfigMap and nothing else: no pod, in particular not its own. Without
it (or outside Kubernetes) the report goes to a file, which ``kubectl exec … cat`` and the
logs still show.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_REPORTS_CONFIG_MAP = "kvtune-runtime-reports"
SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_STATUS_FILE = Path("/tmp/kvtune/runtime-report.json")
# Kubernetes copies this file into the pod status (lastState.terminated.message) on exit.
TERMINATION_LOG = Path("/dev/termination-log")
# Pods come and go (rollouts, restarts); each write drops the oldest reports beyond this
# many, so the ConfigMap stays far below its 1 MiB limit (a report is about 1 KiB).
MAX_REPORTS = 200


def _request(url: str, *, method: str, token: str, ca_file: str | None,
             timeout_seconds: float, body: bytes | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/merge-patch+json"
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https") else None
    with urllib.request.urlopen(request, timeout=timeout_seconds, context=context) as response:
        if response.status >= 300:
            raise RuntimeError(f"{method} {url} answered {response.status}")
        answer = json.loads(response.read() or b"{}")
    return answer if isinstance(answer, dict) else {}


def _oldest_beyond(data: dict[str, str], keep: int) -> list[str]:
    def when(key: str) -> str:
        try:
            return str(json.loads(data[key]).get("time") or "")
        except (ValueError, AttributeError):
            return ""
    return sorted(data, key=when)[: max(0, len(data) - keep)]


def patch_report_config_map(
    report: dict[str, Any],
    *,
    api_base_url: str,
    namespace: str,
    pod_name: str,
    config_map: str,
    token: str,
    ca_file: str | None,
    timeout_seconds: float = 5.0,
) -> None:
    """Merge-patch the report under ``pod_name`` into the ConfigMap (dropping the oldest
    reports beyond ``MAX_REPORTS``); raises on any failure."""
    url = f"{api_base_url.rstrip('/')}/api/v1/namespaces/{namespace}/configmaps/{config_map}"
    current = _request(url, method="GET", token=token, ca_file=ca_file,
                       timeout_seconds=timeout_seconds)
    others = {k: v for k, v in (current.get("data") or {}).items() if k != pod_name}
    data: dict[str, str | None] = {k: None for k in _oldest_beyond(others, MAX_REPORTS - 1)}
    data[pod_name] = json.dumps(report, sort_keys=True)
    _request(url, method="PATCH", token=token, ca_file=ca_file,
             timeout_seconds=timeout_seconds, body=json.dumps({"data": data}).encode())


def publish(report: dict[str, Any], env: dict[str, str] | None = None) -> str:
    """Report through the API when in a pod, else to the status file. Returns where it went."""
    env = dict(os.environ) if env is None else env
    status_file = Path(env.get("KVTUNE_STATUS_FILE", str(DEFAULT_STATUS_FILE)))
    sa_dir = Path(env.get("KVTUNE_SERVICEACCOUNT_DIR", str(SERVICEACCOUNT_DIR)))
    pod_name = env.get("POD_NAME")
    config_map = env.get("KVTUNE_REPORT_CONFIGMAP") or DEFAULT_REPORTS_CONFIG_MAP
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    failure = "not in a pod (POD_NAME or KUBERNETES_SERVICE_HOST unset)"
    if pod_name and host and (sa_dir / "token").exists():
        namespace = env.get("POD_NAMESPACE") or (sa_dir / "namespace").read_text().strip()
        base = env.get("KVTUNE_API_URL") or f"https://{host}:{port}"
        ca = sa_dir / "ca.crt"
        try:
            patch_report_config_map(
                report,
                api_base_url=base,
                namespace=namespace,
                pod_name=pod_name,
                config_map=config_map,
                token=(sa_dir / "token").read_text().strip(),
                ca_file=str(ca) if ca.exists() else None,
            )
            return f"ConfigMap {namespace}/{config_map} key {pod_name}"
        except (OSError, ValueError, urllib.error.URLError, RuntimeError) as err:
            failure = f"writing ConfigMap {namespace}/{config_map} failed: {err}"
    # Reporting is best effort: a read-only filesystem must not keep vLLM from starting.
    try:
        status_file.parent.mkdir(parents=True, exist_ok=True)
        status_file.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    except OSError as err:
        return f"nowhere: {failure}; writing {status_file} failed: {err}"
    return f"file {status_file} ({failure})"


def write_termination_message(message: str, path: Path = TERMINATION_LOG) -> None:
    """Best effort: the refusal shows in `kubectl describe pod` as the termination message."""
    with contextlib.suppress(OSError):
        path.write_text(message[:4096])  # Kubernetes keeps at most 4096 bytes
