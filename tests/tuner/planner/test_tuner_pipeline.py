"""``planning.PIPELINE``: the decisions in order, each step from one frozen ``Draft`` to the
next. The order is a contract (a step reads what the steps before it decided), the drafts
are never changed in place, and reasons only accumulate."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner import decide_dtype, decide_max_model_len
from kvtune.tuner.planner.draft import Draft
from kvtune.tuner.planner.planning import PIPELINE, PlanRequest, plan_pool
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile


def _request() -> PlanRequest:
    return PlanRequest(model=get_model("meta-llama/Llama-3.1-8B-Instruct"),
                       gpu=get_gpu_class("H100"), profile=preset_profile("chat"),
                       policy=PlanPolicy(slo=SLO(ttft_p95_seconds=1.0, tpot_p95_seconds=0.03)))


def _drafts(request: PlanRequest) -> list[Draft]:
    run = PlanRun(request)
    drafts = [Draft(warnings=run.validation_warnings)]
    for step in PIPELINE:
        before = drafts[-1]
        kept = dataclasses.replace(before)
        drafts.append(step(run, before))
        assert before == kept, step  # the step left its input as it was
    return drafts


def test_each_step_returns_a_new_draft_and_reasons_only_accumulate() -> None:
    drafts = _drafts(_request())
    for before, after in itertools.pairwise(drafts):
        assert after.reasons[:len(before.reasons)] == before.reasons
    with pytest.raises(dataclasses.FrozenInstanceError):
        drafts[-1].max_num_seqs = 1  # type: ignore[misc]
    # The pipeline's reasons are the plan's, in the same order (the block size, the
    # attention backend and the weights come after it).
    pool = plan_pool(_request())
    assert pool.reasons[:len(drafts[-1].reasons)] == drafts[-1].reasons
    assert drafts[-1].plan is not None
    assert drafts[-1].plan.kv_cache_dtype == pool.plan.kv_cache_dtype


def test_a_step_run_before_the_knobs_it_reads_names_the_missing_knob() -> None:
    run = PlanRun(_request())
    early = Draft()
    with pytest.raises(AssertionError, match="max-num-batched-tokens was read before"):
        decide_dtype.decide(run, early)
    with pytest.raises(AssertionError, match="max-model-len was read before"):
        decide_max_model_len.settle(run, early)
