"""Reasons from the final plan (issue 22 item 7): after the capacity search changes some knobs,
every reason describes the plan that ships: its choice is the plan's value, and the figures it
quotes of other knobs (the running sequences a batched-tokens reason counts, the KV dtype an
attention-backend reason names) are the final plan's, not the rules' first draft's."""

from __future__ import annotations

import re

import pytest

from kvtune.e2e.traces import AZURE_TRACE
from kvtune.tuner import knobs
from kvtune.tuner.facts import catalog, gpus
from kvtune.tuner.plan import KVPlan, PoolPlan
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile, profile_from_trace
from kvtune.tuner.planner.search_reasons import KEPT_BY_SEARCH
from kvtune.tuner.simulator.goodput_search import plan_by_goodput
from kvtune.tuner.traces import load_trace

pytestmark = pytest.mark.slow


def _choice(plan: KVPlan, flag: str) -> str | None:
    name = knobs.FLAG_TO_NAME.get(flag)
    if name is None:
        return None
    value = getattr(plan, name)
    if value is None:
        return None  # "auto (FLASH_ATTN)", "off": the reason's own words for unset
    return str(value).lower() if isinstance(value, bool) else str(value)


def _assert_told_for(pool: PoolPlan) -> None:
    plan = pool.plan
    for reason in pool.reasons:
        want = _choice(plan, reason.knob)
        if want is not None:
            assert reason.choice == want, reason
        for quoted in re.findall(r"for the (\d+) running sequences", reason.message):
            assert int(quoted) == plan.max_num_seqs, reason
        for quoted in re.findall(r"vLLM picks \S+ for (\S+) KV", reason.message):
            assert quoted == plan.kv_cache_dtype, reason


def _request(profile: object, slo: SLO) -> PlanRequest:
    return PlanRequest(model=catalog.get_model("meta-llama/Llama-3.1-8B-Instruct"),
                       gpu=gpus.get_gpu_class("H100"), profile=profile,
                       policy=PlanPolicy(slo=slo))


def test_a_search_that_widens_the_dtype_tells_every_kept_knob_for_the_wider_dtype() -> None:
    """On the Azure conversations the search keeps bf16 KV where the rules chose fp8: the
    attention backend is told for bf16, the batched tokens for the final max-num-seqs, and
    max-num-seqs (right only beside fp8's capacity) is the search's, with no fp8 figure."""
    trace = load_trace(AZURE_TRACE)
    pool = plan_by_goodput(_request(profile_from_trace(trace),
                                    SLO(ttft_p95_seconds=2.0, tpot_p95_seconds=0.08)),
                           trace=trace)
    assert pool.search is not None
    changed = {r.knob for r in pool.reasons if r.code == "BestCapacity"}
    assert changed, "the search changed nothing: the test needs a case where it does"
    _assert_told_for(pool)
    kept = [r for r in pool.reasons if r.code == KEPT_BY_SEARCH]
    for reason in kept:
        assert "fp8" not in reason.message or pool.plan.kv_cache_dtype == "fp8", reason


@pytest.mark.parametrize("workload,rate", [("rag", 6.0), ("chat", 20.0)])
def test_searched_profiles_tell_every_reason_for_the_final_plan(workload: str,
                                                                 rate: float) -> None:
    profile = preset_profile(workload).model_copy(update={"request_rate_per_second": rate})
    pool = plan_by_goodput(_request(profile, SLO(ttft_p95_seconds=2.0, tpot_p95_seconds=0.08)))
    assert pool.search is not None
    _assert_told_for(pool)
