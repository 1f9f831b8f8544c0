"""Fixtures shared by every test area. Add yours with a small, separate block."""

from __future__ import annotations

from collections.abc import Iterator
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
        yield cluster


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
