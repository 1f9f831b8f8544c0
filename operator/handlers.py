"""kopf handlers: thin adapters from kopf's events to ``reconcile.reconcile``.

- create / update / resume of an InferenceDeployment -> reconcile; a ``ReconcileResult``
  becomes kopf's retry policy (TemporaryError: "look again in N s", PermanentError: "not
  until the spec changes") and its events become Kubernetes Events.
- delete: no finalizer (``optional=True``); owner references let the garbage collector
  remove the children, so a stopped operator never blocks a deletion.
- Node events: when the GPU inventory (class -> schedulable nodes) changes, every
  InferenceDeployment is reconciled at once (a new pool is noticed without waiting for the
  retry of a pool that had no nodes).
- A timer follows rollouts into Progressing/Ready while Progressing is True; another
  re-reads the ConfigMaps a spec references (pod template, config.json) every minute; with
  ``spec.runtime.entrypoint: kvtune`` a third reads the runtime's reports. These are
  ``operator/kube/periodic.py`` timers, not kopf's: kopf puts a finalizer on every object a kopf
  timer matches, which would make deletions hang while the operator is down.

kopf keeps its bookkeeping in annotations under ``kvtune.io`` (not in status, whose schema
kvtune owns and the API server prunes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

import kopf

from kvtune.operator import api
from kvtune.operator import reconcile as rec
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import events, periodic
from kvtune.operator.kube import pools as gpu_pools
from kvtune.operator.monitoring import metrics, routing_status, runtime_reports
from kvtune.operator.routing import inference_pool as routing
from kvtune.operator.search import search_budget

RESOURCE = (api.GROUP, api.VERSION, api.PLURAL)
INVENTORY_PERIOD_SECONDS = 2.0
ROLLOUT_POLL_SECONDS = 2.0
# A rollout that did not move since the last look is looked at less often (2, 4, 8 s): at
# 1,000 objects rolling out, polls every 2 s of Deployments that wait for pods were most of
# the operator's calls, and queued the looks that would have seen one Ready.
ROLLOUT_POLL_MAX_SECONDS = 8.0
# ConfigMaps a spec references (model config.json, pod template) are re-read this often, so
# an edit takes effect without a spec change (and without list/watch on every ConfigMap).
CONFIGMAP_RESYNC_SECONDS = float(os.environ.get("KVTUNE_CONFIGMAP_RESYNC_SECONDS", "60"))
# How often the pods' runtime reports are read (a pod reports once, when it starts).
RUNTIME_REPORT_SECONDS = float(os.environ.get("KVTUNE_RUNTIME_REPORT_SECONDS", "15"))
# How often the pickers' availability and the gateway's word on the route are read back
# (spec.routing.enabled): one GET per pool, one for the route and one for the ServiceAccount.
ROUTING_STATUS_SECONDS = float(os.environ.get("KVTUNE_ROUTING_STATUS_SECONDS", "30"))
# A replica that dies without a word (kill -9, a lost node) holds its peering entry this
# long; the standby takes over when it expires. kopf's default is 60 s; keep-alives are sent
# every lifetime - 10 s, so 20 s means one every 10 s.
PEERING_LIFETIME_SECONDS = 20
HANDLER_THREADS = 16
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
    # No handler needs a finalizer (the delete handler is optional, the timers are not
    # kopf's); naming kvtune's former one lets kopf remove it from objects that still carry it.
    settings.persistence.finalizer = "kvtune.io/finalizer"
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS
    # Handlers are sync (threads). Python's default pool (cores + 4) would let a handful of
    # objects waiting on slow work (a tenant's template in its sandbox, a slow API call) hold
    # every thread while other objects wait; the waits hold no GIL, so more threads are cheap.
    settings.execution.max_workers = HANDLER_THREADS
    # kvtune posts its own Events (plan changes, rollouts); kopf's log lines stay in the log.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # Node events (heartbeats) and rollout polls are many: keep their successes quiet.
    logging.getLogger("kopf.objects").addFilter(_QuietWatchSuccess())
    memo.kube = kapply.Kube.connect(CONFIG.kubeconfig)
    search_budget.listen_for_shutdown()
    memo.inventory = {}
    memo.inventory_lock = threading.Lock()
    memo.node_waits = NodeWaits()
    # Set once the first node listing has settled: until then the inventory may lack nodes
    # (a reconcile lists them itself).
    memo.inventory_settled = threading.Event()
    memo.inventory_stop = threading.Event()
    threading.Thread(target=_watch_inventory, args=(memo, memo.inventory_stop),
                     name="kvtune-gpu-inventory", daemon=True).start()


@kopf.on.startup()
async def start_periodic(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    scheduler = periodic.Scheduler(memo)
    memo.scheduler = scheduler
    if settings.peering.standalone:
        scheduler.set_active(True)
    else:
        peering_log = logging.getLogger(periodic.KOPF_PEERING_LOGGER)
        if peering_log.getEffectiveLevel() > logging.INFO:
            peering_log.setLevel(logging.INFO)
        peering_log.addHandler(periodic.PeeringDecisions(scheduler))
    memo.scheduler_task = asyncio.get_running_loop().create_task(scheduler.run())


@kopf.on.event(*RESOURCE, id="periodic-index")
async def index_for_periodic(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    memo.scheduler.observe(event.get("type"), event["object"])


@kopf.on.cleanup()
async def stop_searches(**_: Any) -> None:
    # A backstop: kopf runs cleanup only after every handler returned, so the switch is
    # normally thrown earlier, when kopf logs the stop (operator/search/search_budget.py).
    search_budget.STOPPING.set()


@kopf.on.cleanup()
def stop_inventory(memo: kopf.Memo, **_: Any) -> None:
    memo.inventory_stop.set()
    memo.scheduler.stop()


class _QuietWatchSuccess(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(("Handler 'gpu-inventory'", "Timer 'rollout'",
                                        "Timer 'referenced-configmaps'",
                                        "Timer 'runtime-reports'"))
                    and "succeeded" in message)


# An unexpected failure (the API server away, a bug) is retried with a growing delay, so a
# broken object never becomes a retry storm.
ERROR_RETRY_SECONDS = 30.0
MAX_ERROR_RETRY_SECONDS = 600.0


def _run(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, trigger: str,
         retry: int = 0) -> None:
    with metrics.timed(trigger):
        try:
            result = _reconcile(memo, body)
        except Exception as exc:
            metrics.RECONCILES.labels(trigger, "error").inc()
            metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
            delay = min(ERROR_RETRY_SECONDS * 2 ** min(retry, 10), MAX_ERROR_RETRY_SECONDS)
            raise kopf.TemporaryError(f"reconcile failed: {type(exc).__name__}: "
                                      f"{str(exc)[:300]}", delay=delay) from exc
    for event in result.events:
        kapply.post_event(memo.kube, body, event.type, event.reason, event.message)
        if event.reason == "PlanChanged":
            metrics.PLAN_CHANGES.inc()
    meta = body["metadata"]
    phases: dict[str, int] = {}
    for pool in result.status.get("pools", []):
        phases[pool["phase"]] = phases.get(pool["phase"], 0) + 1
    for phase in get_args(api.PoolPhase):
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
def on_create(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, retry: int = 0,
           **_: Any) -> None:
    _run(body, memo, logger, "create", retry)


@kopf.on.update(*RESOURCE, id="reconcile-update")
def on_update(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, retry: int = 0,
           **_: Any) -> None:
    _run(body, memo, logger, "update", retry)


@kopf.on.resume(*RESOURCE, id="reconcile-resume")
def on_resume(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, retry: int = 0,
           **_: Any) -> None:
    _run(body, memo, logger, "resume", retry)


@kopf.on.delete(*RESOURCE, id="deleted", optional=True)
def on_delete(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    metrics.RECONCILES.labels("delete", "ok").inc()
    events.RECORDER.forget(body)
    logger.info("deleted; the garbage collector removes its Deployments, Services and PDBs")


def _progressing(status: kopf.Status, **_: Any) -> bool:
    return any(c.get("type") == "Progressing" and c.get("status") == "True"
               for c in status.get("conditions", []))


@periodic.timer(id="rollout", interval=ROLLOUT_POLL_SECONDS, when=_progressing)
def follow_rollout(body: kopf.Body, status: kopf.Status, memo: kopf.Memo,
                   logger: kopf.Logger, **_: Any) -> float | None:
    """While a rollout is in progress, follow the Deployments into Progressing/Ready (a
    canary under analysis needs a full reconcile: it is promoted or rolled back). A timer,
    not a Deployment watch: it cannot miss a rollout that ended before the status saying it
    started was written."""
    if any(p.get("phase") == "Canary" for p in status.get("pools", [])):
        _run(body, memo, logger, "canary")
        return None
    moved = rec.refresh_rollout(body, kube=memo.kube)
    return next_rollout_look(memo, status, moved)


def next_rollout_look(memo: kopf.Memo, status: kopf.Status, moved: bool) -> float:
    """Seconds to the next look at a rollout: ``ROLLOUT_POLL_SECONDS`` after a look that
    wrote a change (or the first look at a new rollout: other revisions or generation),
    doubling after each look that did not, up to ``ROLLOUT_POLL_MAX_SECONDS``."""
    rollout = (status.get("observedGeneration"),
               tuple((p.get("name"), p.get("revision")) for p in status.get("pools", [])))
    quiet = 0 if moved or memo.get("rollout_watched") != rollout \
        else memo.get("rollout_quiet_looks", 0) + 1
    memo["rollout_watched"], memo["rollout_quiet_looks"] = rollout, quiet
    return float(min(ROLLOUT_POLL_SECONDS * 2 ** quiet, ROLLOUT_POLL_MAX_SECONDS))


def _references_config_maps(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("runtime") or {}).get("podTemplate")
                or (spec.get("model") or {}).get("config"))


@periodic.timer(id="referenced-configmaps", interval=CONFIGMAP_RESYNC_SECONDS,
                initial_delay=CONFIGMAP_RESYNC_SECONDS, when=_references_config_maps,
                spread=True)
def resync_config_maps(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                       **_: Any) -> None:
    """Reconcile again: an edited template or config.json changes the rendered objects (a
    no-op apply when nothing changed)."""
    _run(body, memo, logger, "configmap")


def _uses_kvtune_entrypoint(spec: kopf.Spec, **_: Any) -> bool:
    return (spec.get("runtime") or {}).get("entrypoint") == "kvtune"


@periodic.timer(id="runtime-reports", interval=RUNTIME_REPORT_SECONDS,
                when=_uses_kvtune_entrypoint)
def read_runtime_reports(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The runtime entrypoint's reports (pod annotations) into status.pools[].runtime: a
    timer listing the pools' pods by label, not a pod watch, so the operator needs no watch
    on pods and a report written while it was down is still read."""
    for event in runtime_reports.refresh(body, kube=memo.kube):
        kapply.post_event(memo.kube, body, event.type, event.reason, event.message)


