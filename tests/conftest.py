"""Fixtures shared by every test area. Add yours with a small, separate block."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvtune.e2e.cluster import LocalCluster
    from kvtune.e2e.prometheus import PrometheusServer


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real control plane on loopback (etcd, kube-apiserver, kube-controller-manager,
    kube-scheduler, kwok) with the default fake GPU pools: 4 x H100, 4 x H200, 2 x B200 nodes of
    8 GPUs each. ``.kubeconfig_path`` is the admin kubeconfig, ``.api_client()`` makes a new
    ``kubernetes.client.ApiClient``. Builds the binaries first if they are not cached (a cold
    build takes many minutes). Every process is stopped at the end of the session, also when
    tests fail. Logs: ``<state_dir>/logs/<component>.log``."""
    from kvtune.e2e.cluster import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("local-cluster"))
    with cluster:
        _CLUSTERS.append(cluster)
        try:
            yield cluster
        finally:
            _CLUSTERS.remove(cluster)


# --- one module's cluster objects do not outlive it ----------------------------------------
# The session's control plane has 80 fake GPUs. Each module's InferenceDeployments hold some
# of them until deleted, so without this a module late in a long run (the images', or any
# module on a busy xdist worker) found every GPU taken and waited for pods that could never
# be scheduled. Namespaces the module created are deleted at its end (their Deployments and
# pods with them), and pods and Deployments left in `default`.
_CLUSTERS: list[LocalCluster] = []
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


@pytest.fixture(autouse=True, scope="module")
def module_namespaces_deleted() -> Iterator[None]:
    before = _namespace_names(_CLUSTERS[0]) if _CLUSTERS else set(SYSTEM_NAMESPACES)
    yield
    if _CLUSTERS:
        _delete_namespaces_since(_CLUSTERS[0], before | SYSTEM_NAMESPACES)


def _namespace_names(cluster: LocalCluster) -> set[str]:
    from kubernetes import client

    with cluster.api_client() as api:
        return {ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items}


def _delete_namespaces_since(cluster: LocalCluster, keep: set[str],
                             timeout_seconds: float = 90.0) -> None:
    """Delete the namespaces not in ``keep`` and wait (bounded) until they are gone, so a
    later module that reuses a name does not meet a Terminating namespace."""
    import time

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    def gone_already(delete: Callable[..., object], *args: object, **kwargs: object) -> None:
        # A Deployment's pods (or a namespace) may go on their own between list and delete.
        try:
            delete(*args, **kwargs)
        except ApiException as exc:
            if exc.status != 404:
                raise

    with cluster.api_client() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        for dep in apps.list_namespaced_deployment("default").items:
            gone_already(apps.delete_namespaced_deployment, dep.metadata.name, "default")
        for pod in core.list_namespaced_pod("default").items:
            gone_already(core.delete_namespaced_pod, pod.metadata.name, "default",
                         grace_period_seconds=0)
        doomed = _namespace_names(cluster) - keep
        for name in doomed:
            gone_already(core.delete_namespace, name)
        deadline = time.monotonic() + timeout_seconds
        while doomed and time.monotonic() < deadline:
            time.sleep(0.5)
            doomed &= _namespace_names(cluster)
        if doomed:
            # Not a failure of the module that ran: the next module that needs one of these
            # names fails on its own with the namespace's state in its error.
            print(f"\nnamespaces still terminating after {timeout_seconds:.0f}s: "
                  f"{sorted(doomed)}")


# --- Prometheus (issue 5): a real server per test, stopped even when the test fails ---------
@pytest.fixture
def prometheus() -> Iterator[PrometheusServer]:
    """A real Prometheus on a free 127.0.0.1 port scraping every 1 s; no targets yet:
    ``prometheus.set_targets(["127.0.0.1:PORT"])`` adds them (re-read within ~1 s)."""
    from kvtune.e2e.prometheus import running_prometheus

    with running_prometheus() as server:
        yield server


# --- the template sandbox's per-namespace budget (operator/render/render_fairness.py)
# --------------
@pytest.fixture(autouse=True)
def fresh_template_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no namespace's render CPU charged: in-process renders of earlier
    tests (same namespace names, within a minute) must not defer this test's renders. The
    budget itself is tested in tests/operator/test_op_render_fairness.py."""
    import sys

    sandbox = sys.modules.get("kvtune.operator.render.template_sandbox")
    if sandbox is not None:
        from kvtune.operator.render.render_fairness import TenantBudget

        monkeypatch.setattr(sandbox, "BUDGET", TenantBudget())


# What starts real processes (a control plane, Prometheus, vLLM's engine, an image build) is
# slow by what it needs, marked here once rather than by each file's memory: `-m "not slow"`
# is the fast loop (docs/testing.md).
SLOW_BY_NEED = ("cluster", "prometheus", "vllm", "image")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_BY_NEED):
            item.add_marker(pytest.mark.slow)
    items[:] = slowest_files_first(items)


# --- the slowest files first ---------------------------------------------------------------
# `make test` hands whole files to two workers (xdist's loadfile, --no-loadscope-reorder, which
# keeps this order). Longest first, a worker that finishes early takes the short files left,
# and both end together; in alphabetical order the last long file ran alone at the end.
# tests/file_seconds.json is measured (scripts/file_seconds.py); a file not in it counts as
# the median file.
FILE_SECONDS = Path(__file__).resolve().parent / "file_seconds.json"


def slowest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    measured: dict[str, float] = json.loads(FILE_SECONDS.read_text()) \
        if FILE_SECONDS.is_file() else {}
    typical = statistics.median(measured.values()) if measured else 0.0
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_file_of(item), index)
    # Stable: within a file, and between files of equal weight, collection order is kept.
    return sorted(items, key=lambda item: (-measured.get(_file_of(item), typical),
                                           first_seen[_file_of(item)]))


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]
