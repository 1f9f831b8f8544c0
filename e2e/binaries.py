"""Where the control-plane binaries live, and building them when they are missing.

The binaries are built by ``e2e/build-binaries.sh`` from the Go modules under ``e2e/gomod/``
and cached by version under ``~/.cache/kvtune/bin/<name>-<version>/`` (``$KVTUNE_CACHE``
moves the cache). This module reads the same go.mod files to know the versions, so the Python
side and the build script can never disagree about which build is current.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvtune.e2e.errors import ClusterError, log_tail

E2E_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = E2E_DIR / "build-binaries.sh"


def cache_dir() -> Path:
    return Path(os.environ.get("KVTUNE_CACHE", Path.home() / ".cache" / "kvtune"))


def gomod_dir() -> Path:
    return Path(os.environ.get("KVTUNE_GOMOD_DIR", E2E_DIR / "gomod"))


@dataclass(frozen=True)
class Component:
    """One cached build: ``name`` is the build-binaries.sh component, ``module`` what pins it."""

    name: str
    gomod: str
    module: str
    executables: tuple[str, ...]
    # A second pinned module whose version is stamped into the build (helm: client-go, the
    # Kubernetes version `helm template` assumes) and therefore part of the cache key.
    stamped_module: str | None = None


COMPONENTS: dict[str, Component] = {
    "etcd": Component("etcd", "etcd", "go.etcd.io/etcd/server/v3", ("etcd",)),
    "kube": Component(
        "kube",
        "k8s",
        "k8s.io/kubernetes",
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler"),
    ),
    "kwok": Component("kwok", "kwok", "sigs.k8s.io/kwok", ("kwok",)),
    "helm": Component("helm", "helm", "helm.sh/helm/v3", ("helm",), "k8s.io/client-go"),
    # The Gateway API Inference Extension's endpoint picker: the routing tests run it on the
    # configuration kvtune renders.
    "epp": Component("epp", "gie", "sigs.k8s.io/gateway-api-inference-extension", ("epp",)),
    # The LeaderWorkerSet controller manager (cmd/, renamed from `cmd`): the multi-node tests
    # run it so that the groups' pods and the LWS status are the real controller's.
    "lws": Component("lws", "lws", "sigs.k8s.io/lws", ("lws-controller",)),
}


def _required(component: Component, module: str, gomod: Path | None) -> str:
    go_mod = (gomod or gomod_dir()) / component.gomod / "go.mod"
    text = go_mod.read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.M)
    if match is None:
        raise ClusterError(component.name, f"{go_mod} does not require {module}")
    return match.group(1)


def required_version(component: Component, gomod: Path | None = None) -> str:
    """The version of ``component.module`` that its go.mod requires (``require M V`` or a block)."""
    return _required(component, component.module, gomod)


def cache_key(component: Component, gomod: Path | None = None) -> str:
    """The version part of the cache directory, as e2e/build-binaries.sh names it: the module's
    version, plus ``-kubeMAJOR.MINOR`` where a client-go version is stamped in (helm's
    Makefile: client-go v0.34.x -> Kubernetes 1.34)."""
    version = required_version(component, gomod)
    if component.stamped_module is None:
        return version
    stamped = _required(component, component.stamped_module, gomod).lstrip("v").split(".")
    return f"{version}-kube{int(stamped[0]) + 1}.{stamped[1]}"


def build_dir(component: Component, gomod: Path | None = None) -> Path:
    return cache_dir() / "bin" / f"{component.name}-{cache_key(component, gomod)}"


def build_log(component: Component, gomod: Path | None = None) -> Path:
    return cache_dir() / "logs" / f"build-{component.name}-{cache_key(component, gomod)}.log"


def is_built(component: Component, gomod: Path | None = None) -> bool:
    out = build_dir(component, gomod)
    executables = (out / exe for exe in component.executables)
    return (out / ".complete").is_file() and all(path.is_file() for path in executables)


def ensure_built(names: list[str], gomod: Path | None = None) -> dict[str, Path]:
    """Path of every executable of the named components, building the missing ones first.

    A cold build of ``kube`` takes many minutes; the script's progress goes to our stderr so
    that a person waiting sees it move. A failed build raises :class:`ClusterError` naming the
    component and its build log.
    """
    paths: dict[str, Path] = {}
    for name in names:
        component = COMPONENTS[name]
        if not is_built(component, gomod):
            env = dict(os.environ)
            if gomod is not None:
                env["KVTUNE_GOMOD_DIR"] = str(gomod)
            result = subprocess.run(
                ["bash", str(BUILD_SCRIPT), name], env=env, stderr=sys.stderr, check=False
            )
            log = build_log(component, gomod)
            if result.returncode != 0 or not is_built(component, gomod):
                raise ClusterError(
                    f"build of {name} {required_version(component, gomod)}",
                    f"e2e/build-binaries.sh {name} exited with status {result.returncode}: "
                    f"{log_tail(log, 4)}",
                    log,
                )
        for exe in component.executables:
            paths[exe] = build_dir(component, gomod) / exe
    return paths
