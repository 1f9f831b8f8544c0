"""Observed SLO attainment beside the goodput search's prediction (operator/retune/slo_observed.py,
retune_handlers.observed_slo): pure checks of the reading and the noise rule, then two
replayed pools through a real Prometheus, one healthy and one starved of KV blocks."""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC

from kvtune.e2e.prometheus import PrometheusServer
from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.operator.api import (
    ExpectedStatus,
    InferenceDeploymentSpec,
    InferenceDeploymentStatus,
    PoolStatus,
    PrometheusSpec,
)
from kvtune.operator.prometheus import selectors
from kvtune.operator.prometheus.profiling import ProfilingSettings, profile_from_prometheus
from kvtune.operator.retune import slo_observed
from kvtune.operator.retune.retune_handlers import observed_slo
from kvtune.operator.rollout import canary_metrics
from kvtune.replay.exporter import Replay, ReplayServer
from kvtune.replay.instance import InstanceConfig

NS, NAME = "slo-observed", "obs"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# 40 s, not 20: the starved instance finishes ~7 requests/s, so 150 of them in a 20 s
# window took ~110 s of waiting (a 40 s window holds them after ~25 s); the stable one
# keeps up either way.
WINDOW_SECONDS = 40
INF = math.inf


def test_share_within_reads_the_cumulative_count_at_a_bound() -> None:
    b = [(0.5, 30.0), (1.0, 80.0), (2.5, 95.0), (INF, 100.0)]
    assert slo_observed.share_within(b, 1.0) == 0.8
    assert slo_observed.share_within(b, 0.1) == 0.0
    assert slo_observed.share_within([], 1.0) is None
    assert slo_observed.share_within([(1.0, 0.0), (INF, 0.0)], 1.0) is None
    assert slo_observed.bound_above(0.9, (0.5, 1.0, 2.5)) == 1.0
    assert slo_observed.bound_above(1.0, (0.5, 1.0, 2.5)) == 1.0
    assert slo_observed.bound_above(9.0, (0.5, 1.0, 2.5)) == INF


def test_a_target_between_buckets_is_shown_stricter_and_judged_laxer() -> None:
    # TPOT target 60 ms: vLLM's buckets hold 50 and 75 ms. Shown at 50 ms (as the canary
    # analysis and the alerts read it); judged at 75 ms, so a request between the two is
    # never counted against the prediction.
    tpot = [(0.05, 50.0), (0.075, 100.0), (INF, 100.0)]
    ttft = [(1.0, 100.0), (INF, 100.0)]
    o = slo_observed.observe(ttft, tpot, 100, 20, ttft_slo_seconds=1.0, tpot_slo_seconds=0.06)
    assert o.tpot_bound_seconds == 0.05 and o.tpot_within_slo == 0.5
    assert o.ttft_within_slo == 1.0 and o.attainment_upper_bound == 1.0
    assert slo_observed.judge(o, 0.97, 800, 50).verdict == slo_observed.AS_PREDICTED


def test_the_verdict_needs_a_sample_and_a_gap_beyond_noise() -> None:
    def seen(share: float, n: int) -> slo_observed.Observation:
        ttft = [(1.0, share * n), (INF, float(n))]
        tpot = [(0.1, float(n)), (INF, float(n))]
        return slo_observed.observe(ttft, tpot, n, 20, 1.0, 0.1)

    assert slo_observed.judge(seen(0.5, 50), 0.99, 800, 100).verdict == \
        slo_observed.INSUFFICIENT_SAMPLE
    assert slo_observed.judge(seen(0.5, 500), None, 800, 100).verdict == \
        slo_observed.NO_PREDICTION
    # 93% seen on 200 requests against 97% predicted on 800: inside the noise margin
    # (one-sided 99 %: ~4.4 points).
    near = slo_observed.judge(seen(0.93, 200), 0.97, 800, 100)
    assert near.verdict == slo_observed.AS_PREDICTED and "noise margin" in near.message
    # The same gap on 5,000 requests is beyond it.
    far = slo_observed.judge(seen(0.93, 5000), 0.97, 800, 100)
    assert far.below and "93.0%" in far.message and "97.0%" in far.message
    # Above the prediction is never "below".
    assert not slo_observed.judge(seen(1.0, 5000), 0.9, 800, 100).below


def _exporter(config: InstanceConfig, seed: int) -> ReplayServer:
    # ~27 Azure conversations a second: a healthy instance keeps up (as in the canary test).
    server = ReplayServer(Replay(config, AZURE, speed=5.0, shuffle_seed=seed), port=0)
    server.start()
    return server


def _labels(pool: str) -> dict[str, str]:
    return {"namespace": NS, "pod": f"{NAME}-{pool}-6f7d9c8b5-x2x7q",
            "kvtune_io_deployment": NAME, "kvtune_io_pool": pool}


def _promql(url: str, promql: str, at: float) -> float:
    qs = urllib.parse.urlencode({"query": promql, "time": at})
    with urllib.request.urlopen(f"{url}/api/v1/query?{qs}") as resp:
        return float(json.load(resp)["data"]["result"][0]["value"][1])


