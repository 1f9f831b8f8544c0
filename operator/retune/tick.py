"""The retune timer's tick as typed steps, the planning half (``retune_handlers.retune_once``
runs them in order with the I/O between them):

``TickInputs`` (the spec's settings, the status read, the plans in force) and ``Observed``
(what Prometheus said) -> ``decide_pools`` (pure: each pool's profile and decision, a
``PoolTick``) -> ``replan`` (the pools that drifted planned once, in the operator or by a
search Job) -> ``reconcile_request`` (pure: the one typed request the reconcile seam gets)
-> ``retune_status`` (pure: what status.profile.retune shows)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvtune.operator import api
from kvtune.operator import reconcile as rec
from kvtune.operator.api import ProfileScope, conditions
from kvtune.operator.api.workloads import profile_from_status
from kvtune.operator.calibration import calibration_flow
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import model_calibrations
from kvtune.operator.prometheus.profiling import PoolProfile, ProfileResult, choose_for_pool
from kvtune.operator.prometheus.selectors import SeriesSelector
from kvtune.operator.retune import decide as retune
from kvtune.operator.retune import retune_state
from kvtune.operator.retune.decide import RetuneSettings, RetuneState
from kvtune.operator.retune.retune_state import finite
from kvtune.operator.rollout import plan as plan_stage
from kvtune.operator.rollout import search_job_stage
from kvtune.tuner.plan import KVPlan, PoolPlan
from kvtune.tuner.workload import WorkloadProfile

# Which pool's decision names the tick (status.profile.retune.reason, the Event): the one
# furthest along, so a roll-out or a pending re-plan is never hidden by a quiet pool.
REASON_RANK = {reason: rank for rank, reason in enumerate((
    retune.BELOW_THRESHOLD, retune.PROFILE_UNTRUSTED, retune.DWELL_PENDING,
    retune.STILL_SHIFTING, retune.MIN_INTERVAL_PENDING, retune.REPLAN,
    retune.PLAN_UNCHANGED, retune.PLAN_CHANGED), start=1)}


@dataclass(frozen=True)
class TickInputs:
    """What a tick reads before it asks Prometheus: the spec, its settings, the status."""

    spec: api.InferenceDeploymentSpec
    prom: api.PrometheusSpec
    window_seconds: float
    settings: RetuneSettings
    previous: api.InferenceDeploymentStatus
    plans: Mapping[str, KVPlan]  # the plans in force, by pool
    pool_series: Mapping[str, SeriesSelector | None]
    declared: WorkloadProfile


@dataclass(frozen=True)
class Observed:
    """What Prometheus said: the deployment-wide profile and each pool's own."""

    result: ProfileResult
    own: Mapping[str, ProfileResult]


@dataclass(frozen=True)
class PoolTick:
    """One pool's part of a tick: the profile chosen for it and the decision. Frozen: the
    steps after ``decide_pools`` return new ticks (``replan``, ``with_reconcile_error``)."""

    name: str
    choice: PoolProfile
    observed: WorkloadProfile | None  # the chosen profile, kind as declared
    baseline: WorkloadProfile  # behind the pool's running plan
    baseline_scope: ProfileScope
    selector: str
    decision: retune.Decision
    reason: str
    message: str
    state: RetuneState
    material: bool = False
    # The re-plan on ``observed`` gave the running plan exactly: the observed profile becomes
    # the pool's basis (drift is measured from it from now on) and nothing rolls out.
    adopted: bool = False
    new_plan: PoolPlan | None = None  # planned on ``observed`` when the decision is replan

    def status(self) -> api.RetunePoolStatus:
        drift = self.decision.drift
        return api.RetunePoolStatus(
            name=self.name, scope=self.choice.scope, selector=self.selector,
            requests=self.choice.requests, profile_message=self.choice.message,
            reason=self.reason, message=self.message,
            drift_score=finite(drift.score) if drift else None,
            state=retune_state.state_status(self.state))


def current_plans(status: api.InferenceDeploymentStatus) -> dict[str, KVPlan]:
    out: dict[str, KVPlan] = {}
    for pool in status.pools:
        if pool.plan is not None:
            out[pool.name] = KVPlan.model_validate(pool.plan.model_dump())
    return out


