"""KV reuse in a profiling window (operator/prometheus/reuse_window.py): vLLM's
``--kv-cache-metrics`` histograms and prompt tokens by source, through a real Prometheus
scraping the replay exporter, and the pure halves on hand-made numbers."""

from __future__ import annotations

import math
import time

import pytest

from kvtune.e2e.prometheus import PrometheusServer
from kvtune.e2e.traces import MOONCAKE_TRACE as MOONCAKE
from kvtune.operator.prometheus import reuse_window
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.operator.prometheus.profiling import ProfilingSettings, profile_from_prometheus
from kvtune.replay.exporter import Replay, ReplayServer
from kvtune.replay.instance import Instance, InstanceConfig
from kvtune.tuner.traces import load_trace


def test_tier_hit_rates_are_shares_of_all_prompt_tokens() -> None:
    rates = reuse_window.tier_hit_rates(
        {"local_compute": 600.0, "local_cache_hit": 300.0, "external_kv_transfer": 100.0},
        {"device": 300.0, "host": 100.0})
    assert rates is not None
    assert (rates.prompt_tokens, rates.device, rates.host, rates.disk) == (1000, 0.3, 0.1, 0.0)
    assert reuse_window.tier_hit_rates({}, {"device": 5.0}) is None


def test_residency_quantiles_stop_at_the_last_finite_bound() -> None:
    # 10 gaps in (1, 2], 90 in (2, 5]; none longer.
    b = [(1.0, 0.0), (2.0, 10.0), (5.0, 100.0), (1800.0, 100.0), (math.inf, 100.0)]
    q = reuse_window.seconds_quantiles(b)
    assert q is not None and q.count == 100
    assert 2.0 < q.p50 < 5.0 and q.p99 <= 5.0 and q.max == 5.0
    # All beyond 1800 s: known only to be at least that long.
    late = reuse_window.seconds_quantiles([(1800.0, 0.0), (math.inf, 4.0)])
    assert late is not None and late.p50 == late.max == 1800.0
    assert reuse_window.seconds_quantiles([(1.0, 0.0), (math.inf, 0.0)]) is None


def test_the_replay_instance_records_residency_as_vllm_does() -> None:
    """Each evicted block: its lifetime, idle time, and the gaps between its hits."""
    trace = load_trace(MOONCAKE)
    # Mooncake at 20x: a 640k-token cache evicts, and some blocks are hit twice before.
    inst = Instance(InstanceConfig(num_gpu_blocks=40_000))
    arrivals = [(r.arrival_seconds / 20.0, r) for r in trace.requests[:3000]]
    inst.advance_to(arrivals[-1][0] + 5.0, arrivals)
    h = inst.metrics.histograms
    evicted = h[vm.KV_BLOCK_IDLE_BEFORE_EVICT].n
    assert evicted > 0 and h[vm.KV_BLOCK_LIFETIME].n == evicted
    assert h[vm.KV_BLOCK_REUSE_GAP].n > 0
    # Idle time is never longer than the lifetime.
    assert h[vm.KV_BLOCK_IDLE_BEFORE_EVICT].total <= h[vm.KV_BLOCK_LIFETIME].total + 1e-9
    by = inst.metrics.by_source
    assert by[vm.PROMPT_TOKENS_CACHED_BY_SOURCE]["device"] == \
        by[vm.PROMPT_TOKENS_BY_SOURCE]["local_cache_hit"] == \
        inst.metrics.counters[vm.PREFIX_CACHE_HITS] > 0


@pytest.mark.prometheus
def test_reuse_figures_of_a_mooncake_replay_through_real_prometheus(
        prometheus: PrometheusServer) -> None:
    # A GPU cache small enough that blocks are evicted within the window (as above).
    config = InstanceConfig(model_name="moon", num_gpu_blocks=40_000)
    server = ReplayServer(Replay(config, MOONCAKE, speed=20.0), port=0)
    server.start()
    try:
        prometheus.set_targets([server.target])
        prometheus.wait_for(
            "sum(increase(vllm:kv_block_reuse_gap_seconds_count[30s]))", min_value=50,
            timeout_seconds=120)
        prometheus.wait_for("sum(increase(vllm:request_success_total[30s]))", min_value=50,
                            timeout_seconds=60)
        settings = ProfilingSettings(window_seconds=30, min_requests=50,
                                     selector={"model_name": "moon"})
        result = profile_from_prometheus(prometheus.url, settings, at_unix_seconds=time.time())
        assert result.trusted, result.message
        p, rates = result.profile, result.observed.tier_hit_rates
        assert p is not None and rates is not None
        gap, idle = p.prefix_reuse_gap_seconds, p.kv_block_idle_before_evict_seconds
        assert gap is not None and idle is not None and gap.count >= 50
        assert 0 < gap.p50 <= gap.p99 <= 1800 and idle.p50 > 0
        # Gaps are those the GPU caught: no distance is made of them (reuse_window's doc).
        assert p.prefix_reuse_distance_tokens is None
        assert any("only reuses the GPU cache caught" in n for n in p.notes)
        # Every hit is the GPU's; the share agrees with the prefix cache's own counters.
        assert rates.host == rates.disk == 0.0 and 0 < rates.device < 1
        assert result.observed.prefix_hit_rate == pytest.approx(rates.device, abs=0.02)
    finally:
        server.stop()
