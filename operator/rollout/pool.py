"""One pool's rollout: the stages in order; each either hands on its output or ends it.

Between render and apply, the KV-quality gate (``operator/calibration/calibration_flow.py``) may
start a
calibration Job for a narrower KV dtype and plan the pool again with the wider one held."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtune.operator.calibration import calibration_flow
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import pools as gpu_pools
from kvtune.operator.render import leader_worker_set as lws
from kvtune.operator.render.objects import model_server
from kvtune.operator.rollout.apply_stage import apply, apply_access
from kvtune.operator.rollout.canary_stage import canary
from kvtune.operator.rollout.observe import observe
from kvtune.operator.rollout.outcome import Event, PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import PlanInput, plan
from kvtune.operator.rollout.render_stage import render


def rollout_pool(ctx: PoolContext, inp: PlanInput,
                 discovered: Mapping[str, gpu_pools.GPUPool]) -> PoolOutcome:
    events_before = len(ctx.events)
    planned = plan(ctx, inp)
    if isinstance(planned, PoolOutcome):
        return planned
    rendered = render(ctx, planned, discovered)
    if isinstance(rendered, PoolOutcome):
        return rendered
    gate = inp.gate
    if gate is not None and not gate.hold:
        # A narrower KV dtype no measurement covers: measure it first (a Job on this pool's
        # nodes, as this pool's pod), and plan the pool again with the wider dtype held.
        deployment = _calibration_view(model_server(rendered.objects))
        jobs_before = len(gate.started_jobs)
        try:
            started = calibration_flow.maybe_start(ctx.kube, ctx.body, ctx.spec, gate,
                                                   planned.pool_plan, deployment,
                                                   pool_name=ctx.pool.pool_name)
        except kapply.ApplyError as exc:
            return ctx.apply_failed(exc, f"pool {ctx.pool.pool_name}: the KV-quality "
                                    f"calibration Job: {exc}")
        if started:
            # The pool is planned again below: what this pass said of its plan (PlanChanged
            # for the narrower dtype) is not what rolls out, and the second pass says it.
            del ctx.events[events_before:]
        if started and len(gate.started_jobs) > jobs_before:
            ctx.events.append(Event("Normal", "CalibrationStarted", f"pool "
                                    f"{ctx.pool.pool_name}: Job {gate.started_jobs[-1]} "
                                    f"measures {planned.pool_plan.plan.kv_cache_dtype} before "
                                    f"it rolls out"))
        elif started and gate.notes and gate.unverified:
            # No Job can run here: the wider dtype is held, and the user told why (once: a
            # later reconcile holds from status while the cause stands, and plans nothing
            # narrower to be held again).
            ctx.events.append(Event("Warning", "CalibrationUnavailable", f"pool "
                                    f"{ctx.pool.pool_name}: "
                                    f"{planned.pool_plan.plan.kv_cache_dtype} is not rolled "
                                    f"out unmeasured: {gate.notes[-1]}"))
        if started:
            return rollout_pool(ctx, inp, discovered)
    refused = apply_access(ctx, rendered)
    if refused is not None:
        return refused
    passed = canary(ctx, planned, rendered)
    if isinstance(passed, PoolOutcome):
        return passed
    applied = apply(ctx, planned, rendered, passed)
    if isinstance(applied, PoolOutcome):
        return applied
    return observe(ctx, planned, applied)



def _calibration_view(server: dict[str, Any]) -> dict[str, Any]:
    """What the calibration Job is made from: the Deployment, or a LeaderWorkerSet's leader
    pod in a Deployment's shape (the Job runs one pod: it measures a model that one node of
    the pool holds; docs/multi-node.md)."""
    if server.get("kind") != lws.KIND:
        return server
    leader = server["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    return {"metadata": server["metadata"], "spec": {"replicas": 1, "template": leader}}