def as_declared(p: WorkloadProfile | None, declared: WorkloadProfile) -> WorkloadProfile | None:
    """Metrics cannot tell the workload's kind or whether requests re-send a conversation;
    those stay as declared, so this plan and any later re-plan from the stored profile
    (which the reconcile seam rebuilds on the declared one) agree."""
    return None if p is None else p.model_copy(update={"kind": declared.kind,
                                                       "multi_turn": declared.multi_turn})


def decide_pools(inp: TickInputs, seen: Observed, now: float) -> list[PoolTick]:
    """Each pool's profile (its own series' when trusted, else the deployment's) and the
    drift decision against the profile behind its running plan. Pure."""
    declared, previous = inp.declared, inp.previous
    wide_baseline = profile_from_status(previous.profile, declared)
    prev_pools = {p.name: p for p in previous.pools}
    ticks: list[PoolTick] = []
    for pool in inp.spec.pools:
        pool_name = pool.pool_name
        choice = choose_for_pool(pool_name, seen.own.get(pool_name), seen.result)
        kept = prev_pools[pool_name].profile if pool_name in prev_pools else None
        kept_observed = kept is not None and kept.source == "prometheus"
        # The profile behind the pool's plan in force: a pool planned on the declared
        # workload stays on it until its own decision re-plans it.
        baseline = profile_from_status(kept, declared) if kept_observed \
            else declared if kept is not None else wide_baseline
        decision = retune.decide(
            now_seconds=now, baseline=baseline, observed=as_declared(choice.profile, declared),
            untrusted_reason=choice.message, state=retune_state.state_from_status(
                previous, pool_name, declared),
            settings=inp.settings)
        series = inp.pool_series[pool_name]
        ticks.append(PoolTick(
            name=pool_name, choice=choice, observed=as_declared(choice.profile, declared),
            baseline=baseline,
            baseline_scope=kept.scope if kept_observed and kept and kept.scope else "deployment",
            selector=series.promql() if series is not None else "",
            decision=decision, reason=decision.reason, message=decision.message,
            state=decision.state))
    return ticks


def replan(kube: kapply.Kube, body: Mapping[str, Any], inp: TickInputs,
           ticks: list[PoolTick], now: float) -> list[PoolTick]:
    """The ticks, with the pools whose decision is replan planned once each (in the
    operator, or by the chart's search Job); each such tick says whether its new plan
    matters."""
    if not any(t.decision.action == "replan" and t.observed is not None for t in ticks):
        return ticks
    spec = inp.spec
    model = plan_stage.resolve_model(spec, body["metadata"]["namespace"], kube)
    # Gated as the last reconcile was (issue 15): a dtype held back for its calibration
    # is no material change.
    kv_policy, kv_evidence = calibration_flow.from_status(spec, inp.previous.kv_quality)
    policy = plan_stage.policy_for(spec).model_copy(update={"kv_quality": kv_policy})
    by_name = {p.pool_name: p for p in spec.pools}
    index = {p.pool_name: i for i, p in enumerate(spec.pools)}
    out: list[PoolTick] = []
    for t in ticks:
        if t.decision.action != "replan" or t.observed is None:
            out.append(t)
            continue
        # The chart's search.mode: the search as a Job (operator/search/search_jobs.py);
        # until it answers the pool is decided on a later tick (its drift still stands).
        by_job = search_job_stage.plan_for_retune(
            kube, body, spec, by_name[t.name], model, t.observed, policy, kv_evidence,
            running=inp.plans.get(t.name), scope=t.choice.scope)
        if isinstance(by_job, str):
            out.append(replace(t, reason=conditions.SEARCH_RUNNING,
                               message=f"{t.decision.message}; {by_job}"))
            continue
        new_plan = by_job if by_job is not None else plan_stage.plan_one_pool(
            spec, by_name[t.name], model, t.observed, policy, kv_evidence,
            running=inp.plans.get(t.name), pool_field=f"spec.pools[{index[t.name]}]",
            scope=t.choice.scope, calibrations=model_calibrations.read_or_none(kube))
        out.append(judge_new_plan(replace(t, new_plan=new_plan), inp.plans.get(t.name),
                                  new_plan.plan, now))
    return out


