"""Tells the operator what the runtime decided: a pod annotation, else a status file.

The annotation is patched with the pod's own service account (token, CA and namespace
mounted at the standard path; the pod name from the downward API as ``POD_NAME``), using
only the standard library so the vLLM image needs nothing more. The operator's rendered
Role for the runtime must allow ``patch`` on ``pods``; without it (or outside Kubernetes)
the report goes to a file, which ``kubectl exec … cat`` and the logs still show.
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

REPORT_ANNOTATION = "kvtune.io/runtime-report"
SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_STATUS_FILE = Path("/tmp/kvtune/runtime-report.json")
# Kubernetes copies this file into the pod status (lastState.terminated.message) on exit.
TERMINATION_LOG = Path("/dev/termination-log")


def patch_pod_annotation(
    report: dict[str, Any],
    *,
    api_base_url: str,
    namespace: str,
    pod_name: str,
    token: str,
    ca_file: str | None,
    timeout_seconds: float = 5.0,
    annotation: str = REPORT_ANNOTATION,
) -> None:
    """Merge-patch the report into the pod's annotations; raises on any failure."""
    body = json.dumps(
        {"metadata": {"annotations": {annotation: json.dumps(report, sort_keys=True)}}}
    ).encode()
    url = f"{api_base_url.rstrip('/')}/api/v1/namespaces/{namespace}/pods/{pod_name}"
    request = urllib.request.Request(
        url,
        data=body,
        method="PATCH",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/merge-patch+json",
            "Accept": "application/json",
        },
    )
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https") else None
    with urllib.request.urlopen(request, timeout=timeout_seconds, context=context) as response:
        if response.status >= 300:
            raise RuntimeError(f"PATCH {url} answered {response.status}")


def publish(report: dict[str, Any], env: dict[str, str] | None = None,
            annotation: str = REPORT_ANNOTATION) -> str:
    """Report through the API when in a pod, else to the status file. Returns where it went.
    (The KV-quality calibration Job reports the same way under its own annotation.)"""
    env = dict(os.environ) if env is None else env
    status_file = Path(env.get("KVTUNE_STATUS_FILE", str(DEFAULT_STATUS_FILE)))
    sa_dir = Path(env.get("KVTUNE_SERVICEACCOUNT_DIR", str(SERVICEACCOUNT_DIR)))
    pod_name = env.get("POD_NAME")
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    failure = "not in a pod (POD_NAME or KUBERNETES_SERVICE_HOST unset)"
    if pod_name and host and (sa_dir / "token").exists():
        namespace = env.get("POD_NAMESPACE") or (sa_dir / "namespace").read_text().strip()
        base = env.get("KVTUNE_API_URL") or f"https://{host}:{port}"
        ca = sa_dir / "ca.crt"
        try:
            patch_pod_annotation(
                report,
                api_base_url=base,
                namespace=namespace,
                pod_name=pod_name,
                token=(sa_dir / "token").read_text().strip(),
                ca_file=str(ca) if ca.exists() else None,
                annotation=annotation,
            )
            return f"annotation {annotation} on pod {namespace}/{pod_name}"
        except (OSError, urllib.error.URLError, RuntimeError) as err:
            failure = f"patching pod {namespace}/{pod_name} failed: {err}"
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
