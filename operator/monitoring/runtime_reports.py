"""Expected vs actual: what kvtune's runtime entrypoint reported from each pool's pods.

With ``spec.runtime.entrypoint: kvtune`` every vLLM pod's entrypoint checks the GPU through
NVML, sizes the memory fraction to the memory really free, and writes its decisions under
its pod's name into the namespace's ConfigMap ``kvtune-runtime-reports``
(``kvtune.runtime.report``; the chart creates it with the runtime's ServiceAccount, see
``operator/render/runtime_access.py``). The runtime-reports timer (``operator/handlers.py``) reads
them back here into ``status.pools[].runtime`` and the ``RuntimeAsPlanned`` condition, and
posts an Event when a pool's runtime refused to start or lowered the fraction materially.
Only the reports of the pools' current pods count (a key of a gone pod is ignored).

``summarize`` and ``finding`` are pure; ``refresh`` reads pods and the ConfigMap and patches
status (only when it changed, with a resourceVersion precondition, like the rollout timer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvtune.operator.api import (
    InferenceDeploymentStatus,
    PoolStatus,
    RuntimeStatus,
    TokensStatus,
    UtilizationStatus,
)
from kvtune.operator.api import conditions as cond
from kvtune.operator.api.names import ANNOTATION_PLAN_HASH, LABEL_DEPLOYMENT, LABEL_POOL
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import status as status_writer
from kvtune.operator.kube.locks import object_lock
from kvtune.operator.render.runtime_access import REPORTS_CONFIG_MAP
from kvtune.operator.rollout.outcome import Event
from kvtune.tuner.units import GiB

# RuntimeAsPlanned=False: the namespace has no reports ConfigMap (the chart did not set up
# the runtime's access there), so the runtime pods cannot run as kvtune-runtime.
RUNTIME_ACCESS_MISSING = "RuntimeAccessMissing"
# A fraction lowered by more than this (5 points of GPU memory), or a KV cache smaller than
# planned by more than this share, is worth an Event: the pool serves fewer sequences.
MATERIAL_UTILIZATION_DROP = 0.05
MATERIAL_TOKEN_SHORTFALL = 0.05


def _report(pod: Mapping[str, Any], reports: Mapping[str, str]) -> dict[str, Any] | None:
    raw = reports.get(str((pod.get("metadata") or {}).get("name")))
    if not raw:
        return None
    try:
        report = json.loads(raw)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{n}"


def summarize(pods: Sequence[Mapping[str, Any]], plan_hash: str | None,
              reports_by_pod: Mapping[str, str]) -> RuntimeStatus | None:
    """The reports (``reports_by_pod``: the ConfigMap's data) of the pods running
    ``plan_hash`` (others are old or canary pods of another plan); None when no such pod
    exists. Figures are the worst pod's."""
    current = sorted(
        (p for p in pods
         if not (p.get("metadata") or {}).get("deletionTimestamp")
         and ((p.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN_HASH)
         == plan_hash),
        key=lambda p: str(p["metadata"].get("name")))
    if not current:
        return None
    reports = [(p["metadata"]["name"], r) for p in current
               if (r := _report(p, reports_by_pod)) is not None]
    started = [r for _, r in reports if r.get("started") is True]
    refused = [(n, r) for n, r in reports if r.get("started") is False]
    gpus = [g for r in started for g in r.get("gpus") or [] if isinstance(g, dict)]
    utils = [r["gpuMemoryUtilization"] for r in started
             if isinstance(r.get("gpuMemoryUtilization"), dict)]
    tokens = [r["kvCacheTokens"] for r in started if isinstance(r.get("kvCacheTokens"), dict)]
    util = None if not utils else UtilizationStatus(
        planned=float(utils[0]["planned"]), actual=min(float(u["actual"]) for u in utils))
    kv = None if not tokens else TokensStatus(
        expected=int(tokens[0]["expected"]), actual=min(int(t["actual"]) for t in tokens))
    parts = [f"{len(reports)}/{len(current)} pod(s) reported"]
    if gpus:
        parts.append(f"{gpus[0].get('name')}, "
                     f"{min(int(g['freeBytes']) for g in gpus) / GiB:.1f} GiB free of "
                     f"{min(int(g['totalBytes']) for g in gpus) / GiB:.1f} GiB")
    if util is not None:
        parts.append(f"gpu-memory-utilization {util.actual:.4g} (planned {util.planned:.4g})")
    if kv is not None:
        parts.append(f"KV cache {_tokens(kv.actual)} tokens (expected {_tokens(kv.expected)})")
    if refused:
        parts.append(f"{len(refused)} refused to start")
    times = [str(r["time"]) for _, r in reports if r.get("time")]
    return RuntimeStatus(
        pods=len(current), reported_pods=len(reports), started_pods=len(started),
        refused_pods=len(refused),
        gpu_product=str(gpus[0].get("name")) if gpus else None,
        gpu_memory_total_bytes=min(int(g["totalBytes"]) for g in gpus) if gpus else None,
        gpu_memory_free_bytes=min(int(g["freeBytes"]) for g in gpus) if gpus else None,
        gpu_memory_utilization=util, kv_cache_tokens=kv,
        refusal_reason=str(refused[0][1].get("reason")) if refused else None,
        refusal=(f"pod {refused[0][0]}: {refused[0][1].get('message')}" if refused else None),
        message="; ".join(parts), last_report_time=max(times) if times else None,
    )


def finding(pool: str, runtime: RuntimeStatus | None) -> tuple[str, str] | None:
    """(reason, message) when the pool's runtime did not run the plan as planned."""
    if runtime is None:
        return None
    if runtime.refused_pods:
        return cond.RUNTIME_REFUSED, (
            f"pool {pool}: {runtime.refused_pods}/{runtime.pods} pod(s) refused to start vLLM "
            f"({runtime.refusal_reason}): {runtime.refusal}")
    util, kv = runtime.gpu_memory_utilization, runtime.kv_cache_tokens
    lowered = util is not None and util.planned - util.actual > MATERIAL_UTILIZATION_DROP
    short = kv is not None and kv.expected > 0 and \
        kv.actual < kv.expected * (1 - MATERIAL_TOKEN_SHORTFALL)
    if not (lowered or short):
        return None
    what = (f"lowered gpu-memory-utilization from {util.planned:.4g} to {util.actual:.4g}"
            if util is not None and lowered else "shrank the KV cache")
    free = "" if runtime.gpu_memory_free_bytes is None else (
        f" ({runtime.gpu_product}: {runtime.gpu_memory_free_bytes / GiB:.1f} GiB free of "
        f"{(runtime.gpu_memory_total_bytes or 0) / GiB:.1f} GiB)")
    held = "" if kv is None else (
        f"; the KV cache holds {kv.actual} tokens, {kv.actual / max(kv.expected, 1):.0%} of "
        f"the {kv.expected} planned")
    return cond.GPU_MEMORY_LOWERED, (
        f"pool {pool}: the runtime {what}: less GPU memory was free than the plan assumed"
        f"{free}{held}. Fix: free the GPUs (another process holds memory), or pin "
        f"spec.tuning.pin.gpuMemoryUtilization to what is free so the plan is made for it")


def runtime_condition(pools: list[PoolStatus]) -> tuple[str, str, str]:
    """(status, reason, message) of RuntimeAsPlanned over every pool."""
    findings = [f for p in pools if (f := finding(p.name, p.runtime)) is not None]
    if findings:
        refused = [m for r, m in findings if r == cond.RUNTIME_REFUSED]
        reason = cond.RUNTIME_REFUSED if refused else cond.GPU_MEMORY_LOWERED
        return "False", reason, " | ".join(m for _, m in findings)
    reported = [p for p in pools if p.runtime is not None and p.runtime.reported_pods]
    if not reported:
        return "Unknown", cond.AWAITING_REPORTS, "no pod of the current plans has reported yet"
    return "True", cond.AS_PLANNED, " | ".join(
        f"{p.name}: {p.runtime.message}" for p in reported if p.runtime is not None)


def refresh(body: Mapping[str, Any], *, kube: kapply.Kube,
            now: str | None = None) -> list[Event]:
    """Read the reports of every pool's pods into status (one status transaction); returns
    the Events to post (a refusal or a material lowering that was not in status before)."""
    meta = body["metadata"]
    events: list[Event] = []

    def mutate(previous: InferenceDeploymentStatus,
               obj: Mapping[str, Any]) -> InferenceDeploymentStatus | None:
        events.clear()  # a retry's look replaces the last one's
        return _refreshed(previous, obj, kube=kube, now=now, events=events)

    with object_lock(meta["namespace"], meta["name"]):
        written = status_writer.update(kube, meta["namespace"], meta["name"], mutate).written
    return events if written else []


def read_reports(kube: kapply.Kube, namespace: str) -> dict[str, str] | None:
    """The reports ConfigMap's data (pod name -> JSON report); None when it does not exist."""
    try:
        cm = kube.request("GET", kapply.path("ConfigMap", namespace, REPORTS_CONFIG_MAP))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    data = cm.get("data") or {}
    return {str(k): str(v) for k, v in data.items()}


def access_missing_message(namespace: str) -> str:
    return (f"namespace {namespace} has no ConfigMap {REPORTS_CONFIG_MAP}, so the runtime "
            f"pods (spec.runtime.entrypoint=kvtune) have no ServiceAccount kvtune-runtime to "
            f"run as and nowhere to report. Fix: add {namespace} to the Helm chart's "
            f"runtime.namespaces (namespaced mode: to operator.watchNamespaces), or set "
            f"spec.runtime.entrypoint to vllm")


def _refreshed(previous: InferenceDeploymentStatus, body: Mapping[str, Any], *,
               kube: kapply.Kube, now: str | None,
               events: list[Event]) -> InferenceDeploymentStatus | None:
    meta = body["metadata"]
    if ((body.get("spec") or {}).get("runtime") or {}).get("entrypoint") != "kvtune":
        return None
    if previous.mode != "auto" or not previous.pools:
        return None
    reports = read_reports(kube, meta["namespace"])
    pools = []
    for pool in previous.pools:
        runtime = pool.runtime
        if reports is not None and pool.phase in ("Applied", "Canary") and pool.plan_hash:
            pods = kapply.list_pods(kube, meta["namespace"],
                                    f"{LABEL_DEPLOYMENT}={meta['name']},{LABEL_POOL}={pool.name}")
            runtime = summarize(pods, pool.plan_hash, reports)
        before, after = finding(pool.name, pool.runtime), finding(pool.name, runtime)
        if after is not None and after != before:
            events.append(Event("Warning", after[0], after[1]))
        pools.append(pool.model_copy(update={"runtime": runtime}))
    if reports is None:
        status_, reason, message = ("False", RUNTIME_ACCESS_MISSING,
                                    access_missing_message(meta["namespace"]))
        before_cond = cond.get_condition(previous.conditions, cond.RUNTIME_AS_PLANNED)
        if before_cond is None or before_cond.reason != RUNTIME_ACCESS_MISSING:
            events.append(Event("Warning", RUNTIME_ACCESS_MISSING, message))
    else:
        status_, reason, message = runtime_condition(pools)
    conditions = cond.set_condition(previous.conditions, cond.RUNTIME_AS_PLANNED, status_,
                                    reason, message, generation=previous.observed_generation,
                                    now=now)
    return previous.model_copy(update={"pools": pools, "conditions": conditions})
