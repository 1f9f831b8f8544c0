"""A pool's capacity search run as a Job, within one reconcile: the I/O around ``search_jobs``.

``by_job`` is what the plan stage calls instead of searching in its own thread. It never
waits: it answers the search's outcome (kept in memory by digest, else in the pool's search
ConfigMap, else read from the finished Job, kept, and the Job deleted), or ``Waiting`` (a Job
was started, or runs: the reconcile looks again in ``POLL_SECONDS``), or ``JobFailed`` (after
its retries: the Job stays, so the failure is said once and not re-run in a loop, until its
``ttlSecondsAfterFinished`` removes it; then a new Job is tried). Starting a Job for new
inputs deletes the pool's Jobs and ConfigMaps of other inputs first (a stale answer is never
read: every read is by the current digest).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvtune.operator.api.names import LABEL_DEPLOYMENT, LABEL_POOL
from kvtune.operator.calibration.calibration_job import owned_by
from kvtune.operator.kube import apply as kapply
from kvtune.operator.search import search_budget, search_jobs
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_budget import MAX_STREAM_REQUESTS
from kvtune.tuner.simulator.search_job import SearchInput, SearchOutcome

# Answers kept in memory, by digest (a few kB each): most reconciles read none from the API.
_CACHE_SIZE = 128
_answers: OrderedDict[str, SearchOutcome] = OrderedDict()


@dataclass(frozen=True)
class Waiting:
    job: str
    started: bool  # True: this reconcile created it
    since: str | None = None  # the Job's startTime


@dataclass(frozen=True)
class JobFailed:
    job: str
    message: str


def search_input(request: PlanRequest, running: KVPlan | None, replicas: int) -> SearchInput:
    """The document of the search the operator would run in-process now (its budget)."""
    cfg = search_budget.CONFIG
    return SearchInput(request=request, running=running, replicas=replicas,
                       cpu_seconds=cfg.cpu_seconds, memory_bytes=cfg.memory_bytes,
                       stream_requests=MAX_STREAM_REQUESTS)


def wanted(s: search_jobs.JobSettings, request: PlanRequest, pools: int,
           rate_per_replica: float) -> bool:
    """Whether this pool's search goes to a Job (``search_jobs.use_job``)."""
    if s.mode != "auto":
        return s.mode == "job"
    from kvtune.tuner.planner.search import grid

    candidates = len(grid(request, rate_per_replica))
    return search_jobs.use_job(s, pools=pools, candidates=candidates,
                               cpu_seconds=search_budget.CONFIG.cpu_seconds)


def _remember(digest: str, outcome: SearchOutcome) -> SearchOutcome:
    _answers[digest] = outcome
    _answers.move_to_end(digest)
    while len(_answers) > _CACHE_SIZE:
        _answers.popitem(last=False)
    return outcome


def _read(kube: kapply.Kube, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.request("GET", kapply.path(kind, namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def by_job(kube: kapply.Kube, body: Mapping[str, Any], pool: str, doc: SearchInput,
           s: search_jobs.JobSettings) -> SearchOutcome | Waiting | JobFailed:
    """The outcome of ``doc``'s search by Job (module doc). ``ApplyError`` when the API
    server refuses the ConfigMap or the Job (``Forbidden``: the chart did not grant Jobs)."""
    digest = doc.digest()
    if digest in _answers:
        _answers.move_to_end(digest)
        return _answers[digest]
    meta = body["metadata"]
    namespace, owner, uid = meta["namespace"], meta["name"], meta.get("uid")
    name = search_jobs.resource_name(owner, pool, digest)
    config_map = _read(kube, "ConfigMap", namespace, name)
    stored = search_jobs.stored_result(config_map, uid, digest)
    if stored is not None:
        return _remember(digest, stored)
    labels = search_jobs.labels(owner, pool, digest)
    inputs = search_jobs.input_config_map(name=name, namespace=namespace, doc=doc,
                                          labels=labels)
    job = _read(kube, "Job", namespace, name)
    if job is None or owned_by(job, uid) is None:
        # A Job of that name not ours: apply_owned refuses it (NameCollision).
        delete_stale(kube, body, pool, keep=digest)
        kapply.apply_owned(kube, inputs, body)
        kapply.apply_owned(kube, search_jobs.render_job(name=name, namespace=namespace,
                                                        doc=doc, s=s, labels=labels), body)
        return Waiting(job=name, started=True)
    pods = kapply.list_pods(kube, namespace, f"batch.kubernetes.io/job-name={name}")
    answer = search_jobs.job_answer(job, pods, digest)
    if answer.phase == "failed":
        return JobFailed(job=name, message=answer.message)
    if answer.outcome is None:
        return Waiting(job=name, started=False,
                       since=(job.get("status") or {}).get("startTime"))
    # Kept beside its input: a restart reads it instead of searching again. Refused: used
    # for this reconcile; after a restart the Job runs again.
    with contextlib.suppress(kapply.Forbidden):
        kapply.apply_owned(kube, search_jobs.result_config_map(inputs, answer.message), body)
    _delete(kube, "Job", namespace, job)
    return _remember(digest, answer.outcome)


def _delete(kube: kapply.Kube, kind: str, namespace: str, obj: Mapping[str, Any]) -> None:
    """Delete kvtune's own object (conditional on its UID); its pods in the background."""
    meta = obj["metadata"]
    try:
        kube.request("DELETE", kapply.path(kind, namespace, meta["name"]), body={
            "propagationPolicy": "Background", "preconditions": {"uid": meta["uid"]}})
    except ApiException as exc:
        if exc.status not in (404, 409):  # gone meanwhile, or replaced by another object
            raise


def delete_stale(kube: kapply.Kube, body: Mapping[str, Any], pool: str,
                 keep: str | None) -> list[str]:
    """Delete the pool's search Jobs and ConfigMaps of inputs other than ``keep`` (a digest;
    None: all of them); only this InferenceDeployment's own. Returns what was deleted."""
    meta = body["metadata"]
    namespace, uid = meta["namespace"], meta.get("uid")
    selector = f"{LABEL_DEPLOYMENT}={meta['name']},{LABEL_POOL}={pool},{search_jobs.LABEL_SEARCH}"
    deleted = []
    for kind in ("Job", "ConfigMap"):
        items = kube.request("GET", kapply.path(kind, namespace),
                             query={"labelSelector": selector}).get("items", [])
        for item in items:
            label = ((item.get("metadata") or {}).get("labels") or {}).get(
                search_jobs.LABEL_SEARCH, "")
            if owned_by(item, uid) is None or (keep is not None and keep.startswith(label)):
                continue
            _delete(kube, kind, namespace, item)
            deleted.append(f"{kind}/{item['metadata']['name']}")
    return deleted


def forget() -> None:
    """Drop the answers kept in memory (tests)."""
    _answers.clear()
