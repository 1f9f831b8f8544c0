"""The pool's KV tier kind (issue 27): with ``spec.tuning.kvTiers`` the searched plan's tier
beyond the GPU is chosen among none, vLLM's native CPU tier, LMCache's CPU tier (both at
``cpuOffloadGiB``, or the size the search chose) and the disk and remote tiers the spec
allows, by capacity at SLO on the search's own stream, then the cheaper within the tie at the
chart's ``hostMemoryPriceUsdPerGiBHour``: the same step as ``kvtune plan --kv-tier-*``
(``tuner/simulator/tier_choice.choose``). Without ``kvTiers`` nothing changes (the native
tier at the policy's budget, as before), so plans of specs without it stay as they were."""

from __future__ import annotations

import dataclasses

from kvtune.operator.api import InferenceDeploymentSpec, KVTiersSpec, PoolSpec
from kvtune.operator.search import reuse_summary
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.simulator.workload import SimRequest

FIELD = "spec.tuning.kvTiers"
TIER_KNOB = "kv-tier"  # the reason tier_choice.explain writes


def allowed(spec: InferenceDeploymentSpec) -> KVTiersSpec | None:
    """The spec's tier allowance when it allows a disk or a remote tier."""
    tiers = spec.tuning.kv_tiers
    if tiers is None or (tiers.disk_gib is None and tiers.remote_url is None):
        return None
    return tiers


def _not_weighed(pool: PoolSpec, pool_plan: PoolPlan) -> str | None:
    # The tier replay runs one engine of a plain TP replica, as the CLI's (which refuses
    # --dp/--ep/--replicas with tier options).
    if pool_plan.layout is not None or pool.data_parallel != 1 or pool.expert_parallel \
            or pool.pipeline_parallel != 1:
        return (f"{FIELD}: the disk and remote tiers are weighed for one plain TP replica; "
                f"pool {pool.pool_name} (DP/EP/PP) keeps the native CPU tier "
                "(drop dataParallel, expertParallel, pipelineParallel to weigh them)")
    return None


def with_tiers(spec: InferenceDeploymentSpec, pool: PoolSpec, request: PlanRequest,
               pool_plan: PoolPlan, replicas: int,
               stream: tuple[SimRequest, ...] | None = None) -> PoolPlan:
    """``pool_plan`` with the tier kind that pays (unchanged without ``kvTiers``).
    ``replicas``: how many replicas share the rate; the stream (the search's traffic from
    the profile unless given) is stretched as the search's (``goodput_search.
    plan_by_goodput``), so each kind is weighed on one replica's share."""
    tiers = allowed(spec)
    if tiers is None:
        return pool_plan
    why_not = _not_weighed(pool, pool_plan)
    if why_not is not None:
        return pool_plan.model_copy(update={"warnings": (*pool_plan.warnings, why_not)})
    from kvtune.tuner.simulator import tier_choice
    from kvtune.tuner.simulator.goodput_search import traffic

    stream = traffic(request) if stream is None else stream
    if replicas > 1:
        stream = tuple(dataclasses.replace(r, arrival_seconds=r.arrival_seconds * replicas)
                       for r in stream)
    allowance = tier_choice.TierAllowance(disk_gib=tiers.disk_gib, remote_url=tiers.remote_url,
                                          remote_gib=tiers.remote_size_gib())
    # The chart prices host memory only; without a disk price a disk tier's GiB rank after
    # host memory (tier_choice.TierPrices).
    prices = tier_choice.TierPrices(host_usd_per_gib_hour=reuse_summary.CONFIG.usd_per_gib_hour)
    return tier_choice.choose(pool_plan, request, stream, allowance, prices)


def said(spec: InferenceDeploymentSpec, pool: PoolSpec, pool_plan: PoolPlan) -> PoolPlan:
    """``pool_plan`` with a warning when the spec allows tiers the plan did not weigh (a plan
    by the rules, by a search Job, under tensorParallel auto or gpusPerReplica, or of a
    prefill/decode pair): the allowance is never dropped in silence."""
    if allowed(spec) is None or any(r.knob == TIER_KNOB for r in pool_plan.reasons) \
            or any(w.startswith(FIELD) for w in pool_plan.warnings):
        return pool_plan
    why = (f"{FIELD}: the disk and remote tiers were not weighed for pool {pool.pool_name}; "
           "they are weighed by the in-process capacity search (search.mode inProcess) of a "
           "plain TP pool with an arrival rate (spec.workload.requestRatePerSecond or "
           "Prometheus); the pool keeps the native CPU tier")
    return pool_plan.model_copy(update={"warnings": (*pool_plan.warnings, why)})


__all__ = ["FIELD", "TIER_KNOB", "allowed", "said", "with_tiers"]
