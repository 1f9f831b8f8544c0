"""Canaries judged on what users feel, on the real control plane and a real Prometheus.

`kvtune operator` runs a pool of 3 replicas with a 1-replica canary and routing on. Two replay
exporters stand in for the pool's vLLM pods in Prometheus (kwok pods run no container): one
scraped as a stable pod, one as a canary pod, with the target labels Kubernetes service
discovery gives them. A canary whose KV cache is far too small queues and misses the TTFT SLO:
the operator rolls it back, with both revisions' figures in status and the Event. A canary as
good as the stable revision is promoted, and the endpoint picker's block size moves with the
Deployment's in the same rollout."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from op_cluster_helpers import (
    OperatorProcess,
    condition,
    create_infd,
    ensure_namespace,
    get_infd,
    install_crd,
    patch_spec,
    wait_for,
)
from op_samples import SAMPLE_SPEC

from kvtune.e2e.inference_extension import crd_paths
from kvtune.e2e.prometheus import PrometheusServer
from kvtune.e2e.traces import AZURE_TRACE
from kvtune.operator.routing import inference_pool as routing
from kvtune.replay.exporter import Replay, ReplayServer
from kvtune.replay.instance import InstanceConfig

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

NS, NAME = "op-canary-slo", "slo"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SPEED = 5.0  # ~27 requests/s of Azure conversations: a healthy instance keeps up


def _exporter(config: InstanceConfig, seed: int) -> ReplayServer:
    server = ReplayServer(Replay(config, AZURE_TRACE, speed=SPEED, shuffle_seed=seed), port=0)
    server.start()
    return server


def _pod(track: str) -> dict[str, str]:
    name = f"{NAME}-h100-canary-58c9d-k8p2z" if track == "canary" else \
        f"{NAME}-h100-6f7d9c8b5-x2x7q"
    return {"namespace": NS, "pod": name}


@pytest.fixture
def operator(local_cluster: Any, tmp_path: Path) -> Iterator[OperatorProcess]:
    api = local_cluster.api_client()
    install_crd(api)
    for path in crd_paths():
        install_crd(api, path)
    ensure_namespace(api, NS)
    proc = OperatorProcess(Path(local_cluster.kubeconfig_path), [NS], tmp_path / "op.log",
                           env={routing.ROUTING_ENV: "true"})
    proc.start()
    yield proc
    proc.stop()


def _spec(prometheus_url: str) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["model"] = {"name": MODEL}
    spec["pools"] = [{"gpuClass": "H100", "replicas": 3}]
    spec["slo"] = {"ttftP95": "2s", "tpotP95": "100ms"}
    spec["rollout"] = {"canaryReplicas": 1, "analysis": "15s", "progressDeadline": "90s",
                       "minRequests": 100}
    # A long minimum interval: the retune timer stays out of this test's plan changes.
    spec["tuning"] = {"mode": "auto", "pin": {"blockSize": 32},
                      "prometheus": {"url": prometheus_url, "window": "20s"},
                      "retune": {"minInterval": "1h", "driftThreshold": 1.0}}
    spec["routing"] = {"enabled": True}
    return spec


def _epp_block_size(api: Any) -> int:
    cm = client.CoreV1Api(api).read_namespaced_config_map(f"{NAME}-h100-epp", NS)
    config = yaml.safe_load(cm.data[routing.EPP_CONFIG_KEY])
    producer = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")
    return int(producer["parameters"]["blockSizeTokens"])


def _pool_label(api: Any) -> str:
    pool = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "inference.networking.k8s.io", "v1", NS, "inferencepools", f"{NAME}-h100")
    return str(pool["metadata"]["labels"][routing.LABEL_BLOCK_SIZE])


def _args(api: Any, name: str) -> list[str]:
    dep = client.AppsV1Api(api).read_namespaced_deployment(name, NS)
    return list(dep.spec.template.spec.containers[0].args)


def _events(api: Any, reason: str) -> list[str]:
    return [e.message for e in client.CoreV1Api(api).list_namespaced_event(NS).items
            if e.reason == reason]


def test_a_worse_canary_is_rolled_back_and_a_good_one_promoted_on_slo_attainment(
    local_cluster: Any, operator: OperatorProcess, prometheus: PrometheusServer,
) -> None:
    api = local_cluster.api_client()
    create_infd(api, NS, NAME, _spec(prometheus.url))

    def ready() -> dict[str, Any] | None:
        obj = get_infd(api, NS, NAME)
        cond = condition(obj, "Ready")
        return obj if cond is not None and cond["status"] == "True" else None

    wait_for(ready, "Ready", 90, operator.log)
    assert _epp_block_size(api) == 32 and _pool_label(api) == "32"

    stable = _exporter(InstanceConfig(model_name=MODEL), seed=1)
    starved = _exporter(InstanceConfig(model_name=MODEL, num_gpu_blocks=400,
                                       max_model_len=4096), seed=2)
    good: ReplayServer | None = None
    try:
        prometheus.set_target_groups([([stable.target], _pod("stable")),
                                      ([starved.target], _pod("canary"))])
        # A new plan: its canary is worse for users and must be rolled back.
        patch_spec(api, NS, NAME, {"tuning": {"pin": {"blockSize": 64}}})

        def degraded() -> dict[str, Any] | None:
            cond = condition(get_infd(api, NS, NAME), "Degraded")
            return cond if cond is not None and cond["status"] == "True" else None

        cond = wait_for(degraded, "Degraded=True/CanaryFailed", 240, operator.log)
        assert cond["reason"] == "CanaryFailed", cond
        assert "worse for users" in cond["message"], cond
        # The evidence: both revisions' figures, in status and in the Event.
        assert "canary:" in cond["message"] and "stable:" in cond["message"]
        # kopf posts the reconcile's Events after the status write: wait for it.
        (rolled_back,) = wait_for(lambda: _events(api, "CanaryRolledBack"),
                                  "the CanaryRolledBack Event", 30, operator.log)
        assert "TTFT within SLO" in rolled_back and "stable:" in rolled_back
        assert "--block-size=32" in _args(api, f"{NAME}-h100")
        assert _epp_block_size(api) == 32  # the router never saw the rejected plan

        # A canary as good as the stable pods: promoted; the router's block size moves with it.
        starved.stop()
        good = _exporter(InstanceConfig(model_name=MODEL), seed=3)
        prometheus.set_target_groups([
            ([stable.target], _pod("stable")),
            ([good.target], {"namespace": NS, "pod": f"{NAME}-h100-canary-7b9f4-abcde"})])
        patch_spec(api, NS, NAME, {"tuning": {"pin": {"blockSize": 16}}})

        def promoted() -> bool:
            return bool(_events(api, "CanaryPromoted")) and ready() is not None \
                and "--block-size=16" in _args(api, f"{NAME}-h100")

        wait_for(promoted, "the canary promoted", 240, operator.log)
        (promotion,) = _events(api, "CanaryPromoted")
        assert "not worse for users" in promotion and "stable:" in promotion
        assert _epp_block_size(api) == 16 and _pool_label(api) == "16"
    finally:
        stable.stop()
        starved.stop()
        if good is not None:
            good.stop()