@pytest.mark.prometheus
def test_a_starved_pool_is_observed_below_its_prediction_and_a_healthy_one_is_not(
    prometheus: PrometheusServer,
) -> None:
    healthy = _exporter(InstanceConfig(model_name=MODEL), seed=1)
    starved = _exporter(InstanceConfig(model_name=MODEL, num_gpu_blocks=400,
                                       max_model_len=4096), seed=2)
    try:
        prometheus.set_target_groups([([healthy.target], _labels("h200")),
                                      ([starved.target], _labels("h100"))])
        for pool in ("h200", "h100"):
            prometheus.wait_for(
                f'sum(increase(vllm:request_success_total{{pod=~"{NAME}-{pool}-.*"}}'
                f'[{WINDOW_SECONDS}s]))', min_value=150, timeout_seconds=120)
        at = time.time()
        prom = PrometheusSpec(url=prometheus.url, pool_selector="labels")
        body: dict[str, Any] = {**SAMPLE_SPEC, "slo": {"ttftP95": "1s", "tpotP95": "100ms"}}
        spec = InferenceDeploymentSpec.model_validate(body)
        own = {}
        series_of = {}
        for pool in ("h200", "h100"):
            series = selectors.pool_selector(prom, namespace=NS, deployment=NAME, pool=pool)
            assert series is not None
            series_of[pool] = series
            own[pool] = profile_from_prometheus(prometheus.url, ProfilingSettings.for_series(
                series, window_seconds=WINDOW_SECONDS, min_requests=100,
                max_model_len_tokens=131072), at_unix_seconds=at)

        def pool(name: str, gpu: str) -> PoolStatus:
            return PoolStatus(name=name, gpu_class=gpu, tensor_parallel=1, replicas=1,
                              phase="Applied", expected=ExpectedStatus(
                                  kv_cache_tokens=1, kv_cache_bytes=1, num_gpu_blocks=1,
                                  kv_bytes_per_token=1, concurrent_sequences=1,
                                  concurrent_sequences_context_tokens=1,
                                  slo_attainment=0.99))

        previous = InferenceDeploymentStatus(pools=[pool("h200", "H200"), pool("h100", "H100")])
        seen, condition = observed_slo(spec, previous, own, own["h200"], min_requests=100)
        good, bad = seen["h200"], seen["h100"]
        assert good.scope == "pool" and good.predicted_attainment == 0.99
        assert good.verdict == slo_observed.AS_PREDICTED, good.message
        assert bad.verdict == slo_observed.BELOW_PREDICTION, bad.message
        assert bad.ttft_within_slo is not None and bad.ttft_within_slo < 0.9
        assert condition is not None and condition[:2] == ("True", slo_observed.BELOW_PREDICTION)
        assert "pool h100" in condition[2] and "pool h200" not in condition[2]
        # The share shown is the one the canary analysis's own PromQL (one copy of it) gets
        # from Prometheus for the same window.
        for name, figures in seen.items():
            qs = canary_metrics.revision_queries(
                series_of[name], WINDOW_SECONDS,
                ttft_bound_seconds=canary_metrics.ttft_bound(1.0),
                tpot_bound_seconds=canary_metrics.tpot_bound(0.1))
            assert figures.ttft_within_slo == pytest.approx(
                _promql(prometheus.url, qs["ttft_within_slo"], at), abs=1e-6)
            assert figures.tpot_within_slo == pytest.approx(
                _promql(prometheus.url, qs["tpot_within_slo"], at), abs=1e-6)
        # Without a prediction (a pool planned by the rules) nothing is judged.
        unplanned = InferenceDeploymentStatus(pools=[
            p.model_copy(update={"expected": None}) for p in previous.pools])
        seen, condition = observed_slo(spec, unplanned, own, own["h200"], min_requests=100)
        assert {s.verdict for s in seen.values()} == {slo_observed.NO_PREDICTION}
        assert condition is None
    finally:
        healthy.stop()
        starved.stop()


def test_a_target_the_pods_render_as_a_bound_is_read_exactly() -> None:
    # Pods with kvtune's SLO buckets (2 s TTFT among vLLM's 1.0 and 2.5): 90 % of requests
    # took 1-2 s, within the target. Read at the 2 s bound: all within; shown and judged alike.
    ttft = [(1.0, 10.0), (2.0, 100.0), (2.5, 100.0), (INF, 100.0)]
    tpot = [(0.075, 100.0), (0.08, 100.0), (0.1, 100.0), (INF, 100.0)]
    o = slo_observed.observe(ttft, tpot, 100, 20, ttft_slo_seconds=2.0, tpot_slo_seconds=0.08)
    assert o.ttft_bound_seconds == 2.0 and o.ttft_within_slo == 1.0
    assert o.tpot_bound_seconds == 0.08 and o.attainment_upper_bound == 1.0
    message = slo_observed.judge(o, 0.97, 800, 50).message
    assert "at the 2 s bucket" in message and "lower" not in message


def test_without_the_rendered_bound_the_message_says_it_judges_lower() -> None:
    # vLLM's default buckets only: the 2 s target is shown at the 1.0 bound, said so.
    ttft = [(1.0, 10.0), (2.5, 100.0), (INF, 100.0)]
    tpot = [(0.1, 100.0), (INF, 100.0)]
    o = slo_observed.observe(ttft, tpot, 100, 20, ttft_slo_seconds=2.0, tpot_slo_seconds=0.1)
    assert o.ttft_bound_seconds == 1.0 and o.ttft_within_slo == pytest.approx(0.1)
    message = slo_observed.judge(o, 0.97, 800, 50).message
    assert "judged at the lower 1 s bucket bound, not the 2 s target" in message
