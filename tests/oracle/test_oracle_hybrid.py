"""Hybrid models' KV groups: vLLM's own sliding-window (Gemma-3-shaped: one full-attention
group, five sliding-window groups of 1,024 tokens) and chunked-local (Llama-4-shaped: one
full, three local groups with 8,192-token chunks) specs, against kvtune's simulator, which
treats every layer as full attention.

At equal KV memory vLLM's pool has G times as many blocks (a block holds one group's layers,
G groups), and a request takes a block per group. So:

- while every sequence stays within the window or chunk, vLLM's run is kvtune's, step by
  step, with G times the blocks in use, except where a preempted request resumes: vLLM finds
  less of it cached (the local groups' out-of-window blocks are not kept), so it recomputes
  more (bounded: the resumed hit is never larger than kvtune's);
- past the window, vLLM frees the local groups' old blocks: it holds fewer blocks, preempts
  less and finishes sooner. kvtune's simulation of a hybrid model is pessimistic (asserted on
  a trace slice below), which is what a planner wants from a model it does not follow exactly.
"""

from __future__ import annotations

import pytest
from oraclecases import AZURE, first_difference, trace_slice
from simhelpers import fixed_step_cost, request

from kvtune.oracle.steps import RunRecord, StepRecord, kvtune_steps
from kvtune.oracle.vllm_engine import KVGroup, vllm_steps
from kvtune.tuner.simulator.scheduler import EngineConfig

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GEMMA3 = (KVGroup(),) + (KVGroup("sliding_window", 1024),) * 5
LLAMA4 = (KVGroup(),) + (KVGroup("chunked_local", 8192),) * 3
SHAPES = {"gemma3": GEMMA3, "llama4": LLAMA4}
# 80 requests, prompt + output under 1,000 tokens: inside every window and chunk.
SHORT = [request(i, i * 0.02, 200 + (i * 37) % 600, 50 + (i * 13) % 150) for i in range(80)]


def _configs(blocks: int, groups: int, async_scheduling: bool
             ) -> tuple[EngineConfig, EngineConfig]:
    def cfg(n: int) -> EngineConfig:
        return EngineConfig(num_gpu_blocks=n, block_size=16, max_num_seqs=64,
                            max_num_batched_tokens=2048, max_model_len=32768,
                            async_scheduling=async_scheduling)
    # Equal memory: G blocks of one group's layers per full-attention block (+ null block).
    return cfg(blocks), cfg((blocks - 1) * groups + 1)


def _per_group(run: RunRecord, groups: int) -> RunRecord:
    assert all(s.blocks_in_use % groups == 0 for s in run.steps)
    return RunRecord(
        steps=tuple(StepRecord(s.scheduled, s.admitted, s.preempted, s.finished,
                               s.blocks_in_use // groups, s.end_seconds) for s in run.steps),
        finish_step=run.finish_step, rejected=run.rejected)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_within_the_window_hybrid_equals_full_attention(
        vllm: object, shape: str, async_scheduling: bool) -> None:
    groups = SHAPES[shape]
    ours_cfg, theirs_cfg = _configs(4000, len(groups), async_scheduling)
    ours = kvtune_steps(SHORT, ours_cfg, fixed_step_cost())
    theirs = vllm_steps(SHORT, theirs_cfg, fixed_step_cost(), groups)
    assert first_difference(ours, _per_group(theirs, len(groups))) == ""
    assert ours.preemptions == 0  # (a resumed request is where they differ: next test)
    assert max(s.blocks_in_use for s in ours.steps) > 1000  # the groups really hold blocks


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_resumed_request_finds_less_cached_in_a_hybrid(vllm: object, shape: str) -> None:
    groups = SHAPES[shape]
    ours_cfg, theirs_cfg = _configs(300, len(groups), False)
    ours = kvtune_steps(SHORT, ours_cfg, fixed_step_cost())
    theirs = _per_group(vllm_steps(SHORT, theirs_cfg, fixed_step_cost(), groups), len(groups))
    i = next(i for i, (a, b) in enumerate(zip(ours.steps, theirs.steps, strict=False))
             if a != b)
    a, b = ours.steps[i], theirs.steps[i]
    preempted_before = {rid for s in ours.steps[:i] for rid in s.preempted}
    (rid, our_hit), = a.admitted
    (their_rid, their_hit), = b.admitted
    assert rid == their_rid and rid in preempted_before
    assert their_hit < our_hit
    assert ours.steps[:i] == theirs.steps[:i]


def test_past_the_window_kvtune_is_pessimistic(vllm: object) -> None:
    reqs = trace_slice(AZURE, 80, 0, 1000.0)
    ours_cfg, theirs_cfg = _configs(600, len(GEMMA3), False)
    ours = kvtune_steps(reqs, ours_cfg, fixed_step_cost())
    theirs = vllm_steps(reqs, theirs_cfg, fixed_step_cost(), GEMMA3)
    assert ours.finish_order != theirs.finish_order  # a real difference, not a tie
    assert ours.preemptions > theirs.preemptions
    assert len(ours.steps) > len(theirs.steps)
    peak_ours = max(s.blocks_in_use for s in ours.steps) * len(GEMMA3)
    assert max(s.blocks_in_use for s in theirs.steps) <= peak_ours
