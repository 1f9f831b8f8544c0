"""The simulator on the real traces in examples/traces: the figures docs/simulator.md quotes hold on
slices small enough for a unit test (the full runs are bench/simulate_figures.py)."""

from __future__ import annotations

from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.e2e.traces import MOONCAKE_TRACE as MOONCAKE
from kvtune.tuner.simulator.prefix import block_hashes
from kvtune.tuner.simulator.scheduler import EngineConfig, simulate
from kvtune.tuner.simulator.timing import Efficiency, StepCostModel
from kvtune.tuner.simulator.workload import ideal_prefix_hit_rate, requests_from_trace
from kvtune.tuner.traces import load_trace

# Llama-3.1-8B on one H100 with BF16 KV, as bench/simulate_figures.py (plain numbers).
LLAMA8B_H100 = StepCostModel(
    weights_bytes=16_060_522_496, kv_bytes_per_token=131_072, hbm_bytes_per_second=3.35e12,
    matrix_flops_per_second=989.4e12, flops_per_token=2 * 8.03e9,
    attention_flops_per_token_pair=4 * 32 * 32 * 128, efficiency=Efficiency(0.8, 0.55, 0.004),
)


def test_azure_paged_admits_2_to_4x_contiguous_at_equal_memory() -> None:
    # Memory-bound regime: 64K KV tokens, the first 4000 requests replayed 4x faster, so a
    # queue always waits; contiguous reserves max-model-len 4096 per request.
    reqs = requests_from_trace(load_trace(AZURE), speed=4.0, limit=4000)
    results = {}
    for allocation in ("paged", "contiguous"):
        cfg = EngineConfig(num_gpu_blocks=4097, block_size=16, max_num_seqs=1024,
                           max_num_batched_tokens=8192, max_model_len=4096,
                           enable_prefix_caching=False, allocation=allocation)  # type: ignore[arg-type]
        results[allocation] = simulate(reqs, cfg, LLAMA8B_H100)
    paged, contiguous = results["paged"], results["contiguous"]
    assert contiguous.peak_running == 16  # 65,536 // 4,096 reservations
    ratio = paged.mean_running / contiguous.mean_running
    assert 2.0 <= ratio <= 4.0, ratio
    assert contiguous.fragmentation_fraction > 0.5 > paged.fragmentation_fraction
    assert paged.summary()["throughput_requests_per_second"] > (
        contiguous.summary()["throughput_requests_per_second"])


def test_mooncake_unbounded_cache_reaches_the_ideal_hit_rate() -> None:
    reqs = requests_from_trace(load_trace(MOONCAKE), speed=0.25, limit=600)
    # Leave out prompts longer than max-model-len: the simulator rejects them unqueried.
    reqs = [r for r in reqs if r.prompt_tokens < 131072]
    ideal = ideal_prefix_hit_rate(reqs, 64)
    assert ideal > 0.1
    cfg = EngineConfig(num_gpu_blocks=20_000_000 // 64 + 1, block_size=64, max_num_seqs=256,
                       max_num_batched_tokens=8192, max_model_len=131072)
    got = simulate(reqs, cfg, LLAMA8B_H100).summary()["prefix_hit_rate"]
    # Concurrent requests can miss a prefix that is still being computed; never more.
    assert ideal - 0.01 <= got <= ideal + 1e-9


def test_mooncake_prefix_caching_hits_and_cuts_ttft() -> None:
    reqs = requests_from_trace(load_trace(MOONCAKE), speed=0.25, limit=1200)
    summaries = {}
    for caching in (True, False):
        cfg = EngineConfig(num_gpu_blocks=4_000_000 // 16 + 1, block_size=16, max_num_seqs=256,
                           max_num_batched_tokens=8192, max_model_len=131072,
                           enable_prefix_caching=caching)
        summaries[caching] = simulate(reqs, cfg, LLAMA8B_H100).summary()
    on, off = summaries[True], summaries[False]
    assert off["prefix_hit_rate"] == 0.0
    assert 0.05 < on["prefix_hit_rate"] <= ideal_prefix_hit_rate(reqs, 16)
    assert on["ttft_p50_seconds"] < off["ttft_p50_seconds"]
    assert on["ttft_p95_seconds"] < off["ttft_p95_seconds"]


def test_mooncake_sub_blocks_share_exactly_like_their_512_token_block() -> None:
    reqs = requests_from_trace(load_trace(MOONCAKE), limit=200)
    # Two requests with the same first hash id share its 32 sub-blocks of 16 tokens.
    by_first: dict[int, list[int]] = {}
    for i, r in enumerate(reqs):
        by_first.setdefault(r.segments[0][0], []).append(i)
    pair = next(v for v in by_first.values() if len(v) >= 2)
    a, b = (reqs[i] for i in pair[:2])
    ha = block_hashes(a.segments, a.shareable_tokens, 16)
    hb = block_hashes(b.segments, b.shareable_tokens, 16)
    assert len(ha) >= 32 and len(hb) >= 32
    assert ha[:32] == hb[:32]
    # At block size 48 (not a divisor of 512) the sub-block at 480..528 spans two ids.
    ha48 = block_hashes(a.segments, a.prompt_tokens, 48)
    assert len(set(ha48)) == len(ha48)
