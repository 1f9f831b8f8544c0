"""The decoding cohort (the fast path) against exact stepping on the traces the project ships:
every request's first-token and finish time, preemptions and prefix hits must be the same,
with prefix caching on and off, synchronous and async scheduling, caches tight enough to
preempt and loose enough not to."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from simhelpers import STEP_SECONDS, assert_same_times, fixed_step_cost, request

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE
from kvtune.tuner.simulator.cohort import DecodeCohort
from kvtune.tuner.simulator.scheduler import EngineConfig, RequestState, Scheduler
from kvtune.tuner.simulator.timing import Efficiency, StepCostModel
from kvtune.tuner.simulator.workload import SimRequest, requests_from_trace
from kvtune.tuner.traces import load_trace

# Llama-3.1-8B-shaped on an H100-class GPU: decode steps memory-bound, prefill chunks not.
ROOFLINE = StepCostModel(
    weights_bytes=16_060_000_000, kv_bytes_per_token=131_072,
    hbm_bytes_per_second=3.35e12, matrix_flops_per_second=989e12,
    flops_per_token=16.06e9, attention_flops_per_token_pair=4.0 * 32 * 32 * 128,
    efficiency=Efficiency(0.8, 0.6, 0.004))


@cache
def _slice(trace: str, speed: float, limit: int, start: int) -> tuple[SimRequest, ...]:
    path = MOONCAKE_TRACE if trace == "mooncake" else AZURE_TRACE
    return tuple(requests_from_trace(load_trace(path), speed=speed, limit=limit, start=start))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("trace", "speed", "limit", "start", "blocks", "caching", "preempts"), [
    ("mooncake", 4.0, 300, 0, 1500, True, True),
    ("mooncake", 1000.0, 200, 500, 20000, True, False),
    ("mooncake", 1.0, 300, 1000, 2500, False, True),
    ("azure", 1000.0, 300, 0, 400, True, True),
    ("azure", 4.0, 400, 1000, 20000, False, False),
])
def test_cohort_equals_exact_stepping(
    trace: str, speed: float, limit: int, start: int, blocks: int, caching: bool,
    preempts: bool, async_scheduling: bool,
) -> None:
    reqs = _slice(trace, speed, limit, start)
    cfg = EngineConfig(num_gpu_blocks=blocks, block_size=16, max_num_seqs=64,
                       max_num_batched_tokens=2048, max_model_len=32768,
                       enable_prefix_caching=caching, async_scheduling=async_scheduling)
    fast_sched = Scheduler(reqs, cfg, ROOFLINE)
    fast = fast_sched.run()
    exact = Scheduler(reqs, cfg, ROOFLINE, decode_runs=False).run()
    assert (exact.preemptions > 0) == preempts  # the case exercises what it claims
    assert fast.preemptions == exact.preemptions
    assert fast.prefix_hit_tokens == exact.prefix_hit_tokens
    assert fast.resume_hit_tokens == exact.resume_hit_tokens
    assert fast.peak_running == exact.peak_running
    assert_same_times(fast, exact)
    # Far fewer loop iterations than steps, and the cohort held most decoding requests.
    assert fast_sched.events < fast_sched.steps


def test_cohort_member_state_is_a_function_of_the_clock() -> None:
    req = SimRequest(request_id=0, arrival_seconds=0.0, prompt_tokens=30, output_tokens=10,
                     segments=((1, 40),), shareable_tokens=0)
    st = RequestState(req, 10, np.zeros(0, dtype=np.int64))
    st.num_tokens, st.num_computed, st.generated, st.num_cached_blocks = 31, 30, 1, 1
    st.blocks = _blocks(2)
    st.last_sample_step = 5
    cohort = DecodeCohort(block_size=16)
    cohort.join(st)
    assert cohort.context_tokens() == 31 and cohort.blocks_needed_now() == 0
    # The next two steps compute the tokens at index 30 and 31 (block 1 holds 16-31); the
    # third, index 32, starts block 2: one new block, in the third step.
    assert [cohort.new_blocks_for(k) for k in range(5)] == [0, 0, 0, 1, 1]
    assert cohort.steps_to_next_finish() == 9
    cohort.advance(2, _blocks(0), last_step=7)
    assert cohort.blocks_needed_now() == 1
    cohort.advance(1, _blocks(1, first=9), last_step=8)
    cohort.sync(st)
    assert (st.num_tokens, st.num_computed, st.generated) == (34, 33, 4)
    assert st.num_cached_blocks == 2 and st.blocks.tolist() == [1, 2, 9]
    assert st.tail_unprocessed and st.last_sample_step == 8
    assert cohort.context_tokens() == 34 and cohort.steps_to_next_finish() == 6
    done = cohort.advance(6, _blocks(0), last_step=14)
    assert done == [st]
    cohort.leave(st)
    assert st.generated == 10 and cohort.size == 0 and cohort.blocks_held == 0


def _blocks(n: int, first: int = 1) -> np.ndarray:
    return np.arange(first, first + n, dtype=np.int64)


def test_an_async_finish_is_freed_inside_the_next_decode_run() -> None:
    """Async: a request that sampled its last token is freed once the next step is
    scheduled. With nobody waiting, that step is the first of the next decode run, not an
    iteration of its own: admission, a run to A's last token, a run that frees A and
    decodes B to its end, B's free. Times as exact stepping."""
    cfg = EngineConfig(num_gpu_blocks=64, block_size=16, max_num_seqs=8,
                       max_num_batched_tokens=256, max_model_len=1024, async_scheduling=True)
    reqs = [request(0, 0.0, 16, 4), request(1, 0.0, 16, 40)]
    seen: list[tuple[int, list[int]]] = []
    fast_sched = Scheduler(reqs, cfg, fixed_step_cost(), on_step=lambda s: seen.append(
        (s.steps, [st.req.request_id for st in s.running])))
    fast = fast_sched.run()
    exact = Scheduler(reqs, cfg, fixed_step_cost(), decode_runs=False).run()
    assert_same_times(fast, exact)
    assert seen == [(1, [0, 1]), (4, [0, 1]), (40, [1]), (40, [])]
    assert fast.finish_seconds[0] == pytest.approx(4 * STEP_SECONDS)


def test_a_finish_beside_a_blocked_queue_is_one_plain_step() -> None:
    """Overloaded async traffic: the step after members finish, while the head of the
    queue cannot be admitted, is taken without the cohort step's plan
    (``RunScheduler._finish_step``), often. That the run is still exact stepping's is
    ``test_cohort_equals_exact_stepping``'s first case (the same requests and engine,
    async); exact stepping is not run twice here."""
    reqs = _slice("mooncake", 4.0, 300, 0)
    cfg = EngineConfig(num_gpu_blocks=1500, block_size=16, max_num_seqs=64,
                       max_num_batched_tokens=2048, max_model_len=32768,
                       enable_prefix_caching=True, async_scheduling=True)
    taken: list[bool] = []

    class Counting(Scheduler):
        def _finish_step(self, retiring: list[RequestState]) -> bool:
            ok = super()._finish_step(retiring)
            taken.append(ok)
            return ok

    sched = Counting(reqs, cfg, ROOFLINE)
    fast = sched.run()
    assert sum(taken) >= 20 and not all(taken)  # taken often, declined where it must be
    assert fast.preemptions > 0
    assert all(st.finish_seconds > 0 for st in sched.states if st.output_tokens)
