"""The Gateway API Inference Extension's CRDs, from the Go module proxy, for the local cluster.

The version is the one ``e2e/gomod/gie/go.mod`` pins. ``go mod download -json MODULE@VERSION``
fetches the module into Go's module cache (once) and says where it is; the CRDs are the
release's own ``config/crd/bases/*.yaml``. Nothing is copied into the repository.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from kvtune.e2e.binaries import gomod_dir
from kvtune.e2e.errors import ClusterError

MODULE = "sigs.k8s.io/gateway-api-inference-extension"


def pinned_version() -> str:
    text = (gomod_dir() / "gie" / "go.mod").read_text()
    match = re.search(rf"^\s*require\s+{re.escape(MODULE)}\s+(v\S+)", text, re.M)
    if match is None:
        raise ClusterError(f"e2e/gomod/gie/go.mod does not require {MODULE}")
    return match.group(1)


def module_dir(version: str | None = None) -> Path:
    """The unpacked module in Go's module cache (downloaded on first use)."""
    ref = f"{MODULE}@{version or pinned_version()}"
    try:
        out = subprocess.run(["go", "mod", "download", "-json", ref], capture_output=True,
                             text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"go mod download {ref}: {exc}") from exc
    try:
        info = json.loads(out.stdout)
    except json.JSONDecodeError:
        info = {}
    if out.returncode != 0 or "Dir" not in info:
        detail = info.get("Error") or out.stderr.strip()[-300:]
        raise ClusterError(f"go mod download {ref} failed: {detail} (the Go module proxy must "
                           f"be reachable, or GOFLAGS=-mod=mod with a warm module cache)")
    return Path(info["Dir"])


def crd_paths(version: str | None = None) -> list[Path]:
    """The release's CRD manifests (InferencePool v1, and the x-k8s.io alpha kinds)."""
    paths = sorted((module_dir(version) / "config" / "crd" / "bases").glob("*.yaml"))
    if not paths:
        raise ClusterError(f"{MODULE}: no CRDs under config/crd/bases")
    return paths
