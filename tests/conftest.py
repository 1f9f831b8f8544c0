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