def _routes(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("routing") or {}).get("enabled")) and routing.operator_enabled()


@periodic.timer(id="routing-status", interval=ROUTING_STATUS_SECONDS, when=_routes,
                initial_delay=ROUTING_STATUS_SECONDS, spread=True)
def read_routing_status(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The endpoint pickers' availability and the gateway's status.parents on the HTTPRoute
    into RoutingReady (operator/monitoring/routing_status.py): both change without any change to the
    InferenceDeployment, and no watch on Deployments or HTTPRoutes is needed."""
    for event in routing_status.refresh(body, kube=memo.kube):
        kapply.post_event(memo.kube, body, event.type, event.reason, event.message)


@kopf.on.event("", "v1", "nodes", id="gpu-inventory")
def on_node(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    # Node heartbeats arrive often: only record the classified node (what placement reads);
    # the inventory thread decides when a change reconciles everything.
    node = event["object"]
    name = node["metadata"]["name"]
    gpu_node = None if event["type"] == "DELETED" else gpu_pools.classify_node(node)
    with memo.inventory_lock:
        if memo.inventory.get(name) != gpu_node:
            memo.node_waits.inventory_version += 1
        if gpu_node is None:
            memo.inventory.pop(name, None)
        else:
            memo.inventory[name] = gpu_node


@dataclass
class NodeWaits:
    """Which objects wait for nodes, and the inventory each was planned against. Shared
    through the memo as one object: kopf hands each handler a shallow copy of the memo, so a
    counter kept there as a plain attribute would be rebound on the copy."""

    inventory_version: int = 0  # changes to the classified inventory so far
    # (namespace, name) -> the inventory_version its last reconcile started from
    waiting: dict[tuple[str, str], int] = field(default_factory=dict)


def known_pools(memo: kopf.Memo) -> dict[str, gpu_pools.GPUPool] | None:
    """The GPU pools from the node watch, once its first listing settled (None before: the
    reconcile lists the nodes). A reconcile per object listing every node (at 1,000 objects,
    1,000 lists of every node in the cluster) would cost the API server more than the
    reconcile itself."""
    if not memo.inventory_settled.is_set():
        return None
    with memo.inventory_lock:
        return gpu_pools.pools_of(list(memo.inventory.values()))


def _watch_inventory(memo: kopf.Memo, stop: threading.Event) -> None:
    """Reconcile every InferenceDeployment when the inventory has changed and then held still
    for one period (the initial node listing arrives as a burst of events). Direct, not via
    kopf: a create handler waiting out a TemporaryError delay would not see an update."""
    first_seen: str | None = None
    last_seen: str | None = None
    applied: str | None = None
    while not stop.wait(INVENTORY_PERIOD_SECONDS):
        with memo.inventory_lock:
            nodes = list(memo.inventory.values())
        digest = gpu_pools.inventory_digest(gpu_pools.pools_of(nodes))
        if first_seen is None:
            first_seen = digest
        if digest != last_seen:
            last_seen = digest
            continue
        memo.inventory_settled.set()  # held still for a period: the first listing is in
        if applied is None and digest == first_seen:
            # The inventory the operator started with: resume handlers reconcile everything.
            # A node that came while it settled is a change (a create handler may already be
            # waiting out its no-nodes delay), so that case falls through and reconciles.
            applied = digest
        if digest == applied:
            # No change to announce; an object waiting for nodes that was planned against an
            # older inventory is still brought up to date (a full reconcile, below, covers
            # them when the inventory changed).
            try:
                _reconcile_waiting(memo)
            except Exception:  # the next period retries; a hiccup must not end the loop
                LOG.exception("reconcile of objects waiting for nodes failed")
            continue
        LOG.info("GPU inventory is now %s: reconciling InferenceDeployments", digest or "-")
        try:
            _reconcile_all(memo)
            applied = digest
        except Exception:  # the next period retries; a hiccup must not end the loop
            LOG.exception("reconcile after a GPU inventory change failed")


def _reconcile(memo: kopf.Memo, body: Mapping[str, Any]) -> rec.ReconcileResult:
    """One reconcile, remembering whether the object now waits for nodes and which
    inventory it was planned against."""
    waits: NodeWaits = memo.node_waits
    with memo.inventory_lock:
        seen = waits.inventory_version
    result = rec.reconcile(body, kube=memo.kube, discovered=known_pools(memo))
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    with memo.inventory_lock:
        if any(p.get("phase") == "NoNodes" for p in result.status.get("pools", [])):
            waits.waiting[key] = seen
        else:
            waits.waiting.pop(key, None)
    return result


def _reconcile_waiting(memo: kopf.Memo) -> None:
    """Reconcile the objects that wait for nodes and were planned against an older
    inventory. Before the node watch's first listing settles, a reconcile lists nodes
    itself: a node that came after that listing but before the watch's first look is in
    the inventory the watch starts from, so no inventory change would ever announce it, and
    the object would wait out kopf's no-nodes retry."""
    waits: NodeWaits = memo.node_waits
    with memo.inventory_lock:
        stale = [key for key, seen in waits.waiting.items() if seen != waits.inventory_version]
    for namespace, name in stale:
        body = kapply.read_inference_deployment(memo.kube, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            with memo.inventory_lock:
                waits.waiting.pop((namespace, name), None)
            continue
        LOG.info("%s/%s waits for nodes and the GPU inventory changed: reconciling",
                 namespace, name)
        _reconcile_posting(memo, body)


def _reconcile_all(memo: kopf.Memo) -> None:
    for body in kapply.list_inference_deployments(memo.kube, CONFIG.namespaces):
        if body["metadata"].get("deletionTimestamp"):
            continue
        _reconcile_posting(memo, body)


def _reconcile_posting(memo: kopf.Memo, body: dict[str, Any]) -> None:
    with metrics.timed("nodes"):
        result = _reconcile(memo, body)
    metrics.RECONCILES.labels("nodes", "ok").inc()
    for event in result.events:
        kapply.post_event(memo.kube, body, event.type, event.reason, event.message)
