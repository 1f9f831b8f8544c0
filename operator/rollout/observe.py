"""Stage 5, observe: how far the applied Deployment (or LeaderWorkerSet) got, as the pool's
outcome.

``observe`` ends a reconcile's pool; ``refresh`` follows the rollouts afterwards (the
rollout timer, when a child Deployment moves): it plans and applies nothing, it only
updates Progressing/Ready and the pools' messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtune.operator.api import InferenceDeploymentStatus
from kvtune.operator.api import conditions as cond
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import leader_worker_sets
from kvtune.operator.rollout.apply_stage import Applied
from kvtune.operator.rollout.outcome import PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import Planned


def stuck_message(pool: str, deployment: Mapping[str, Any], reason: str, revision: int) -> str:
    name = deployment.get("metadata", {}).get("name", "?")
    kind = deployment.get("kind") or "Deployment"
    return (f"pool {pool}: {kind} {name} is stuck at plan revision {revision} ({reason}); "
            f"see `kubectl describe pod -l kvtune.io/pool={pool}` and the container's "
            f"termination message (kvtune's runtime refuses a plan that does not fit the GPU); "
            f"fix the cause, or pin a smaller gpuMemoryUtilization/maxNumSeqs")


# Container states that need a person (a wrong image name, a missing pull secret, a bad
# config): waiting out the progress deadline (30 minutes by default) helps nobody.
STUCK_WAITING_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                         "CreateContainerConfigError", "CreateContainerError")


def pod_problem(pods: list[dict[str, Any]]) -> str | None:
    """Why the pool's new pods cannot start, from their status; None when nothing says so.
    (An unschedulable pod is not one: during a rolling update it may wait for an old pod's
    GPUs; a nodeSelector no node matches is refused before anything is applied.)"""
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + \
                (status.get("containerStatuses") or []):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_WAITING_REASONS:
                return (f"pod {name}: {waiting['reason']}: "
                        f"{str(waiting.get('message') or '')[:200]}")
    return None


def rollout_done(server: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the pool's Deployment or LeaderWorkerSet runs its template everywhere, and
    what is left."""
    if server.get("kind") == leader_worker_sets.KIND:
        return leader_worker_sets.rollout_done(server)
    return kapply.rollout_done(server)


def _stuck(kube: kapply.Kube, deployment: Mapping[str, Any]) -> str | None:
    """The Deployment controller's verdict, or, before its deadline, the pods' own (a
    LeaderWorkerSet has no deadline: its pods' only)."""
    if deployment.get("kind") == leader_worker_sets.KIND:
        pods_of = leader_worker_sets.pod_selector(deployment)
        if pods_of is None:
            return None
        namespace = (deployment.get("metadata") or {}).get("namespace", "")
        return pod_problem(kapply.list_pods(kube, namespace, pods_of))
    reason = kapply.rollout_stuck(deployment)
    if reason is not None:
        return reason
    meta = deployment.get("metadata") or {}
    selector = (deployment.get("spec") or {}).get("selector", {}).get("matchLabels") or {}
    status = deployment.get("status") or {}
    if not selector or not _new_pods_exist(meta, status):
        return None
    pods = kapply.list_pods(kube, meta.get("namespace", ""),
                            ",".join(f"{k}={v}" for k, v in sorted(selector.items())))
    return pod_problem(pods)


def _new_pods_exist(meta: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether the Deployment controller has made pods of the current template (until then
    there is no pod to look at: listing the pool's pods, a list over the namespace's pods,
    is skipped, as right after every apply)."""
    return int(status.get("observedGeneration", 0)) >= int(meta.get("generation", 0)) \
        and int(status.get("updatedReplicas", 0)) > 0


def observe(ctx: PoolContext, planned: Planned, applied: Applied) -> PoolOutcome:
    deployment = applied.deployment
    done, progress = rollout_done(deployment)
    stuck = None if done else _stuck(ctx.kube, deployment)
    status = applied.status.model_copy(update={"phase": "Applied", "message": progress})
    if stuck is not None:
        message = stuck_message(ctx.pool.pool_name, deployment, stuck, planned.revision)
        return PoolOutcome(status.model_copy(update={"message": message}),
                           failure=(cond.ROLLOUT_STUCK, message), rolling=progress)
    return PoolOutcome(status, rolling=None if done else progress)


def refresh(previous: InferenceDeploymentStatus, namespace: str, kube: kapply.Kube,
            now: str | None) -> InferenceDeploymentStatus | None:
    """``previous`` with its rollouts' progress read again from the pool Deployments; None
    when this is not for the rollout follower (another failure needs a reconcile, a canary
    is under analysis, a Deployment is missing)."""
    degraded = cond.get_condition(previous.conditions, cond.DEGRADED)
    ready = cond.get_condition(previous.conditions, cond.READY)
    # Only a rollout's own states are refreshed here; any other failure needs a reconcile.
    if previous.mode != "auto" or not previous.pools or (
            degraded and degraded.status == "True" and degraded.reason != cond.ROLLOUT_STUCK):
        return None
    if ready and ready.reason not in (cond.ALL_POOLS_APPLIED, cond.ROLLING_OUT,
                                      cond.ROLLOUT_STUCK):
        return None
    if any(p.phase == "Canary" for p in previous.pools):
        return None  # a canary's analysis needs a reconcile (promote or roll back)
    pools, rolling, stuck = [], [], []
    for pool in previous.pools:
        if pool.phase == "Applied" and pool.deployment:
            # A pool's replicas run as a Deployment or, over nodes, a LeaderWorkerSet of the
            # same name (the status does not say which; the second read is only for those).
            deployment = kapply.read_deployment(kube, namespace, pool.deployment) or \
                leader_worker_sets.read(kube, namespace, pool.deployment)
            if deployment is None:
                return None  # the next reconcile re-creates it
            done, progress = rollout_done(deployment)
            pool = pool.model_copy(update={"message": progress})
            reason = None if done else _stuck(kube, deployment)
            if reason is not None:
                pool = pool.model_copy(update={"message": stuck_message(
                    pool.name, deployment, reason, pool.revision)})
                stuck.append(pool.message)
            if not done:
                rolling.append(f"{pool.name}: {progress}")
        pools.append(pool)
    conditions = list(previous.conditions)
    generation = previous.observed_generation

    def set_c(type_: str, ok: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = cond.set_condition(conditions, type_, ok, reason, message,
                                        generation=generation, now=now)

    # A stuck rollout stays Progressing (it may still recover: the timer keeps looking).
    if stuck:
        set_c(cond.DEGRADED, True, cond.ROLLOUT_STUCK, " | ".join(stuck))
        set_c(cond.PROGRESSING, True, cond.ROLLOUT_STUCK, "; ".join(rolling))
        set_c(cond.READY, False, cond.ROLLOUT_STUCK, " | ".join(stuck))
    else:
        if degraded and degraded.reason == cond.ROLLOUT_STUCK:
            set_c(cond.DEGRADED, False, cond.AS_EXPECTED, "")
        if rolling:
            set_c(cond.PROGRESSING, True, cond.ROLLING_OUT, "; ".join(rolling))
            set_c(cond.READY, False, cond.ROLLING_OUT, "; ".join(rolling))
        else:
            set_c(cond.PROGRESSING, False, cond.ROLLED_OUT, "every pool runs its current plan")
            set_c(cond.READY, True, cond.ALL_POOLS_APPLIED,
                  f"{len(pools)} pool(s) run their plan")
    return previous.model_copy(update={"pools": pools, "conditions": conditions})
