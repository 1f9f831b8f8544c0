"""Segments, block hashes, synthetic traffic and the step cost model."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from simhelpers import fixed_step_cost

from kvtune.tuner.simulator.prefix import SegmentInterner, block_hashes, shareable_prefix_tokens
from kvtune.tuner.simulator.scheduler import EngineConfig, simulate
from kvtune.tuner.simulator.timing import Efficiency, StepCostModel, efficiency_for
from kvtune.tuner.simulator.workload import (
    LengthDistribution,
    SyntheticProfile,
    ideal_prefix_hit_rate,
    requests_from_trace,
    synthetic_requests,
)
from kvtune.tuner.traces import Trace, TraceRequest


def test_block_hash_names_the_prefix_up_to_the_block_end() -> None:
    interner = SegmentInterner()
    sys_uid = interner.chain(0, "system")
    a = ((sys_uid, 40), (interner.unique(), 30))
    b = ((sys_uid, 40), (interner.unique(), 30))
    ha, hb = block_hashes(a, 70, 16), block_hashes(b, 70, 16)
    assert len(ha) == 4  # 70 // 16 full blocks
    # Blocks 0 and 1 end inside the shared 40 tokens; block 2 (32..48) spans into own text.
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]
    assert len(set(ha)) == 4


def test_interner_is_deterministic_and_chains_by_parent() -> None:
    i1, i2 = SegmentInterner(), SegmentInterner()
    assert [i1.chain(0, 7), i1.chain(1, 8)] == [i2.chain(0, 7), i2.chain(1, 8)]
    assert i1.chain(0, 8) != i1.chain(1, 8)  # same label after a different prefix


def test_shareable_tokens_stop_at_the_first_unshared_segment() -> None:
    segs = [((1, 10), (2, 5), (3, 7)), ((1, 10), (2, 5), (4, 9)), ((5, 3),)]
    assert shareable_prefix_tokens(segs) == [15, 15, 0]


def test_mooncake_ids_are_chained_even_when_reused_after_another_prefix() -> None:
    # Hash id 9 after 1 and after 2 must not be the same content.
    trace = Trace("t", "mooncake-jsonl", [
        TraceRequest(0.0, 1024, 5, (1, 9)), TraceRequest(1.0, 1024, 5, (2, 9)),
        TraceRequest(2.0, 1024, 5, (1, 9)),
    ])
    reqs = requests_from_trace(trace)
    assert reqs[0].segments[:2] == reqs[2].segments[:2]
    assert reqs[0].segments[1] != reqs[1].segments[1]
    assert [r.shareable_tokens for r in reqs] == [1024, 0, 1024]
    assert ideal_prefix_hit_rate(reqs, 16) == pytest.approx(1008 / 3072)  # (1024-1)//16 blocks


def test_speed_divides_arrival_times() -> None:
    trace = Trace("t", "azure-csv", [TraceRequest(0.0, 10, 2), TraceRequest(8.0, 10, 2)])
    assert [r.arrival_seconds for r in requests_from_trace(trace, speed=4.0)] == [0.0, 2.0]


def _chat(turns: int, seed: int = 3) -> list:  # type: ignore[type-arg]
    return synthetic_requests(SyntheticProfile(
        num_requests=120, request_rate_per_second=2.0,
        user_prompt=LengthDistribution(200, 800, 4000), output=LengthDistribution(150, 500, 2000),
        system_prompt_tokens=1000, turns_per_session=turns, think_seconds=60.0,
    ), seed)


def test_synthetic_traffic_is_reproducible_from_its_seed() -> None:
    assert _chat(4, seed=3) == _chat(4, seed=3)
    assert _chat(4, seed=3) != _chat(4, seed=4)


def test_multi_turn_history_grows_and_is_shared() -> None:
    reqs = _chat(4)
    first_turn = next(r for r in reqs if len(r.segments) == 3)  # system, user, answer
    later = [r for r in reqs if r.segments[:3] == first_turn.segments[:3] and r is not first_turn]
    assert later, "the next turn re-sends the first turn's prompt and answer"
    assert all(r.prompt_tokens > first_turn.prompt_tokens for r in later)
    # Everybody shares the system prompt; multi-turn adds the re-sent history on top.
    single, multi = ideal_prefix_hit_rate(_chat(1), 16), ideal_prefix_hit_rate(reqs, 16)
    assert 0.2 < single < multi
    cfg = EngineConfig(num_gpu_blocks=20_000, block_size=16, max_num_seqs=64,
                       max_num_batched_tokens=4096, max_model_len=32768)
    res = simulate(reqs, cfg, fixed_step_cost())
    assert res.summary()["prefix_hit_rate"] == pytest.approx(multi, abs=0.05)


COST = StepCostModel(
    weights_bytes=16_000_000_000, kv_bytes_per_token=131_072, hbm_bytes_per_second=3.35e12,
    matrix_flops_per_second=989e12, flops_per_token=16e9, attention_flops_per_token_pair=524_288,
    efficiency=Efficiency(0.8, 0.55, 0.004),
)


@pytest.mark.parametrize("overlapped", [False, True], ids=["sync", "async"])
@given(st.integers(1, 512), st.integers(0, 2_000_000), st.integers(0, 300))
def test_decode_run_closed_form_equals_the_sum_of_its_steps(
    overlapped: bool, num_seqs: int, context_tokens: int, k: int
) -> None:
    steps = sum(COST.step_seconds(num_seqs, context_tokens + j * num_seqs,
                                  float(context_tokens + j * num_seqs), overlapped)
                for j in range(k))
    assert math.isclose(COST.decode_run_seconds(num_seqs, context_tokens, k, overlapped), steps,
                        rel_tol=1e-9, abs_tol=1e-12)


def test_async_scheduling_overlaps_the_overhead_with_the_gpu_work() -> None:
    # A 1B model's small decode batch: GPU time under the 4 ms overhead -> the overhead
    # alone; the 8B model's decode step: GPU time over it -> the GPU time alone; never the sum.
    tiny = dataclasses.replace(COST, weights_bytes=2_000_000_000)
    step = (8, 8000, 8000.0)
    gpu_tiny = tiny.step_seconds(*step) - 0.004
    gpu_8b = COST.step_seconds(*step) - 0.004
    assert gpu_tiny < 0.004 < gpu_8b
    assert tiny.step_seconds(*step, overlapped=True) == pytest.approx(0.004)
    assert COST.step_seconds(*step, overlapped=True) == pytest.approx(gpu_8b)


def test_decode_steps_to_reach_is_the_first_step_past_the_time() -> None:
    t = COST.decode_run_seconds(32, 64_000, 10)
    assert COST.decode_steps_to_reach(32, 64_000, t, 100) == 10
    assert COST.decode_steps_to_reach(32, 64_000, t + 1e-9, 100) == 11
    assert COST.decode_steps_to_reach(32, 64_000, 1e9, 100) == 100


def test_worked_example_in_the_timing_doc() -> None:
    # Llama-3.1-8B BF16 on H100: 64 sequences of 2,000 tokens -> about 16.2 ms.
    cost = StepCostModel(16_060_000_000, 131_072, 3.35e12, 989e12, 2 * 8.03e9, 524_288,
                         efficiency_for("H100"))
    assert cost.step_seconds(64, 64 * 2000, 64 * 2000.0) == pytest.approx(0.0162, abs=2e-4)