def judge_new_plan(t: PoolTick, running: KVPlan | None, new: KVPlan, now: float) -> PoolTick:
    """The tick with whether the new plan matters (rolled out), is the running one (its
    profile adopted), or differs only by noise (nothing happens; looked at again after a
    dwell time). Pure."""
    material, why = retune.plan_change_matters(running, new)
    if material:
        return replace(
            t, material=True, reason=retune.PLAN_CHANGED,
            message=f"{t.decision.message}; new plan: {', '.join(why)}",
            state=RetuneState(drift_since_seconds=None, last_rollout_seconds=now))
    if running == new:
        # Without adopting the profile, drift from the old basis would stay above the
        # threshold and the pool would be re-planned every dwell time for ever.
        return replace(
            t, adopted=True, reason=retune.PLAN_UNCHANGED,
            message=(f"{t.decision.message}; the plan for the observed traffic is the "
                     f"running one: the observed profile is now the plan's basis; "
                     f"nothing rolled out"),
            state=RetuneState(drift_since_seconds=None,
                              last_rollout_seconds=t.state.last_rollout_seconds))
    # Look again after another dwell time rather than re-plan every tick. The basis
    # stays: adopting it would re-plan to the noisy plan on a restart.
    return replace(
        t, reason=retune.PLAN_UNCHANGED,
        message=(f"{t.decision.message}; the new plan differs only by noise: "
                 f"{', '.join(why)}; nothing rolled out"),
        state=t.state.model_copy(update={"drift_since_seconds": now,
                                         "stable_since_seconds": now}))


def with_reconcile_error(ticks: list[PoolTick], error: str | None) -> list[PoolTick]:
    """The ticks, each whose plan was to roll out saying the reconcile's permanent error
    (None: unchanged). Pure."""
    if not error:
        return ticks
    return [replace(t, message=f"{t.message}; reconcile: {error}") if t.material else t
            for t in ticks]


def reconcile_request(ticks: list[PoolTick], wide: WorkloadProfile | None,
                      window: str) -> rec.ReconcileRequest | None:
    """The one typed request the reconcile seam gets when a pool's plan changes or its
    profile is adopted; None when nothing is handed on. Pure.

    Every pool is passed: a re-planned pool its observed profile, the others the one behind
    their running plan (so they keep it: a pool that did not drift is not re-planned)."""
    if not any(t.material or t.adopted for t in ticks):
        return None
    return rec.ReconcileRequest(
        profile=wide,
        profiles={t.name: t.observed if (t.material or t.adopted) and t.observed
                  else t.baseline for t in ticks},
        profile_scopes={t.name: t.choice.scope if t.material or t.adopted
                        else t.baseline_scope for t in ticks},
        # The plan stage ran once for each re-planned pool: reconcile applies that plan
        # (an adopted one has the running plan's hash: same revision, no new pods).
        plans={t.name: t.new_plan for t in ticks
               if (t.material or t.adopted) and t.new_plan},
        profile_window=window)


def tick_reason(ticks: list[PoolTick]) -> tuple[str, str]:
    """The tick's reason (the pool furthest along) and its message. Pure."""
    top = max(ticks, key=lambda t: REASON_RANK.get(t.reason, 0))
    message = ticks[0].message if len(ticks) == 1 else " | ".join(
        f"pool {t.name}: {t.message}" for t in ticks)
    return top.reason, message


def retune_status(ticks: list[PoolTick], settings: RetuneSettings, at: str
                  ) -> api.RetuneStatus:
    """What status.profile.retune shows of this tick. Pure."""
    reason, message = tick_reason(ticks)
    drifts = [t.decision.drift.score for t in ticks if t.decision.drift is not None]
    return api.RetuneStatus(
        reason=reason, message=message, at=at,
        drift_score=finite(max(drifts)) if drifts else None,
        drift_threshold=settings.drift_threshold, dwell_seconds=settings.dwell_seconds,
        pools=[t.status() for t in ticks],
    )
