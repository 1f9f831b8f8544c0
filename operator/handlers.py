"""kopf handlers: thin adapters from kopf's events to ``reconcile.reconcile``.

- create / update / resume of an InferenceDeployment -> reconcile; a ``ReconcileResult``
  becomes kopf's retry policy (TemporaryError: "look again in N s", PermanentError: "not
  until the spec changes") and its events become Kubernetes Events.
- delete: no finalizer (``optional=True``); owner references let the garbage collector
  remove the children, so a stopped operator never blocks a deletion.
- Node events: when the GPU inventory (class -> schedulable nodes) changes, every
  InferenceDeployment is annotated with the new inventory digest; that annotation is part of
  what kopf diffs, so each one gets an update reconcile (a new pool is noticed at once).

kopf keeps its bookkeeping in annotations under ``kvtune.io`` (not in status, whose schema
kvtune owns and the API server prunes).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import kopf
from kvtune.operator import api, metrics
from kvtune.operator import apply as kapply
from kvtune.operator import pools as gpu_pools
from kvtune.operator import reconcile as rec

RESOURCE = (api.GROUP, api.VERSION, api.PLURAL)
ANNOTATION_INVENTORY = "kvtune.io/gpu-inventory"
INVENTORY_PERIOD_SECONDS = 2.0
LOG = logging.getLogger("kvtune.operator")


@dataclass
class OperatorConfig:
    """Set by ``kvtune operator`` before kopf starts."""

    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()


CONFIG = OperatorConfig()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # The CLI exports KUBECONFIG when --kubeconfig is given; in a pod the service account wins.
    if CONFIG.kubeconfig:
        os.environ["KUBECONFIG"] = CONFIG.kubeconfig
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvtune.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvtune.io", key="last-handled-configuration")
    settings.persistence.finalizer = "kvtune.io/finalizer"
    # kvtune posts its own Events (plan changes, rollouts); kopf's log lines stay in the log.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    memo.kube = kapply.Kube.connect(CONFIG.kubeconfig)
    memo.inventory = {}
    memo.inventory_lock = threading.Lock()
    memo.inventory_stop = threading.Event()
    threading.Thread(target=_watch_inventory, args=(memo, memo.inventory_stop),
                     name="kvtune-gpu-inventory", daemon=True).start()


@kopf.on.cleanup()
def stop_inventory(memo: kopf.Memo, **_: Any) -> None:
    memo.inventory_stop.set()


def _run(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, trigger: str) -> None:
    with metrics.timed(trigger):
        try:
            result = rec.reconcile(body, kube=memo.kube)
        except Exception as exc:
            metrics.RECONCILES.labels(trigger, "error").inc()
            metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
            raise kopf.TemporaryError(f"reconcile failed: {exc}", delay=30) from exc
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        if event.reason == "PlanChanged":
            metrics.PLAN_CHANGES.inc()
    meta = body["metadata"]
    phases: dict[str, int] = {}
    for pool in result.status.get("pools", []):
        phases[pool["phase"]] = phases.get(pool["phase"], 0) + 1
    for phase in ("Applied", "Recommended", "Unmanaged", "NoNodes", "Failed"):
        metrics.POOLS.labels(meta["namespace"], meta["name"], phase).set(phases.get(phase, 0))
    if result.permanent_error:
        metrics.RECONCILES.labels(trigger, "invalid").inc()
        raise kopf.PermanentError(result.permanent_error)
    if result.retry_after is not None:
        metrics.RECONCILES.labels(trigger, "retry").inc()
        raise kopf.TemporaryError("waiting: " + "; ".join(
            c["message"] for c in result.status.get("conditions", [])
            if c["type"] == "Ready" and c["status"] != "True"), delay=result.retry_after)
    metrics.RECONCILES.labels(trigger, "ok").inc()
    pools = result.status.get("pools", [])
    logger.info("reconciled: %s", "; ".join(
        f"{p['name']}={p['phase']} r{p.get('revision', 0)}" for p in pools))


@kopf.on.create(*RESOURCE, id="reconcile-create")
def on_create(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _run(body, memo, logger, "create")


@kopf.on.update(*RESOURCE, id="reconcile-update")
def on_update(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _run(body, memo, logger, "update")


@kopf.on.resume(*RESOURCE, id="reconcile-resume")
def on_resume(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _run(body, memo, logger, "resume")


@kopf.on.delete(*RESOURCE, id="deleted", optional=True)
def on_delete(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    metrics.RECONCILES.labels("delete", "ok").inc()
    logger.info("deleted; the garbage collector removes its Deployments, Services and PDBs")


@kopf.on.event("", "v1", "nodes", id="gpu-inventory")
def on_node(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    # Node heartbeats arrive often: only record the class; the inventory thread decides.
    node = event["object"]
    name = node["metadata"]["name"]
    gpu_node = None if event["type"] == "DELETED" else gpu_pools.classify_node(node)
    with memo.inventory_lock:
        if gpu_node is None:
            memo.inventory.pop(name, None)
        else:
            memo.inventory[name] = (gpu_node.gpu_class.upper(), gpu_node.schedulable)


def _digest(inventory: dict[str, tuple[str, bool]]) -> str:
    counts: dict[str, int] = {}
    for gpu_class, schedulable in inventory.values():
        counts[gpu_class] = counts.get(gpu_class, 0) + (1 if schedulable else 0)
    return ",".join(f"{cls}={n}" for cls, n in sorted(counts.items()))


def _watch_inventory(memo: kopf.Memo, stop: threading.Event) -> None:
    """Annotate every InferenceDeployment when the inventory has changed and then held still
    for one period (the initial node listing arrives as a burst of events)."""
    last_seen: str | None = None
    applied: str | None = None
    while not stop.wait(INVENTORY_PERIOD_SECONDS):
        with memo.inventory_lock:
            digest = _digest(memo.inventory)
        if digest != last_seen:
            last_seen = digest
            continue
        if digest != applied:
            try:
                _annotate_all(memo.kube, digest)
                applied = digest
                LOG.info("GPU inventory %s: InferenceDeployments re-reconcile", digest or "-")
            except Exception:  # the next period retries; a watch hiccup must not end the loop
                LOG.exception("cannot annotate InferenceDeployments with the GPU inventory")


def _annotate_all(kube: kapply.Kube, digest: str) -> None:
    custom = kube.custom
    namespaces = CONFIG.namespaces or (None,)
    for namespace in namespaces:
        if namespace is None:
            items = custom.list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL)
        else:
            items = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace,
                                                         api.PLURAL)
        for item in items.get("items", []):
            meta = item["metadata"]
            if (meta.get("annotations") or {}).get(ANNOTATION_INVENTORY) == digest:
                continue
            custom.patch_namespaced_custom_object(
                api.GROUP, api.VERSION, meta["namespace"], api.PLURAL, meta["name"],
                {"metadata": {"annotations": {ANNOTATION_INVENTORY: digest}}},
                _content_type="application/merge-patch+json",
            )
