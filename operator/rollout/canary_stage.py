"""Stage 3, canary: a new plan runs on ``rollout.canaryReplicas`` replicas first.

In: ``Planned`` and ``Rendered``. Out: ``CanaryResult`` when the pool goes on to be applied
(no canary needed, or the canary passed and is promoted), or the pool's outcome when it
stops here: a canary started or still under analysis, rolled back, or a plan rejected
before. The decision itself is ``operator/rollout/canary_objects.py`` (pure); when it asks for an
analysis,
the canary's and the stable revision's live figures are read from Prometheus
(``operator/rollout/canary_metrics.py``) and judged (``operator/rollout/canary_analysis.py``), and
the verdict
with both revisions' figures goes to ``status.pools[].canary.analysis`` and the Events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvtune.operator.api import (
    CanaryAnalysisStatus,
    CanaryStatus,
    RevisionFiguresStatus,
    RolloutSpec,
)
from kvtune.operator.api import conditions as cond
from kvtune.operator.api.durations import parse_duration
from kvtune.operator.kube import apply as kapply
from kvtune.operator.prometheus import prom_http, selectors, slo_buckets
from kvtune.operator.prometheus import prom_replies as replies
from kvtune.operator.prometheus.profiling import access_from_env
from kvtune.operator.render.objects import object_name
from kvtune.operator.rollout import canary_metrics
from kvtune.operator.rollout import canary_objects as canary_policy
from kvtune.operator.rollout.canary_analysis import (
    AnalysisSettings,
    CanaryAnalysis,
    RevisionFigures,
    analyse,
)
from kvtune.operator.rollout.outcome import Event, PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import Planned
from kvtune.operator.rollout.render_stage import Rendered


@dataclass(frozen=True)
class CanaryResult:
    action: canary_policy.Action  # "plain" or "promote"
    message: str
    name: str  # the canary Deployment's name
    had_canary: bool  # a canary ran (it is deleted once the pool is applied)


def canary(ctx: PoolContext, planned: Planned, rendered: Rendered) -> CanaryResult | PoolOutcome:
    pool, revision, hash_ = ctx.pool, planned.revision, planned.plan_hash
    # The replicas the pool runs: under tensorParallel auto those the plan chose
    # (plan.rendered_replicas), which can be fewer than the spec's bound, pool.replicas.
    replicas = planned.render_input.replicas
    rollout = ctx.spec.rollout or RolloutSpec()
    name = object_name(ctx.name, f"{pool.pool_name}-canary")
    prev_canary = ctx.base.canary
    canary_dep = kapply.read_deployment(ctx.kube, ctx.namespace, name) if prev_canary else None
    analysis_seconds = parse_duration(rollout.analysis, field="spec.rollout.analysis")
    series = _track_series(ctx)

    def decide(analysis: CanaryAnalysis | None) -> canary_policy.Decision:
        return canary_policy.decide(
            canary_replicas=rollout.canary_replicas, replicas=replicas,
            running_hash=rendered.running_hash, new_hash=hash_,
            canary_hash=prev_canary.plan_hash if prev_canary else None,
            canary_started_at=prev_canary.started_at if prev_canary else None,
            rejected_hash=ctx.base.rejected_plan_hash, canary_deployment=canary_dep,
            now=ctx.now, analysis_seconds=analysis_seconds,
            deadline_seconds=rollout.progress_deadline_seconds(), live=series is not None,
            analysis=analysis, on_inconclusive=rollout.on_inconclusive)

    decision = decide(None)
    if pool.nodes_per_replica > 1 and decision.action != "plain":
        return ctx.failed(cond.MULTI_NODE_CANARY_UNSUPPORTED, (
            f"spec.rollout.canaryReplicas={rollout.canary_replicas}: pool {pool.pool_name} "
            f"spans nodes ({ctx.field}.nodesPerReplica={pool.nodes_per_replica}) and kvtune "
            f"runs no canary of a LeaderWorkerSet; plan revision {revision} is not rolled "
            f"out and the pool keeps its previous plan; set spec.rollout.canaryReplicas: 0 "
            f"to roll it out one group at a time (docs/multi-node.md)"))
    analysis_status: CanaryAnalysisStatus | None = None
    if decision.action == "analyse" and series is not None:
        analysis = _analyse(ctx, series, rollout, analysis_seconds)
        analysis_status = _analysis_status(analysis, ctx.now)
        decision = decide(analysis)
    old_plan = f"{replicas} replica(s) keep the previous plan"
    if decision.action == "rejected":
        return ctx.failed(cond.CANARY_FAILED, f"pool {pool.pool_name}: plan revision "
                          f"{revision} failed its canary before; the pool keeps its previous "
                          f"plan. Change the spec, pins or workload to get another plan")
    if decision.action == "rollback":
        try:
            kapply.delete_deployment(ctx.kube, ctx.namespace, name, ctx.body)
        except kapply.NameCollision as exc:
            return ctx.apply_failed(exc, f"pool {pool.pool_name}: {exc}")
        message = (f"pool {pool.pool_name}: plan revision {revision} rolled back: "
                   f"{decision.message}; {old_plan}")
        ctx.events.append(Event("Warning", "CanaryRolledBack", message))
        return ctx.failed(cond.CANARY_FAILED, message, ctx.base.model_copy(
            update={"rejected_plan_hash": hash_, "canary": None}))
    if decision.action in ("start", "wait"):
        canary_status = prev_canary
        if canary_status is not None and analysis_status is not None:
            canary_status = canary_status.model_copy(update={"analysis": analysis_status})
        if decision.action == "start":
            try:
                kapply.apply_pool(ctx.kube, [canary_policy.canary_objects(
                    rendered.objects, name=name, replicas=rollout.canary_replicas)], ctx.body)
            except kapply.ApplyError as exc:
                return ctx.apply_failed(exc, f"pool {pool.pool_name} canary: {exc}")
            canary_status = CanaryStatus(plan_hash=hash_, revision=revision, started_at=ctx.now,
                                         deployment=name)
            ctx.events.append(Event("Normal", "CanaryStarted", f"Deployment {name} runs plan "
                                    f"revision {revision} on {rollout.canary_replicas} "
                                    f"replica(s) for a {rollout.analysis} analysis"))
        message = f"{decision.message}; {old_plan}"
        return PoolOutcome(rendered.status.model_copy(update={
            "phase": "Canary", "message": message, "canary": canary_status}), rolling=message)
    return CanaryResult(action=decision.action, message=decision.message, name=name,
                        had_canary=prev_canary is not None)



def _track_series(ctx: PoolContext) -> tuple[selectors.SeriesSelector,
                                             selectors.SeriesSelector] | None:
    """(stable, canary) series of this pool, or None when nothing can judge the canary live."""
    prom = ctx.spec.tuning.prometheus
    if prom is None:
        return None
    return selectors.track_selectors(prom, namespace=ctx.namespace, deployment=ctx.name,
                                     pool=ctx.pool.pool_name)


def _analyse(ctx: PoolContext, series: tuple[selectors.SeriesSelector,
                                             selectors.SeriesSelector],
             rollout: RolloutSpec, window_seconds: float) -> CanaryAnalysis:
    """Both revisions' figures over the analysis window, judged; Prometheus down or answering
    garbage is no verdict (inconclusive), never a promotion by default."""
    prom = ctx.spec.tuning.prometheus
    assert prom is not None
    slo = ctx.spec.slo
    ttft = slo.ttft_p95_seconds() if slo else None
    tpot = slo.tpot_p95_seconds() if slo else None
    # Both revisions' pods were rendered with the SLO buckets unless a user's pod template
    # may have dropped the arguments (slo_buckets.rendered_for).
    rendered = slo_buckets.rendered_for((ttft or tpot) is not None,
                                        ctx.spec.runtime.pod_template is not None)
    settings = AnalysisSettings(
        min_requests=rollout.min_requests,
        ttft_bound_seconds=canary_metrics.ttft_bound(ttft, rendered),
        tpot_bound_seconds=canary_metrics.tpot_bound(tpot, rendered),
        ttft_slo_seconds=ttft, tpot_slo_seconds=tpot)
    at = time.time()
    try:
        access = access_from_env()

        def query(name: str, promql: str) -> float | None:
            data = prom_http.query(prom.url, promql, at_unix_seconds=at, access=access,
                                   name=f"canary {name}")
            return replies.scalar(replies.vector(data, name), name)

        stable, canary_figures, settings = canary_metrics.read_judgeable(
            query, series[0], series[1], window_seconds, settings)
    except prom_http.PrometheusUnavailable as exc:
        nothing = RevisionFigures(requests=0)
        return CanaryAnalysis(verdict="inconclusive", reason="PrometheusUnavailable",
                              message=f"live metrics unavailable: {exc}", stable=nothing,
                              canary=nothing)
    return analyse(stable, canary_figures, settings)


def _analysis_status(analysis: CanaryAnalysis, now: str) -> CanaryAnalysisStatus:
    return CanaryAnalysisStatus(
        verdict=analysis.verdict, reason=analysis.reason, message=analysis.message, at=now,
        stable=RevisionFiguresStatus(**analysis.stable.model_dump()),
        canary=RevisionFiguresStatus(**analysis.canary.model_dump()))
