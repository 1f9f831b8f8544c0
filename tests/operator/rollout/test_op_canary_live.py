"""A canary judged on live metrics through a real Prometheus: two replay exporters play the same
Azure conversations as the stable pod and the canary pod of one pool (target labels as
Kubernetes service discovery gives them). A canary whose KV cache is far too small queues and
misses the TTFT SLO: rolled back, with both revisions' figures as evidence. A canary with the
stable revision's configuration: promoted."""

from __future__ import annotations

import pytest

from kvtune.e2e.prometheus import PrometheusServer
from kvtune.e2e.traces import AZURE_TRACE
from kvtune.operator.api import PrometheusSpec
from kvtune.operator.prometheus import prom_replies as replies
from kvtune.operator.prometheus import selectors
from kvtune.operator.rollout import canary_metrics
from kvtune.operator.rollout.canary_analysis import AnalysisSettings, CanaryAnalysis, analyse
from kvtune.replay.exporter import Replay, ReplayServer
from kvtune.replay.instance import InstanceConfig

AZURE = AZURE_TRACE
MODEL, NS, NAME, POOL = "llama", "llm", "bot", "h200"
# 40 s, not 20: the starved instance finishes ~7 requests/s, so 150 of them in a 20 s
# window took ~110 s of waiting (a 40 s window holds them after ~25 s); the stable one
# keeps up either way.
WINDOW_SECONDS = 40
SPEED = 5.0  # ~27 requests/s: a healthy instance keeps up, a starved one queues


def _judge(prometheus: PrometheusServer, canary_config: InstanceConfig,
           rendered: bool = False) -> CanaryAnalysis:
    stable = ReplayServer(Replay(InstanceConfig(model_name=MODEL), AZURE, speed=SPEED,
                                 shuffle_seed=1), port=0)
    canary = ReplayServer(Replay(canary_config, AZURE, speed=SPEED, shuffle_seed=2), port=0)
    stable.start()
    canary.start()
    try:
        prometheus.set_target_groups([
            ([stable.target], {"namespace": NS, "pod": f"{NAME}-{POOL}-6f7d9c8b5-x2x7q"}),
            ([canary.target], {"namespace": NS, "pod": f"{NAME}-{POOL}-canary-58c9d-k8p2z"}),
        ])
        prom = PrometheusSpec(url=prometheus.url)
        pair = selectors.track_selectors(prom, namespace=NS, deployment=NAME, pool=POOL)
        assert pair is not None
        for series in pair:
            prometheus.wait_for(
                f"sum(increase(vllm:request_success_total{series.promql()}"
                f"[{WINDOW_SECONDS}s]))", min_value=150, timeout_seconds=120)
        settings = AnalysisSettings(min_requests=100,
                                    ttft_bound_seconds=canary_metrics.ttft_bound(2.0, rendered),
                                    tpot_bound_seconds=canary_metrics.tpot_bound(0.1, rendered),
                                    ttft_slo_seconds=2.0, tpot_slo_seconds=0.1)
        def query(name: str, promql: str) -> float | None:
            data = {"resultType": "vector", "result": prometheus.query(promql)}
            return replies.scalar(replies.vector(data, name), name)

        stable_fig, canary_fig, settings = canary_metrics.read_judgeable(
            query, pair[0], pair[1], WINDOW_SECONDS, settings)
        return analyse(stable_fig, canary_fig, settings)
    finally:
        stable.stop()
        canary.stop()


@pytest.mark.prometheus
def test_a_starved_canary_is_rolled_back_with_both_revisions_figures(
    prometheus: PrometheusServer,
) -> None:
    starved = InstanceConfig(model_name=MODEL, num_gpu_blocks=400, max_model_len=4096)
    verdict = _judge(prometheus, starved)
    assert verdict.verdict == "rollback", verdict
    assert verdict.reason in ("TTFTAttainmentWorse", "PreemptionsRising", "QueueGrowing")
    assert verdict.stable.requests >= 100 and verdict.canary.requests >= 100
    assert verdict.canary.ttft_within_slo is not None
    assert verdict.stable.ttft_within_slo is not None
    assert verdict.canary.ttft_within_slo < verdict.stable.ttft_within_slo


@pytest.mark.prometheus
def test_a_canary_as_good_as_stable_is_promoted(prometheus: PrometheusServer) -> None:
    verdict = _judge(prometheus, InstanceConfig(model_name=MODEL))
    assert verdict.verdict == "promote", verdict
    assert verdict.reason == "CanaryMeetsSLO"


@pytest.mark.prometheus
def test_pods_without_the_slo_bucket_are_judged_at_the_default_bound_below_it(
    prometheus: PrometheusServer,
) -> None:
    """Pods expected to render the SLO buckets that do not (rendered before kvtune added them,
    as the replay exporters here, with vLLM's default bounds): no le="2" series, so both
    revisions are read at the 1 s bound below the 2 s target, said so, never left unjudged."""
    starved = InstanceConfig(model_name=MODEL, num_gpu_blocks=400, max_model_len=4096)
    verdict = _judge(prometheus, starved, rendered=True)
    assert verdict.stable.ttft_within_slo is not None, verdict
    assert verdict.canary.ttft_within_slo is not None, verdict
    assert verdict.verdict == "rollback", verdict
    assert "TTFT within SLO (judged at the lower 1 s bucket bound" in verdict.message, verdict
