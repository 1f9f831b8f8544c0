"""Quantiles from coarse buckets (pure) and the profiler against a real Prometheus."""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

from kvtune.e2e.prometheus import PrometheusServer, free_port
from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.e2e.traces import MOONCAKE_TRACE as MOONCAKE
from kvtune.operator.prometheus import histograms
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.operator.prometheus.profiling import (
    ProfilingSettings,
    RawWindow,
    build_profile,
    profile_from_prometheus,
    query_window,
)
from kvtune.operator.prometheus.prom_http import PrometheusUnavailable
from kvtune.replay.exporter import Replay, ReplayServer
from kvtune.replay.instance import InstanceConfig
from kvtune.tuner.traces import load_trace


def _buckets(values: np.ndarray, max_model_len: int = 131072) -> list[tuple[float, float]]:
    bounds = vm.build_1_2_5_buckets(max_model_len)
    return [(b, float((values <= b).sum())) for b in bounds] + [(math.inf, float(len(values)))]


@pytest.mark.parametrize(("buckets", "q", "expected"), [
    # 10 in (0,1], 10 in (1,2]: the median is the first bucket's top.
    ([(1.0, 10.0), (2.0, 20.0), (math.inf, 20.0)], 0.5, 1.0),
    # Everything in one bucket (100, 1000]: rank at the middle -> sqrt(100*1000) log-linearly.
    ([(100.0, 0.0), (1000.0, 10.0), (math.inf, 10.0)], 0.5, 316.227766),
])
def test_log_linear_interpolation(buckets: list[tuple[float, float]], q: float,
                                  expected: float) -> None:
    assert histograms.estimate_quantile(q, buckets).estimate == pytest.approx(expected)


def test_linear_interpolation_matches_prometheus_rules() -> None:
    b = [(100.0, 0.0), (1000.0, 10.0), (math.inf, 12.0)]
    assert histograms.prometheus_histogram_quantile(0.5, b) == pytest.approx(100 + 900 * 0.6)
    # In the +Inf bucket Prometheus answers the highest finite bound.
    assert histograms.prometheus_histogram_quantile(0.99, b) == 1000.0
    est = histograms.estimate_quantile(0.99, b, cap=4096)
    assert est.lower == 1000.0 and est.upper == 4096 and 1000 < est.estimate <= 4096
    assert math.isinf(histograms.estimate_quantile(0.99, b).upper)


def test_empty_histogram_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="empty"):
        histograms.estimate_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)])


def test_brackets_hold_the_true_quantiles_of_real_traces() -> None:
    log_err, lin_err = [], []
    for path in (AZURE, MOONCAKE):
        trace = load_trace(path)
        for field in ("prompt_tokens", "output_tokens"):
            values = np.array([getattr(r, field) for r in trace.requests])
            b = _buckets(values)
            for q in (0.5, 0.9, 0.95, 0.99):
                true = float(np.quantile(values, q))
                est = histograms.estimate_quantile(q, b, cap=131072)
                assert est.lower <= true <= est.upper, (path.name, field, q, true, est)
                log_err.append(abs(math.log(est.estimate / true)))
                lin_err.append(abs(math.log(est.histogram_quantile / true)))
    # On these right-skewed lengths, geometric interpolation is closer than linear.
    assert sum(log_err) < sum(lin_err)


def _raw(requests: float, prompt: np.ndarray, output: np.ndarray) -> RawWindow:
    return RawWindow(
        window_seconds=60.0, at_unix_seconds=0.0, requests=requests,
        prompt_buckets=_buckets(prompt), output_buckets=_buckets(output),
        ttft_buckets=[], tpot_buckets=[], prefix_cache_queries=float(prompt.sum()),
        prefix_cache_hits=float(prompt.sum()) * 0.5, kv_cache_usage_mean=0.5,
        kv_cache_usage_max=0.9, preemptions=0.0, waiting_mean=0.0,
    )


def test_too_few_requests_is_not_trusted_and_says_why() -> None:
    settings = ProfilingSettings(window_seconds=60, min_requests=100)
    few = build_profile(_raw(20, np.array([1000.0] * 20), np.array([100.0] * 20)), settings)
    assert not few.trusted and few.reason == "TooFewRequests" and few.profile is None
    assert "20 requests" in few.message and "min_requests=100" in few.message
    enough = build_profile(_raw(200, np.array([1000.0] * 200), np.array([100.0] * 200)),
                           settings)
    assert enough.trusted and enough.profile is not None
    p = enough.profile
    assert p.source == "prometheus" and p.requests == 200 and p.prefix_hit_rate == 0.5
    # All 200 in the bucket (500, 1000]: the median is its geometric middle.
    assert p.context_tokens.p50 == round(math.sqrt(500 * 1000)) and p.context_tokens.max == 1000
    assert any("histogram_quantile" in n for n in p.notes)


def test_unreachable_prometheus_raises_quickly() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(PrometheusUnavailable, match="cannot connect"):
        query_window(url, ProfilingSettings(window_seconds=30))
    assert time.monotonic() - started < 10


@pytest.mark.prometheus
def test_profile_of_azure_replay_through_real_prometheus(prometheus: PrometheusServer) -> None:
    server = ReplayServer(Replay(InstanceConfig(model_name="azure"), AZURE, speed=40.0), port=0)
    server.start()
    try:
        prometheus.set_targets([server.target])
        # Enough finished requests inside a 20 s window.
        prometheus.wait_for("sum(increase(vllm:request_success_total[20s]))", min_value=300,
                            timeout_seconds=90)
        at = time.time()
        settings = ProfilingSettings(window_seconds=20, min_requests=300,
                                     selector={"model_name": "azure"},
                                     max_model_len_tokens=131072)
        result = profile_from_prometheus(prometheus.url, settings, at_unix_seconds=at)
        assert result.trusted, result.message
        p, obs = result.profile, result.observed
        assert p is not None
        # Azure conversation: p50 ~ 1020 tokens over the whole trace (its start runs lower).
        assert 500 <= p.context_tokens.p50 <= 2000
        assert p.context_tokens.p99 <= 14050
        assert obs.prefix_hit_rate == 0.0  # no prefix information in Azure
        assert obs.num_gpu_blocks == (60000,) and obs.block_size == 16
        assert obs.request_rate_per_second > 5  # the trace played 40x faster
        assert obs.ttft.p95_seconds is not None and obs.tpot.p50_seconds is not None
        # What histogram_quantile would have said is what Prometheus itself says.
        promql = ("histogram_quantile(0.5, sum by (le) "
                  "(increase(vllm:request_prompt_tokens_bucket{model_name=\"azure\"}[20s])))")
        qs = urllib.parse.urlencode({"query": promql, "time": at})
        with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?{qs}") as resp:
            own = float(json.load(resp)["data"]["result"][0]["value"][1])
        assert result.observed.context_quantiles[0].histogram_quantile == pytest.approx(own)
        # A selector that matches nothing: no data, not trusted.
        none = profile_from_prometheus(
            prometheus.url, settings.model_copy(update={"selector": {"model_name": "other"}}))
        assert not none.trusted and none.reason == "NoData"
    finally:
        server.stop()
