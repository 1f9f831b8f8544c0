"""When to plan again, and whether a new plan is worth a rollout. Pure: no clock, no I/O.

1. ``drift_score``: how far the observed profile is from the one the running plan was made
   for. For each length distribution it is the mean absolute difference of log-lengths at
   the quantiles p50, p90, p95, p99 — the earth mover's distance between the two
   distributions of log(tokens), taken at those quantile points (a 0.2 score is a ~22 %
   shift of the typical length). The prefix hit rate counts by its absolute change. The
   score is the largest of the three, so one of them moving is enough.
2. ``decide``: a score above ``drift_threshold`` must persist for ``dwell_seconds`` (one
   noisy window does not count) with the new traffic holding still meanwhile (observed
   profiles within the threshold of each other: plan for a regime, not a transition), and
   ``min_interval_seconds`` must have passed since the last rollout; then plan again.
3. ``plan_change_matters``: a new plan is applied only if a knob moved by more than its
   noise margin (a different max-model-len by 10 %, max-num-seqs by 20 %, any change of
   block size, KV dtype, prefix caching or offload).

Every outcome is a ``Decision`` with a CamelCase reason and a message that quotes the numbers.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner import knobs
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

_QUANTILES = ("p50", "p90", "p95", "p99")
# A drift that never settles is planned for after this many dwell times.
MAX_DWELL_FACTOR = 4.0

# Reasons (CamelCase, documented vocabulary).
PROFILE_UNTRUSTED = "ProfileUntrusted"  # too few requests / no data: the plan stays
BELOW_THRESHOLD = "BelowThreshold"  # drift under the threshold: nothing to do
DWELL_PENDING = "DwellPending"  # drift above the threshold, not for long enough yet
STILL_SHIFTING = "TrafficStillShifting"  # drifting, and not yet settled into a new regime
MIN_INTERVAL_PENDING = "MinIntervalPending"  # the last rollout was too recent
REPLAN = "Replan"  # drift persisted: plan again
PLAN_CHANGED = "PlanChanged"  # the new plan differs materially: roll it out
PLAN_UNCHANGED = "PlanChangeNotMaterial"  # the new plan is the old one within noise


class RetuneSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    drift_threshold: float = Field(gt=0.0)
    dwell_seconds: float = Field(ge=0.0)
    min_interval_seconds: float = Field(ge=0.0)


class DriftScore(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    score: float
    context: float
    output: float
    prefix_hit_rate: float
    driver: str  # which component gave the score

    def describe(self) -> str:
        return (f"drift {self.score:.3f} (context {self.context:.3f}, output "
                f"{self.output:.3f}, prefix hit rate {self.prefix_hit_rate:.3f}; "
                f"driven by {self.driver})")


class RetuneState(BaseModel):
    """What the timer remembers between runs (kept in status, so restarts keep it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    drift_since_seconds: float | None = None  # first tick above the threshold
    # The traffic must hold still before it is planned for: the profile the current dwell
    # started from, and since when the observed profiles stayed within the threshold of it.
    candidate: WorkloadProfile | None = None
    stable_since_seconds: float | None = None
    last_rollout_seconds: float | None = None


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["keep", "wait", "replan"]
    reason: str
    message: str
    drift: DriftScore | None
    state: RetuneState


def _log_emd(a: TokenQuantiles, b: TokenQuantiles) -> float:
    total = 0.0
    n = 0
    for q in _QUANTILES:
        va, vb = getattr(a, q), getattr(b, q)
        if va is None or vb is None:
            continue
        total += abs(math.log((vb + 1) / (va + 1)))
        n += 1
    return total / n if n else 0.0


def drift_score(baseline: WorkloadProfile, observed: WorkloadProfile) -> DriftScore:
    context = _log_emd(baseline.context_tokens, observed.context_tokens)
    output = _log_emd(baseline.output_tokens, observed.output_tokens)
    hit = 0.0
    if observed.prefix_hit_rate is not None:
        # A declared profile has no hit rate: compare with "nothing known" as 0.
        hit = abs(observed.prefix_hit_rate - (baseline.prefix_hit_rate or 0.0))
    parts = {"context length": context, "output length": output, "prefix hit rate": hit}
    driver = max(parts, key=lambda k: parts[k])
    return DriftScore(score=parts[driver], context=context, output=output,
                      prefix_hit_rate=hit, driver=driver)


def decide(
    *,
    now_seconds: float,
    baseline: WorkloadProfile,
    observed: WorkloadProfile | None,
    untrusted_reason: str | None,
    state: RetuneState,
    settings: RetuneSettings,
) -> Decision:
    """One timer tick. ``observed`` None: the window gave no trusted profile
    (``untrusted_reason`` says why); the plan and the dwell clock stay as they are."""
    if observed is None:
        return Decision(action="keep", reason=PROFILE_UNTRUSTED,
                        message=f"no trusted profile: {untrusted_reason}; the plan stays",
                        drift=None, state=state)
    drift = drift_score(baseline, observed)
    threshold = settings.drift_threshold
    if drift.score <= threshold:
        return Decision(
            action="keep", reason=BELOW_THRESHOLD,
            message=f"{drift.describe()} <= threshold {threshold:.3f}; the plan stays",
            drift=drift, state=state.model_copy(update={
                "drift_since_seconds": None, "candidate": None, "stable_since_seconds": None}))
    since = state.drift_since_seconds if state.drift_since_seconds is not None else now_seconds
    held = now_seconds - since
    # Plan for a regime, not for a transition: while the observed profile still moves by
    # more than the threshold from where the dwell started, restart the dwell from here.
    # A shift that never settles is planned for after MAX_DWELL_FACTOR dwell times anyway.
    moving = (state.candidate is None
              or drift_score(state.candidate, observed).score > threshold)
    if moving:
        state = state.model_copy(update={"drift_since_seconds": since, "candidate": observed,
                                         "stable_since_seconds": now_seconds})
    else:
        state = state.model_copy(update={"drift_since_seconds": since})
    stable_since = state.stable_since_seconds if state.stable_since_seconds is not None \
        else now_seconds
    stable = now_seconds - stable_since
    forced = held >= MAX_DWELL_FACTOR * settings.dwell_seconds
    if stable < settings.dwell_seconds and not forced:
        reason = STILL_SHIFTING if moving and held > 0 else DWELL_PENDING
        return Decision(
            action="wait", reason=reason,
            message=f"{drift.describe()} > threshold {threshold:.3f} for {held:.0f}s; the "
                    f"new traffic held still for {stable:.0f}s of the "
                    f"{settings.dwell_seconds:.0f}s dwell time",
            drift=drift, state=state)
    if state.last_rollout_seconds is not None:
        since_rollout = now_seconds - state.last_rollout_seconds
        if since_rollout < settings.min_interval_seconds:
            return Decision(
                action="wait", reason=MIN_INTERVAL_PENDING,
                message=f"{drift.describe()} > threshold {threshold:.3f} for {held:.0f}s, "
                        f"but the last rollout was {since_rollout:.0f}s ago (minInterval "
                        f"{settings.min_interval_seconds:.0f}s)",
                drift=drift, state=state)
    why_now = (f"the new traffic steady for {stable:.0f}s" if stable >= settings.dwell_seconds
               else f"still shifting, planned for after {held:.0f}s of drift "
                    f"(at most {MAX_DWELL_FACTOR:g} dwell times)")
    return Decision(
        action="replan", reason=REPLAN,
        message=f"{drift.describe()} > threshold {threshold:.3f} for {held:.0f}s, {why_now} "
                f"(dwell {settings.dwell_seconds:.0f}s): planning for the observed traffic",
        drift=drift, state=state)


def plan_change_matters(old: KVPlan | None, new: KVPlan) -> tuple[bool, list[str]]:
    """Whether ``new`` is worth a rollout over ``old``, and the changes that say so (or the
    changes too small to count, prefixed with "noise:"). Each knob's margin is in the knob
    table (``kvtune.tuner.knobs``)."""
    if old is None:
        return True, ["no plan is running"]
    material, noise = knobs.material_changes(old.model_dump(), new.model_dump())
    if material:
        return True, material
    return False, [f"noise: {n}" for n in noise] or ["identical"]
