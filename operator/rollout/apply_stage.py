"""Stage 4, apply: server-side apply of the pool's objects, all or nothing (``apply_pool``).

``apply_access`` applies the runtime's ServiceAccount, Role and RoleBinding one by one
before the canary (its pods run as that account, and a RoleBinding's dry run needs its Role
to exist). ``apply`` applies the Deployment (or, when a replica spans nodes, the
LeaderWorkerSet), Service and PDB, retires a canary that ran and the object of the other kind
when the pool moved onto or off several nodes. Out: ``Applied`` (the Deployment or
LeaderWorkerSet as the server holds it), or a failed outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtune.operator.api import PoolRoutingStatus, PoolStatus
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import leader_worker_sets
from kvtune.operator.render.objects import model_server, object_name
from kvtune.operator.rollout.canary_stage import CanaryResult
from kvtune.operator.rollout.outcome import Event, PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import Planned
from kvtune.operator.rollout.render_stage import Rendered
from kvtune.operator.routing import http_route
from kvtune.operator.routing import inference_pool as routing


@dataclass(frozen=True)
class Applied:
    deployment: dict[str, Any]  # as the API server holds it after the apply
    status: PoolStatus  # the planned pool, no canary


def apply_access(ctx: PoolContext, rendered: Rendered) -> PoolOutcome | None:
    """None when the runtime's access objects (if any) are in place."""
    try:
        kapply.apply_each(ctx.kube, rendered.access, ctx.body)
    except kapply.ApplyError as exc:
        return ctx.apply_failed(exc, f"pool {ctx.pool.pool_name}: the runtime's access "
                                f"(spec.runtime.entrypoint=kvtune): {exc}")
    return None


def apply(ctx: PoolContext, planned: Planned, rendered: Rendered,
          canary: CanaryResult) -> Applied | PoolOutcome:
    pool = ctx.pool
    name, kind = object_name(ctx.name, pool.pool_name), rendered.model_server_kind
    try:
        applied = kapply.apply_pool(ctx.kube, rendered.objects, ctx.body, absent=[
            (kind, name)] if rendered.deployment_absent else [])
    except kapply.ApplyError as exc:
        return ctx.apply_failed(exc, f"pool {pool.pool_name}: {exc}; nothing was changed")
    if rendered.deployment_absent and ctx.base.plan_hash is not None:
        # The pool ran before (it has a plan hash) but not as this kind: it may have moved
        # onto or off several nodes. A new pool has nothing to retire and reads nothing here.
        switched = _retire_other_kind(ctx, kind, name)
        if switched is not None:
            return switched
    if canary.had_canary:
        try:
            kapply.delete_deployment(ctx.kube, ctx.namespace, canary.name, ctx.body)
        except kapply.NameCollision as exc:
            return ctx.apply_failed(exc, f"pool {pool.pool_name}: {exc}")
        if canary.action == "promote":
            ctx.events.append(Event("Normal", "CanaryPromoted", f"pool {pool.pool_name}: plan "
                                    f"revision {planned.revision} promoted: {canary.message}"))
    if rendered.running_hash != planned.plan_hash:
        ctx.events.append(Event("Normal", "RolloutStarted", f"{kind} {name} rolls out plan "
                                f"revision {planned.revision}"))
    deployment = model_server(applied)
    return Applied(deployment=deployment, status=rendered.status.model_copy(update={
        "canary": None, "routing": routed(ctx, planned, rendered)}))


def _retire_other_kind(ctx: PoolContext, kind: str, name: str) -> PoolOutcome | None:
    """A pool whose replicas moved onto or off several nodes (spec.pools[].nodesPerReplica):
    the object of the other kind that ran them is kvtune's to delete now that the new one is
    applied (read only when the new kind's object was absent from a pool that ran before)."""
    try:
        if kind == leader_worker_sets.KIND:
            gone = kapply.delete_deployment(ctx.kube, ctx.namespace, name, ctx.body)
            other = "Deployment"
        else:
            gone = leader_worker_sets.delete_ours(ctx.kube, ctx.namespace, name, ctx.body)
            other = leader_worker_sets.KIND
    except kapply.NameCollision as exc:
        return ctx.apply_failed(exc, f"pool {ctx.pool.pool_name}: {exc}")
    if gone:
        ctx.events.append(Event("Normal", "PoolReshaped", f"deleted {other} {name}: pool "
                                f"{ctx.pool.pool_name} now runs as a {kind} "
                                f"(nodesPerReplica={ctx.pool.nodes_per_replica})"))
    return None


def routed(ctx: PoolContext, planned: Planned, rendered: Rendered) -> PoolRoutingStatus | None:
    """The pool's routing as just applied with its main Deployment: the plan's max-model-len
    (what the HTTPRoute's length rules use until the next plan is applied here, canary or
    not); the picker's availability as last read (the routing status refresh reads it)."""
    if not any(o["kind"] == "InferencePool" for o in rendered.objects):
        return None
    picker = routing.epp_name(ctx.name, ctx.pool.pool_name)
    before = rendered.status.routing
    available = before.endpoint_picker_available if before is not None \
        and before.endpoint_picker == picker else None
    return PoolRoutingStatus(max_model_len=planned.pool_plan.plan.max_model_len,
                             capacity_requests_per_second_per_replica=http_route.capacity_of(
                                 planned.pool_plan),
                             endpoint_picker=picker, endpoint_picker_available=available,
                             message=before.message if available is not None and before else "")
