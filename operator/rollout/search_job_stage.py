"""The plan stage's search by Job (the chart's ``search.mode``; ``operator/search/search_jobs.py``).

``plan_by_job`` answers None when this pool is planned in the operator as before (no search,
or mode ``inProcess``, or ``auto`` within the budget); else the plan the Job found (priced as
an in-process result is), or the pool's outcome while the Job runs (``SearchRunning``: the
pool keeps what it runs, reconcile looks again in a few seconds) or after it failed or
answered with an error (the same conditions as in-process: SearchBudgetSpent,
NoFeasiblePlan, InvalidSpec; a failed Job: SearchJobFailed, with the cause and the fix).
"""

from __future__ import annotations

import logging
from typing import Any

from kvtune.operator.api import InferenceDeploymentSpec, PoolSpec, ProfileScope, ProfileStatus
from kvtune.operator.api import conditions as cond
from kvtune.operator.kube import apply as kapply
from kvtune.operator.rollout.outcome import PoolContext, PoolOutcome
from kvtune.operator.search import gpu_prices, search_job_flow, search_jobs
from kvtune.tuner.kv_quality import KVQualityEvidence
from kvtune.tuner.plan import KVPlan, PoolPlan
from kvtune.tuner.planner.policy import PlanPolicy
from kvtune.tuner.simulator.search_job import SearchInput, SearchOutcome
from kvtune.tuner.workload import WorkloadProfile

LOG = logging.getLogger("kvtune.operator")

_ERROR_REASONS = {"SearchBudgetSpent": cond.SEARCH_BUDGET_SPENT,
                  "NoFeasiblePlan": cond.NO_FEASIBLE_PLAN, "InvalidSpec": cond.INVALID_SPEC,
                  "ResultTooLarge": cond.SEARCH_JOB_FAILED, "BadInput": cond.SEARCH_JOB_FAILED}


def _document(spec: InferenceDeploymentSpec, pool: PoolSpec, model: Any,
              profile: WorkloadProfile, policy: PlanPolicy,
              evidence: KVQualityEvidence | None, running: KVPlan | None, scope: ProfileScope
              ) -> tuple[search_jobs.JobSettings, SearchInput] | None:
    """The search document when this pool's search goes to a Job (else None)."""
    from kvtune.operator.rollout import plan as plan_stage

    settings = search_jobs.settings()
    # tensorParallel auto searches every degree and chooses among them (plan_stage._plan_auto),
    # gpusPerReplica every layout (plan_stage._plan_layout): one Job per pool answers one
    # request, so those pools stay in the operator for now.
    if settings.mode == "inProcess" or not plan_stage.searched(profile) or pool.tp_auto \
            or pool.gpus_per_replica is not None:
        return None
    request = plan_stage.plan_request(spec, pool, model, profile, policy, evidence)
    # Engines sharing the rate: each DP rank of a replica takes a share (as in-process).
    replicas = plan_stage.sharing_replicas(spec, pool, scope) * request.data_parallel
    rate = (profile.request_rate_per_second or 0.0) / replicas
    if not search_job_flow.wanted(settings, request, len(spec.pools), rate):
        return None
    return settings, search_job_flow.search_input(request, running, replicas)


