"""The scheduler on hand-made cases whose every step can be worked out on paper."""

from __future__ import annotations

import math

import pytest
from simhelpers import STEP_SECONDS, fixed_step_cost, request

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.scheduler import EngineConfig, RequestState, Scheduler, simulate


def cfg(**kw: object) -> EngineConfig:
    base: dict[str, object] = dict(
        num_gpu_blocks=65, block_size=16, max_num_seqs=8, max_num_batched_tokens=2048,
        max_model_len=4096, enable_prefix_caching=True,
    )
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


def test_one_request_ttft_is_one_step_and_each_token_one_step() -> None:
    res = simulate([request(0, 0.0, 10, 5)], cfg(), fixed_step_cost())
    assert res.first_token_seconds[0] == pytest.approx(STEP_SECONDS)
    assert res.finish_seconds[0] == pytest.approx(5 * STEP_SECONDS)
    s = res.summary()
    assert s["tpot_p50_seconds"] == pytest.approx(STEP_SECONDS)
    assert s["peak_concurrent_sequences"] == 1 and s["preemptions"] == 0


def test_chunked_prefill_takes_ceil_prompt_over_budget_steps() -> None:
    res = simulate([request(0, 0.0, 100, 2)], cfg(max_num_batched_tokens=32), fixed_step_cost())
    assert res.first_token_seconds[0] == pytest.approx(4 * STEP_SECONDS)  # 32+32+32+4


@pytest.mark.parametrize(
    ("prompt_tokens", "shared_tokens", "expected_hit_tokens"),
    [
        (32, 32, 16),   # hit capped at prompt-1 = 31 tokens -> one full block
        (33, 32, 32),   # both shared blocks are full and below the cap
        (40, 24, 16),   # only full blocks count: 24 shared tokens = 1 block
        (15, 15, 0),    # no full block at all
    ],
)
def test_prefix_hits_are_full_blocks_below_the_last_token(
    prompt_tokens: int, shared_tokens: int, expected_hit_tokens: int
) -> None:
    shared = ((7, shared_tokens),)
    reqs = [request(0, 0.0, prompt_tokens, 1, shared), request(1, 1.0, prompt_tokens, 1, shared)]
    res = simulate(reqs, cfg(), fixed_step_cost())
    assert res.prefix_hit_tokens == expected_hit_tokens
    assert res.prefix_query_tokens == 2 * prompt_tokens


def test_no_prefix_cache_means_no_hits() -> None:
    shared = ((7, 64),)
    reqs = [request(0, 0.0, 80, 1, shared), request(1, 1.0, 80, 1, shared)]
    off = simulate(reqs, cfg(enable_prefix_caching=False), fixed_step_cost())
    assert off.prefix_hit_tokens == 0
    assert simulate(reqs, cfg(), fixed_step_cost()).prefix_hit_tokens == 64


def test_preemption_recomputes_the_newest_running_request() -> None:
    # 8 usable blocks of 4 tokens. Two requests of prompt 8 (2 blocks each) decode 12 tokens
    # (3 more blocks each): together they need 10 blocks, so the newer one is preempted.
    reqs = [request(0, 0.0, 8, 13), request(1, 0.0, 8, 13)]
    sched = Scheduler(reqs, cfg(num_gpu_blocks=9, block_size=4), fixed_step_cost())
    res = sched.run()
    assert res.preemptions >= 1
    assert sched.states[1].preemptions >= 1 and sched.states[0].preemptions == 0
    assert res.finish_seconds[0] < res.finish_seconds[1]
    assert all(not math.isnan(t) for t in res.finish_seconds)
    # Request 0 never waits: 1 prefill step + 12 decode steps.
    assert res.finish_seconds[0] == pytest.approx(13 * STEP_SECONDS)


def test_fifo_head_of_line_blocks_smaller_requests_behind() -> None:
    # 10 usable blocks of 4 tokens. r0 (6 blocks, growing to 8) runs; r1 needs 5 blocks for
    # its whole prompt (vLLM 0.33 reserves the full input first), r2 needs 1 but waits
    # behind r1 although it would fit.
    reqs = [request(0, 0.0, 24, 8), request(1, 0.001, 20, 2), request(2, 0.002, 3, 2)]
    res = simulate(reqs, cfg(num_gpu_blocks=11, block_size=4), fixed_step_cost())
    assert res.first_token_seconds[1] > res.finish_seconds[0] - 1e-9
    assert res.first_token_seconds[2] >= res.first_token_seconds[1]


