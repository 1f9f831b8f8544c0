"""The retune tick's steps after ``decide_pools`` return new, frozen ``PoolTick``s: nothing
is updated in place, so a tick's decision can be read before and after the re-plan."""

from __future__ import annotations

import dataclasses

import pytest

from kvtune.operator.prometheus.profiling import PoolProfile
from kvtune.operator.retune import decide as retune
from kvtune.operator.retune import tick
from kvtune.operator.retune.decide import RetuneSettings, RetuneState
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

PLAN = KVPlan(block_size=16, kv_cache_dtype="auto", gpu_memory_utilization=0.9,
              max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192,
              enable_prefix_caching=True)
PROFILE = WorkloadProfile(
    source="prometheus",
    context_tokens=TokenQuantiles(p50=1000, p90=2700, p95=3700, p99=4800, max=9600),
    output_tokens=TokenQuantiles(p50=140, p90=420, p95=480, p99=800, max=1600))
SETTINGS = RetuneSettings(drift_threshold=0.2, dwell_seconds=60, min_interval_seconds=300)


def _replan_tick() -> tick.PoolTick:
    """A pool whose decision is replan (drift above the threshold for longer than the dwell)."""
    state = RetuneState(drift_since_seconds=0.0, candidate=PROFILE, stable_since_seconds=0.0,
                        last_rollout_seconds=-1000.0)
    decision = retune.Decision(action="replan", reason=retune.REPLAN, message="drifted",
                               drift=None, state=state)
    return tick.PoolTick(
        name="h100", choice=PoolProfile(profile=PROFILE, scope="pool", requests=500,
                                        message="trusted"),
        observed=PROFILE, baseline=PROFILE, baseline_scope="pool", selector="",
        decision=decision, reason=decision.reason, message=decision.message,
        state=decision.state)


def test_a_pool_tick_is_frozen() -> None:
    t = _replan_tick()
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.message = "changed"  # type: ignore[misc]


@pytest.mark.parametrize(("new", "reason", "material", "adopted"), [
    (PLAN.model_copy(update={"kv_cache_dtype": "fp8"}), retune.PLAN_CHANGED, True, False),
    (PLAN, retune.PLAN_UNCHANGED, False, True),
    (PLAN.model_copy(update={"max_num_seqs": 264}), retune.PLAN_UNCHANGED, False, False),
])
def test_judging_a_new_plan_returns_a_new_tick(new: KVPlan, reason: str, material: bool,
                                               adopted: bool) -> None:
    before = _replan_tick()
    kept = dataclasses.replace(before)
    after = tick.judge_new_plan(before, PLAN, new, now=500.0)
    assert before == kept  # the input tick is untouched
    assert (after.reason, after.material, after.adopted) == (reason, material, adopted)
    if material:
        assert after.state.last_rollout_seconds == 500.0
    elif not adopted:  # noise: looked at again after another dwell time
        assert after.state.drift_since_seconds == 500.0


def test_a_reconcile_error_is_told_on_the_ticks_that_were_to_roll_out() -> None:
    quiet = _replan_tick()
    rolling = tick.judge_new_plan(quiet, PLAN, PLAN.model_copy(update={"block_size": 32}),
                                  now=500.0)
    out = tick.with_reconcile_error([quiet, rolling], "the model cannot be read")
    assert out[0] is quiet
    assert out[1].message == f"{rolling.message}; reconcile: the model cannot be read"
    assert "reconcile" not in rolling.message  # the input tick is untouched
    assert tick.with_reconcile_error([rolling], None) == [rolling]
