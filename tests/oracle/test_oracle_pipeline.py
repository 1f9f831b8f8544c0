"""kvtune's pipeline-parallel replay (``sched_pipeline.py``) against vLLM 0.33.0's own
``AsyncScheduler`` under ``--pipeline-parallel-size``, driven as its engine core drives it
(``step_with_batch_queue`` with ``max_concurrent_batches`` = pp + 1 batches in flight, the V2
model runner's default), micro-batch by micro-batch.

Every request arrives at once, so both sides see the same arrivals whatever their clocks
(the oracle's clock charges whole steps, kvtune's the stages): the comparison is of what is
scheduled, not when it ends. Each micro-batch must agree: the requests in it and their tokens,
who is admitted with what prefix hit, who is preempted, blocks in use; and the requests
finish in the same order.
"""

from __future__ import annotations

import pytest
from simhelpers import fixed_step_cost, request

from kvtune.oracle.steps import StepRecord
from kvtune.oracle.vllm_engine import VllmEngine
from kvtune.tuner.simulator.sched_pipeline import PipelineScheduler
from kvtune.tuner.simulator.scheduler import EngineConfig
from kvtune.tuner.simulator.workload import SimRequest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# What a micro-batch is compared on: scheduled (id, tokens), admitted (id, hit tokens),
# preempted ids, blocks in use once scheduled.
Batch = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], tuple[int, ...], int]


def _requests(n: int) -> list[SimRequest]:
    """A burst: prompts of 20-420 tokens (every third shares a 64-token prefix), outputs of
    2-40 tokens."""
    out = []
    for i in range(n):
        prompt = 20 + (i * 37) % 400
        shared = ((7, 64),) if i % 3 == 0 and prompt > 64 else ()
        out.append(request(i, 0.0, prompt, 2 + (i * 13) % 39, shared=shared))
    return out


def _config(pp: int, blocks: int, seqs: int, budget: int) -> EngineConfig:
    return EngineConfig(num_gpu_blocks=blocks, block_size=16, max_num_seqs=seqs,
                        max_num_batched_tokens=budget, max_model_len=4096,
                        enable_prefix_caching=True, async_scheduling=True,
                        pipeline_parallel=pp, pipeline_send_seconds_per_token=1e-6)


def _kvtune(reqs: list[SimRequest], cfg: EngineConfig) -> tuple[list[Batch], list[int]]:
    batches: list[Batch] = []
    seen: set[int] = set()

    def record(s: PipelineScheduler) -> None:
        admitted = tuple((st.req.request_id, st.num_computed - n) for st, n in s.last_scheduled
                         if st.req.request_id not in seen)
        batches.append((tuple((st.req.request_id, n) for st, n in s.last_scheduled), admitted,
                        tuple(st.req.request_id for st in s.last_preempted),
                        s.last_blocks_in_use))
        seen.clear()
        seen.update(st.req.request_id for st in s.running)

    sim = PipelineScheduler(reqs, cfg, fixed_step_cost(), on_step=record)
    res = sim.run()
    order = sorted((t, i) for i, t in enumerate(res.finish_seconds) if t == t)
    return batches, [reqs[i].request_id for _, i in order]


def _vllm(reqs: list[SimRequest], cfg: EngineConfig) -> tuple[list[Batch], list[int]]:
    engine = VllmEngine(reqs, cfg, fixed_step_cost())
    assert engine.depth == cfg.pipeline_parallel + 1  # vLLM's own max_concurrent_batches
    record = engine.run()

    def batch(s: StepRecord) -> Batch:
        return (s.scheduled, s.admitted, s.preempted, s.blocks_in_use)

    return [batch(s) for s in record.steps], record.finish_order


@pytest.mark.parametrize(("pp", "blocks", "seqs", "budget", "preempts"), [
    (2, 2000, 64, 256, False),
    (2, 60, 32, 128, True),
    (3, 2000, 48, 512, False),
], ids=["pp2", "pp2-small-cache", "pp3"])
def test_every_micro_batch_agrees(vllm: object, pp: int, blocks: int, seqs: int, budget: int,
                                  preempts: bool) -> None:
    reqs = _requests(60)
    cfg = _config(pp, blocks, seqs, budget)
    ours, our_order = _kvtune(reqs, cfg)
    theirs, their_order = _vllm(reqs, cfg)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        assert a == b, f"micro-batch {i}: kvtune {a} vs vLLM {b}"
    assert len(ours) == len(theirs)
    assert our_order == their_order
    assert len(our_order) == len(reqs)
    assert any(b[2] for b in ours) == preempts


def test_requests_admitted_together_ride_together(vllm: object) -> None:
    """A burst admitted in one schedule stays one micro-batch: vLLM's cadence is per request
    (``next_decode_eligible_step``), so the other pp - 1 slots carry nothing until later
    arrivals or prefill chunks fill them (both engines: the schedules above agree)."""
    reqs = [request(i, 0.0, 40 + 10 * i, 8) for i in range(6)]
    cfg = _config(2, 2000, 64, 4096)
    ours, _ = _kvtune(reqs, cfg)
    theirs, _ = _vllm(reqs, cfg)
    assert ours == theirs
    assert all(len(b[0]) == 6 for b in ours)  # all six in every micro-batch