def plan_by_job(ctx: PoolContext, model: Any, profile: WorkloadProfile, policy: PlanPolicy,
                evidence: KVQualityEvidence | None, profile_used: ProfileStatus | None
                ) -> PoolPlan | PoolOutcome | None:
    from kvtune.operator.rollout import plan as plan_stage

    pool = ctx.pool
    if pool.role is not None:
        return None  # a prefill/decode pair is planned by the rules (rollout/role_plan.py)
    scope = (profile_used.scope or "deployment") if profile_used is not None else "deployment"
    found = _document(ctx.spec, pool, model, profile, policy, evidence,
                      plan_stage.running_plan(ctx.base), scope)
    if found is None:
        return None
    settings, doc = found
    where = f"{ctx.field} ({pool.gpu_class})"
    try:
        got = search_job_flow.by_job(ctx.kube, ctx.body, pool.pool_name, doc, settings)
    except kapply.ApplyError as exc:
        return ctx.apply_failed(exc, f"{where}: the search Job: {exc} (the chart grants Jobs "
                                "with search.mode job or auto; or set search.mode: inProcess)")
    if isinstance(got, search_job_flow.Waiting):
        return _running(ctx, got, doc.digest())
    if isinstance(got, search_job_flow.JobFailed):
        message = (f"{where}: the search Job {got.job} failed ({got.message}); fix: "
                   f"{search_jobs.fix_for(got.message)}; a new Job is tried once it is "
                   "deleted (search.job.ttlSecondsAfterFinished)")
        return ctx.failed(cond.SEARCH_JOB_FAILED, message)
    return _answered(ctx, got, where)


def _answered(ctx: PoolContext, outcome: SearchOutcome, where: str) -> PoolPlan | PoolOutcome:
    if outcome.error is not None:
        reason = _ERROR_REASONS.get(outcome.error.kind, cond.SEARCH_JOB_FAILED)
        return ctx.failed(reason, f"{where}: {outcome.error.message}")
    assert outcome.plan is not None  # an outcome is a plan or an error
    from kvtune.tuner.planner.cost import priced
    from kvtune.tuner.planner.layout_replica import per_replica

    # The Job replays one engine; a pinned dataParallel's replica is DP of them.
    return priced(per_replica(outcome.plan), gpu_prices.price_of(ctx.pool, ctx.field))


def _running(ctx: PoolContext, waiting: search_job_flow.Waiting, digest: str) -> PoolOutcome:
    pool = ctx.pool
    if waiting.started:
        LOG.info("%s (%s): capacity search started as Job %s", ctx.field, pool.gpu_class,
                 waiting.job)
    since = f" since {waiting.since}" if waiting.since else ""
    message = (f"the capacity search runs as Job {waiting.job}{since} (inputs "
               f"{digest[:12]}; kubectl -n {ctx.namespace} logs job/{waiting.job}); "
               + ("the pool keeps its plan in force meanwhile" if ctx.base.plan is not None
                  else "the pool is planned when it answers"))
    status = ctx.base.model_copy(update={"phase": "Searching", "message": message})
    return PoolOutcome(status, searching=message, retry_after=search_jobs.POLL_SECONDS)


def plan_for_retune(kube: kapply.Kube, body: Any, spec: InferenceDeploymentSpec,
                    pool: PoolSpec, model: Any, profile: WorkloadProfile, policy: PlanPolicy,
                    evidence: KVQualityEvidence | None, running: KVPlan | None,
                    scope: ProfileScope) -> PoolPlan | str | None:
    """The retune timer's re-plan of a drifted pool by Job: the plan (priced), or why there
    is none on this tick (the Job runs, failed, or answered with an error: the timer decides
    on a later tick, the pool's drift still standing), or None: search in the operator."""
    found = _document(spec, pool, model, profile, policy, evidence, running, scope)
    if found is None:
        return None
    settings, doc = found
    try:
        got = search_job_flow.by_job(kube, body, pool.pool_name, doc, settings)
    except kapply.ApplyError as exc:
        return f"the search Job: {exc}"
    if isinstance(got, search_job_flow.Waiting):
        return f"the capacity search for the observed traffic runs as Job {got.job}"
    if isinstance(got, search_job_flow.JobFailed):
        return f"the search Job {got.job} failed ({got.message})"
    if got.error is not None:
        return f"the search Job answered {got.error.kind}: {got.error.message}"
    assert got.plan is not None
    from kvtune.tuner.planner.cost import priced
    from kvtune.tuner.planner.layout_replica import per_replica

    return priced(per_replica(got.plan), gpu_prices.price_of(pool, "spec.pools[]"))
