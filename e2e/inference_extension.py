"""The Gateway API Inference Extension's CRDs, from the Go module proxy, for the local cluster.

The version is the one ``e2e/gomod/gie/go.mod`` pins (the ``epp`` component of e2e/binaries).
``go mod download -json MODULE@VERSION`` fetches the module into Go's module cache (once) and
says where it is; the CRDs are the release's own ``config/crd/bases/*.yaml``. Nothing is
copied into the repository.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kvtune.e2e.binaries import COMPONENTS, ensure_built, required_version
from kvtune.e2e.errors import ClusterError

MODULE = "sigs.k8s.io/gateway-api-inference-extension"
GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"


def pinned_version() -> str:
    return required_version(COMPONENTS["epp"])


def endpoint_picker() -> Path:
    """The endpoint picker binary (``cmd/epp``), built by e2e/build-binaries.sh on first use."""
    return ensure_built(["epp"])["epp"]


def module_dir(version: str | None = None, module: str = MODULE) -> Path:
    """The unpacked module in Go's module cache (downloaded on first use)."""
    ref = f"{module}@{version or pinned_version()}"
    try:
        out = subprocess.run(["go", "mod", "download", "-json", ref], capture_output=True,
                             text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError("gateway-api-inference-extension",
                           f"go mod download {ref}: {exc}") from exc
    try:
        info = json.loads(out.stdout)
    except json.JSONDecodeError:
        info = {}
    if out.returncode != 0 or "Dir" not in info:
        detail = info.get("Error") or out.stderr.strip()[-300:]
        raise ClusterError("gateway-api-inference-extension",
                           f"go mod download {ref} failed: {detail} (the Go module proxy must "
                           f"be reachable, or the module already in Go's module cache)")
    return Path(info["Dir"])


def crd_paths(version: str | None = None) -> list[Path]:
    """The release's CRD manifests (InferencePool v1, and the x-k8s.io alpha kinds)."""
    paths = sorted((module_dir(version) / "config" / "crd" / "bases").glob("*.yaml"))
    if not paths:
        raise ClusterError("gateway-api-inference-extension", f"{MODULE}: no CRDs under "
                           f"config/crd/bases")
    return paths


def gateway_api_crd_paths(channel: str = "experimental") -> list[Path]:
    """Gateway API's CRD manifests of the release kvtune renders HTTPRoutes for
    (``http_route.GATEWAY_API_VERSION``), of ``channel``: HTTPRoute's ``sessionPersistence``
    is in the experimental channel only."""
    from kvtune.operator.routing.http_route import GATEWAY_API_VERSION

    root = module_dir(GATEWAY_API_VERSION, GATEWAY_API_MODULE) / "config" / "crd" / channel
    paths = sorted(p for p in root.glob("gateway.networking.*.yaml") if "_vap_" not in p.name)
    if not paths:
        raise ClusterError("gateway-api", f"{GATEWAY_API_MODULE}: no CRDs under {root}")
    return paths
