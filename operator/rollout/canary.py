"""Stage 3, canary: a new plan runs on ``rollout.canaryReplicas`` replicas first.

In: ``Planned`` and ``Rendered``. Out: ``CanaryResult`` when the pool goes on to be applied
(no canary needed, or the canary passed and is promoted), or the pool's outcome when it
stops here: a canary started or still under analysis, rolled back, or a plan rejected
before. The decision itself is ``operator/canary.py`` (pure).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.operator import apply as kapply
from kvtune.operator import canary as canary_policy
from kvtune.operator import conditions as cond
from kvtune.operator.api import CanaryStatus, RolloutSpec
from kvtune.operator.durations import parse_duration
from kvtune.operator.render import object_name
from kvtune.operator.rollout.outcome import Event, PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import Planned
from kvtune.operator.rollout.render import Rendered


@dataclass(frozen=True)
class CanaryResult:
    action: canary_policy.Action  # "plain" or "promote"
    message: str
    name: str  # the canary Deployment's name
    had_canary: bool  # a canary ran (it is deleted once the pool is applied)


def canary(ctx: PoolContext, planned: Planned, rendered: Rendered) -> CanaryResult | PoolOutcome:
    pool, revision, hash_ = ctx.pool, planned.revision, planned.plan_hash
    rollout = ctx.spec.rollout or RolloutSpec()
    name = object_name(ctx.name, f"{pool.pool_name}-canary")
    prev_canary = ctx.base.canary
    canary_dep = kapply.read_deployment(ctx.kube, ctx.namespace, name) if prev_canary else None
    decision = canary_policy.decide(
        canary_replicas=rollout.canary_replicas, replicas=pool.replicas,
        running_hash=rendered.running_hash, new_hash=hash_,
        canary_hash=prev_canary.plan_hash if prev_canary else None,
        canary_started_at=prev_canary.started_at if prev_canary else None,
        rejected_hash=ctx.base.rejected_plan_hash, canary_deployment=canary_dep, now=ctx.now,
        analysis_seconds=parse_duration(rollout.analysis, field="spec.rollout.analysis"),
        deadline_seconds=rollout.progress_deadline_seconds(),
    )
    old_plan = f"{pool.replicas} replica(s) keep the previous plan"
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

