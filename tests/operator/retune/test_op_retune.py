"""Drift score, dwell time, minimum interval and material plan changes (pure)."""

from __future__ import annotations

import math

import pytest

from kvtune.operator.retune import decide as retune
from kvtune.operator.retune.decide import RetuneSettings, RetuneState
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile


def _profile(scale: float = 1.0, hit: float | None = None) -> WorkloadProfile:
    def q(p50: int, p90: int, p95: int, p99: int) -> TokenQuantiles:
        vals = [round(v * scale) for v in (p50, p90, p95, p99)]
        return TokenQuantiles(p50=vals[0], p90=vals[1], p95=vals[2], p99=vals[3],
                              max=vals[3] * 2)

    return WorkloadProfile(source="prometheus", context_tokens=q(1000, 2700, 3700, 4800),
                           output_tokens=q(140, 420, 480, 800), prefix_hit_rate=hit)


SETTINGS = RetuneSettings(drift_threshold=0.2, dwell_seconds=60, min_interval_seconds=300)


def test_identical_profiles_have_zero_drift() -> None:
    d = retune.drift_score(_profile(), _profile())
    assert d.score == 0.0


def test_drift_is_the_log_emd_of_the_quantiles() -> None:
    # Every context and output quantile doubled: the score is ln 2 (within rounding).
    d = retune.drift_score(_profile(), _profile(scale=2.0))
    assert d.context == pytest.approx(math.log(2), abs=0.01)
    assert d.score == pytest.approx(math.log(2), abs=0.01)


def test_prefix_hit_rate_alone_can_drive_drift() -> None:
    d = retune.drift_score(_profile(hit=0.0), _profile(hit=0.5))
    assert d.score == 0.5 and d.driver == "prefix hit rate"


@pytest.mark.parametrize(("steps", "expected"), [
    # (seconds, scale) ticks -> the last decision's reason
    ([(0, 1.05)], retune.BELOW_THRESHOLD),
    ([(0, 3.0)], retune.DWELL_PENDING),
    ([(0, 3.0), (30, 3.0)], retune.DWELL_PENDING),
    ([(0, 3.0), (61, 3.0)], retune.REPLAN),
    # A dip under the threshold restarts the dwell clock.
    ([(0, 3.0), (30, 1.0), (61, 3.0)], retune.DWELL_PENDING),
])
def test_dwell_time(steps: list[tuple[float, float]], expected: str) -> None:
    state = RetuneState()
    decision = None
    for now, scale in steps:
        decision = retune.decide(now_seconds=now, baseline=_profile(),
                                 observed=_profile(scale), untrusted_reason=None,
                                 state=state, settings=SETTINGS)
        state = decision.state
    assert decision is not None and decision.reason == expected, decision
    assert "threshold 0.200" in decision.message


def test_min_interval_since_the_last_rollout() -> None:
    state = RetuneState(drift_since_seconds=0, candidate=_profile(3.0), stable_since_seconds=0,
                        last_rollout_seconds=1000)
    wait = retune.decide(now_seconds=1100, baseline=_profile(), observed=_profile(3.0),
                         untrusted_reason=None, state=state, settings=SETTINGS)
    assert wait.action == "wait" and wait.reason == retune.MIN_INTERVAL_PENDING
    assert "100s ago" in wait.message
    go = retune.decide(now_seconds=1301, baseline=_profile(), observed=_profile(3.0),
                       untrusted_reason=None, state=state, settings=SETTINGS)
    assert go.action == "replan"


def test_a_shift_still_moving_waits_until_it_settles_or_lasts_too_long() -> None:
    state = RetuneState()
    reasons = []
    # The traffic keeps growing by 1.5x every 30 s: never steady for the 60 s dwell.
    for i in range(10):
        d = retune.decide(now_seconds=30.0 * i, baseline=_profile(), observed=_profile(
            2.0 * 1.5 ** i), untrusted_reason=None, state=state, settings=SETTINGS)
        state = d.state
        reasons.append(d.reason)
        if d.action == "replan":
            break
    assert reasons[0] == retune.DWELL_PENDING
    assert retune.STILL_SHIFTING in reasons[1:]
    # Planned for anyway after MAX_DWELL_FACTOR (4) dwell times of drift: at 240 s.
    assert reasons[-1] == retune.REPLAN and len(reasons) == 9
    assert "still shifting" in d.message


def test_untrusted_profile_keeps_the_plan_and_the_dwell_clock() -> None:
    state = RetuneState(drift_since_seconds=5)
    d = retune.decide(now_seconds=100, baseline=_profile(), observed=None,
                      untrusted_reason="12 requests", state=state, settings=SETTINGS)
    assert d.action == "keep" and d.reason == retune.PROFILE_UNTRUSTED
    assert d.state == state and "12 requests" in d.message


PLAN = KVPlan(block_size=16, kv_cache_dtype="auto", gpu_memory_utilization=0.92,
              max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192,
              enable_prefix_caching=True)


@pytest.mark.parametrize(("update", "matters"), [
    ({}, False),
    ({"max_model_len": 8704}, False),  # +6 %: within the 10 % margin
    ({"max_model_len": 65536}, True),
    ({"max_num_seqs": 280}, False),
    ({"max_num_seqs": 128}, True),
    ({"kv_cache_dtype": "fp8"}, True),
    ({"block_size": 32}, True),
    ({"enable_prefix_caching": False}, True),
    ({"gpu_memory_utilization": 0.93}, False),
    ({"gpu_memory_utilization": 0.96}, True),
])
def test_plan_change_matters(update: dict[str, object], matters: bool) -> None:
    ok, why = retune.plan_change_matters(PLAN, PLAN.model_copy(update=update))
    assert ok is matters, why
    if not matters and update:
        assert why[0].startswith("noise:")