def test_max_num_seqs_caps_concurrency() -> None:
    reqs = [request(i, 0.0, 10, 5) for i in range(3)]
    res = simulate(reqs, cfg(max_num_seqs=2), fixed_step_cost())
    assert res.peak_running == 2
    assert res.first_token_seconds[2] == pytest.approx(6 * STEP_SECONDS)


def test_contiguous_reserves_max_model_len_per_request() -> None:
    # 64 KV tokens, max-model-len 32: two reservations at a time, even for tiny requests.
    reqs = [request(i, 0.0, 4, 3) for i in range(5)]
    c = cfg(num_gpu_blocks=5, block_size=16, max_model_len=32, allocation="contiguous")
    res = simulate(reqs, c, fixed_step_cost())
    assert res.peak_running == 2
    paged = simulate(reqs, cfg(num_gpu_blocks=5, block_size=16, max_model_len=32),
                     fixed_step_cost())
    assert paged.peak_running == 4  # one 16-token block each: 4 usable blocks


def test_requests_longer_than_the_limits_are_rejected() -> None:
    reqs = [request(0, 0.0, 5000, 10), request(1, 0.0, 100, 10)]
    res = simulate(reqs, cfg(), fixed_step_cost())
    assert res.rejected == 1
    assert math.isnan(res.finish_seconds[0]) and not math.isnan(res.finish_seconds[1])


def test_contiguous_needs_room_for_one_reservation() -> None:
    with pytest.raises(InvalidInput, match="max_model_len"):
        cfg(num_gpu_blocks=3, block_size=16, max_model_len=64, allocation="contiguous")


def test_block_ids_and_eviction_order_through_the_scheduler() -> None:
    # Block size 4, 9 usable blocks. A (8-token shared prefix, 1 output token) takes blocks
    # 1, 2; both full, so both cached; freed in reverse -> the back of the queue: [..., 2, 1].
    # B (same 8 tokens + 4 own) hits both (cap: (12-1)//4 = 2 blocks) and gets block 3 new.
    shared = ((5, 8),)
    reqs = [request(0, 0.0, 8, 1, shared), request(1, 1.0, 12, 1, shared)]
    seen: dict[int, list[int]] = {}

    class Recording(Scheduler):
        def _free(self, st: RequestState) -> None:
            seen[st.req.request_id] = st.blocks.tolist()
            super()._free(st)

    sched = Recording(reqs, cfg(num_gpu_blocks=10, block_size=4), fixed_step_cost())
    res = sched.run()
    assert seen == {0: [1, 2], 1: [1, 2, 3]}
    assert res.prefix_hit_tokens == 8
    # After B: its partial-free order is tail first; all three are full (12 tokens), the
    # first two were already cached, block 3 gets B's own (unshared) hash.
    assert sched.pool.free_block_queue.block_ids() == [4, 5, 6, 7, 8, 9, 3, 2, 1]
    sched.pool.check_invariants()


def test_a_preempted_request_finds_its_own_cached_blocks_again() -> None:
    # Five usable blocks of 4; two unique requests each grow to 4 blocks: the newer one is
    # preempted. Its full blocks stay cached in the free queue (vLLM keeps their hashes),
    # so when it resumes it hits at least its prompt blocks not yet reused.
    reqs = [request(0, 0.0, 8, 9), request(1, 0.0, 8, 9)]
    sched = Scheduler(reqs, cfg(num_gpu_blocks=6, block_size=4), fixed_step_cost())
    res = sched.run()
    assert res.preemptions >= 1
    assert res.resume_hit_tokens > 0
    assert res.prefix_hit_tokens == 0  # first admissions shared nothing
    assert all(not math.isnan(t) for t in res.finish_seconds)
    off = simulate(reqs, cfg(num_gpu_blocks=6, block_size=4, enable_prefix_caching=False),
                   fixed_step_cost())
    assert off.resume_hit_tokens == 0
    sched.pool.check_invariants()


def test_a_token_budget_below_the_running_count_stalls_the_newest_decodes() -> None:
    # Budget 2 tokens per step, 3 decoding requests: each step only the two oldest advance.
    reqs = [request(i, 0.0, 1, 6) for i in range(3)]
    res = simulate(reqs, cfg(max_num_batched_tokens=2), fixed_step_cost())
    exact = Scheduler(reqs, cfg(max_num_batched_tokens=2), fixed_step_cost(),
                      decode_runs=False).run()
    assert res.finish_seconds == pytest.approx(exact.finish_seconds)
    assert res.finish_seconds[0] < res.finish_seconds[2]
