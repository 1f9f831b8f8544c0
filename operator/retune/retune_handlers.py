"""The retune timer: per InferenceDeployment, profile the traffic in Prometheus, decide
(``operator/retune/decide.py``), and when the drift persisted and the new plan differs in a way
that matters, hand the observed profile to the reconcile seam, which plans and applies.

``retune_once`` does one tick and knows nothing of kopf (the e2e test and the CLI can call
it); ``retune_timer`` is the kopf adapter. Monitoring failures never touch the runtime:
when Prometheus is unreachable or a query fails, the last good profile and plan stay,
``ProfileStale`` is set with the reason, and the next attempt backs off (interval x 2^n, at
most ``MAX_BACKOFF_SECONDS``).

Every decision (retune or not) is written to ``status.profile.retune`` with its numbers and
posted as an Event. Figures the window showed go to ``status.profile.observed``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import kopf
from prometheus_client import Counter, Gauge

from kvtune.operator import api
from kvtune.operator import reconcile as rec
from kvtune.operator.api import ProfileScope, conditions
from kvtune.operator.api.durations import parse_duration
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import periodic
from kvtune.operator.kube import status as status_writer
from kvtune.operator.kube.locks import object_lock
from kvtune.operator.monitoring import alert_rules, metrics
from kvtune.operator.prometheus import selectors
from kvtune.operator.prometheus.profiling import (
    PoolProfile,
    ProfileResult,
    ProfilingSettings,
    profile_from_prometheus,
)
from kvtune.operator.prometheus.prom_http import PrometheusUnavailable
from kvtune.operator.prometheus.selectors import SeriesSelector
from kvtune.operator.retune import (
    calibration_loop,
    retune_state,
    reuse_observed,
    slo_observed,
    tick,
)
from kvtune.operator.retune.decide import RetuneSettings
from kvtune.operator.retune.retune_state import finite
from kvtune.operator.rollout import plan as plan_stage

LOG = logging.getLogger("kvtune.operator.retune")

# kopf fixes a timer's interval when the module is imported; tests shorten it.
INTERVAL_SECONDS = float(os.environ.get("KVTUNE_RETUNE_INTERVAL_SECONDS", "60"))
MIN_REQUESTS = int(os.environ.get("KVTUNE_PROFILE_MIN_REQUESTS", "200"))
MAX_BACKOFF_SECONDS = 600.0

PROFILE_STALE = Gauge(
    "kvtune_profile_stale", "1 when the last profiling attempt failed (Prometheus "
    "unreachable or a query failed); the last good profile and plan stay.",
    ["namespace", "name"], registry=metrics.REGISTRY,
)
PROFILE_LAST_SUCCESS = Gauge(
    "kvtune_profile_last_success_timestamp_seconds",
    "Unix time of the last successful profiling query.", ["namespace", "name"],
    registry=metrics.REGISTRY,
)
DRIFT_SCORE = Gauge(
    "kvtune_retune_drift_score", "Drift of the observed profile from the planned one.",
    ["namespace", "name"], registry=metrics.REGISTRY,
)
DECISIONS = Counter(
    "kvtune_retune_decisions", "Retune timer decisions, by reason.",
    ["namespace", "name", "reason"], registry=metrics.REGISTRY,
)

PLAN_MAX_MODEL_LEN = Gauge(
    "kvtune_plan_max_model_len", "max-model-len of each pool's current plan (tokens).",
    ["namespace", "name", "pool"], registry=metrics.REGISTRY,
)
PLAN_REVISION = Gauge(
    "kvtune_plan_revision", "Revision of each pool's current plan (dashboard annotations).",
    ["namespace", "name", "pool"], registry=metrics.REGISTRY,
)
PLAN_EXPECTED_BLOCKS = Gauge(
    "kvtune_plan_expected_num_gpu_blocks", "KV blocks per GPU the plan expects vLLM to "
    "allocate (compare vllm:cache_config_info's num_gpu_blocks).",
    ["namespace", "name", "pool"], registry=metrics.REGISTRY,
)

# Condition reasons for ProfileStale (and PrometheusUnavailable's subclasses' ``reason``:
# PrometheusNotAllowed, PrometheusDataInvalid).
PROMETHEUS_UNAVAILABLE = PrometheusUnavailable.reason
MAX_REASON_CHARS = 400
NOT_CONFIGURED = "NotConfigured"


@dataclass(frozen=True)
class RetuneEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class RetuneOutcome:
    reason: str
    message: str
    failed: bool = False  # profiling failed: the caller backs off
    rolled_out: bool = False
    events: list[RetuneEvent] = field(default_factory=list)
    profile: ProfileResult | None = None  # the deployment-wide one
    pool_profiles: dict[str, PoolProfile] = field(default_factory=dict)


def export_plan_gauges(namespace: str, name: str,
                       status: api.InferenceDeploymentStatus) -> None:
    """The plan as operator metrics, so dashboards can draw it next to vLLM's series."""
    for pool in status.pools:
        labels = (namespace, name, pool.name)
        PLAN_REVISION.labels(*labels).set(pool.revision)
        if pool.plan is not None:
            PLAN_MAX_MODEL_LEN.labels(*labels).set(pool.plan.max_model_len)
        if pool.expected is not None:
            PLAN_EXPECTED_BLOCKS.labels(*labels).set(pool.expected.num_gpu_blocks)


def retune_once(
    body: Mapping[str, Any],
    *,
    kube: kapply.Kube,
    now_seconds: float | None = None,
    profiler: Callable[[str, ProfilingSettings], ProfileResult] = profile_from_prometheus,
    min_requests: int = MIN_REQUESTS,
) -> RetuneOutcome:
    """One tick for one InferenceDeployment; see the module docstring. The steps: follow a
    rollout this timer started, read the inputs, observe (Prometheus), decide each pool
    (pure), re-plan the drifted ones, hand the reconcile seam one typed request, report."""
    now = time.time() if now_seconds is None else now_seconds
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = api.InferenceDeploymentSpec.model_validate(body.get("spec") or {})
    prom = spec.tuning.prometheus
    if spec.tuning.mode == "off" or prom is None:
        return RetuneOutcome(NOT_CONFIGURED, "tuning.mode=off or no tuning.prometheus: "
                             "the retune timer does nothing")
    # The Events of the reconciles this tick runs (PlanChanged, RolloutStarted, a canary's
    # verdict): posted with the tick's own, as the handlers post theirs.
    body, carried = _follow_rollout(body, kube)
    export_plan_gauges(namespace, name, status_writer.read(body))
    inp = _tick_inputs(body, spec, prom)
    seen = _observe(kube, body, inp, profiler, min_requests)
    if isinstance(seen, RetuneOutcome):
        seen.events[:0] = carried
        return seen
    PROFILE_STALE.labels(namespace, name).set(0)
    PROFILE_LAST_SUCCESS.labels(namespace, name).set(now)
    # The closed loop (docs/calibration-loop.md): observed against predicted, fitted into the
    # cluster's model calibration; the CalibrationDrift condition.
    loop = calibration_loop.run(kube, body, spec, inp.plans, inp.pool_series,
                                inp.window_seconds, conditions.now_rfc3339())
    ticks = tick.decide_pools(inp, seen, now)
    ticks = tick.replan(kube, body, inp, ticks, now)
    wide = tick.as_declared(seen.result.profile if seen.result.trusted else None,
                            inp.declared)
    request = tick.reconcile_request(ticks, wide, prom.window)
    event_type: Literal["Normal", "Warning"] = "Normal"
    if request is not None:
        outcome = rec.reconcile(body, kube=kube, request=request)
        carried += _reconcile_events(outcome)
        if outcome.permanent_error:
            event_type = "Warning"
        ticks = tick.with_reconcile_error(ticks, outcome.permanent_error)
        export_plan_gauges(namespace, name, api.InferenceDeploymentStatus.model_validate(
            outcome.status))
    elif loop is not None and loop.written is not None:
        # A factor moved: plan again with it (the plan's inputs hold the factors; a changed
        # knob rolls out as any plan change does).
        LOG.info("%s/%s: a model calibration factor moved: planning again with it",
                 namespace, name)
        fresh = kapply.read_inference_deployment(kube, namespace, name) or body
        carried += _reconcile_events(rec.reconcile(fresh, kube=kube))
    return _report(kube, body, inp, seen, ticks, min_requests,
                   [*carried], event_type, rolled_out=request is not None
                   and any(t.material for t in ticks))


def _follow_rollout(body: Mapping[str, Any], kube: kapply.Kube
                    ) -> tuple[Mapping[str, Any], list[RetuneEvent]]:
    """A rollout this timer started is checked here: no spec change will re-trigger the
    handlers. The plan comes from the stored profile, so nothing new is applied."""
    progressing = conditions.get_condition(status_writer.read(body).conditions,
                                           conditions.PROGRESSING)
    if progressing is None or progressing.status != "True" \
            or progressing.reason != conditions.ROLLING_OUT:
        return body, []
    carried = _reconcile_events(rec.reconcile(body, kube=kube))
    meta = body["metadata"]
    return kapply.read_inference_deployment(kube, meta["namespace"], meta["name"]) or body, \
        carried


def _tick_inputs(body: Mapping[str, Any], spec: api.InferenceDeploymentSpec,
                 prom: api.PrometheusSpec) -> tick.TickInputs:
    """The spec's retune settings, the status as read, the plans in force, each pool's
    series."""
    meta = body["metadata"]
    window_seconds = parse_duration(prom.window, field="spec.tuning.prometheus.window")
    retune_spec = spec.tuning.retune or api.RetuneSpec()
    settings = RetuneSettings(
        drift_threshold=retune_spec.drift_threshold,
        # Drift must hold over at least a whole window (the CRD and the spec model refuse a
        # shorter dwell): one window of noise never triggers a rollout.
        dwell_seconds=retune_spec.dwell_seconds(window_seconds),
        min_interval_seconds=parse_duration(retune_spec.min_interval,
                                            field="spec.tuning.retune.minInterval"),
    )
    previous = status_writer.read(body)
    return tick.TickInputs(
        spec=spec, prom=prom, window_seconds=window_seconds, settings=settings,
        previous=previous, plans=tick.current_plans(previous),
        pool_series={pool.pool_name: selectors.pool_selector(
            prom, namespace=meta["namespace"], deployment=meta["name"], pool=pool.pool_name)
            for pool in spec.pools},
        declared=declared_profile(spec.workload))


def _observe(kube: kapply.Kube, body: Mapping[str, Any], inp: tick.TickInputs,
             profiler: Callable[[str, ProfilingSettings], ProfileResult],
             min_requests: int) -> tick.Observed | RetuneOutcome:
    """The window's profiles from Prometheus: the deployment's and each pool's own; when
    Prometheus fails, the stale report written and the tick's failed outcome."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    cap = max((p.max_model_len for p in inp.plans.values()), default=None)

    def settings_for(series: SeriesSelector, max_model_len: int | None) -> ProfilingSettings:
        return ProfilingSettings.for_series(series, window_seconds=inp.window_seconds,
                                            min_requests=min_requests,
                                            max_model_len_tokens=max_model_len)

    own: dict[str, ProfileResult] = {}
    try:
        result = profiler(inp.prom.url, settings_for(
            selectors.deployment_selector(inp.spec.model.name), cap))
        for pool_name, series in inp.pool_series.items():
            if series is not None:
                plan = inp.plans.get(pool_name)
                own[pool_name] = profiler(inp.prom.url, settings_for(
                    series, plan.max_model_len if plan else cap))
    except PrometheusUnavailable as exc:
        # The exception's text is short and never quotes a reply; cut it anyway: a condition
        # is readable by anyone who may get the object.
        previous = inp.previous
        message = (f"{str(exc)[:MAX_REASON_CHARS]}; keeping the last good profile "
                   f"({previous.profile.source if previous.profile else 'declared'}) and the "
                   f"running plan")
        PROFILE_STALE.labels(namespace, name).set(1)
        status_writer.write_profile_report(kube, namespace, name, stale=(
            True, exc.reason, message))
        return RetuneOutcome(exc.reason, message, failed=True,
                             events=[RetuneEvent("Warning", exc.reason, message)])
    return tick.Observed(result=result, own=own)


def _report(kube: kapply.Kube, body: Mapping[str, Any], inp: tick.TickInputs,
            seen: tick.Observed, ticks: list[tick.PoolTick], min_requests: int,
            carried: list[RetuneEvent], event_type: Literal["Normal", "Warning"], *,
            rolled_out: bool) -> RetuneOutcome:
    """The tick's metrics, its report in status (one transaction) and its outcome."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    reason, message = tick.tick_reason(ticks)
    drifts = [t.decision.drift.score for t in ticks if t.decision.drift is not None]
    if drifts:
        DRIFT_SCORE.labels(namespace, name).set(max(drifts))
    DECISIONS.labels(namespace, name, reason).inc()
    retune_status = tick.retune_status(ticks, inp.settings, conditions.now_rfc3339())
    seen_slo, slo_condition = observed_slo(inp.spec, inp.previous, seen.own, seen.result,
                                           min_requests)
    events = [*carried, RetuneEvent(event_type, f"Retune{reason}", message)]
    was = conditions.get_condition(inp.previous.conditions, conditions.SLO_BELOW_PREDICTION)
    if slo_condition is not None and slo_condition[0] == "True" and (
            was is None or was.status != "True"):
        events.append(RetuneEvent("Warning", conditions.SLO_BELOW_PREDICTION,
                                  slo_condition[2]))
    result = seen.result
    status_writer.write_profile_report(
        kube, namespace, name, stale=(False, result.reason, result.message),
        report=status_writer.ProfileReport(
            observed=retune_state.observed_status(result.observed), trusted=result.trusted,
            profile_message=result.message, retune=retune_status,
            observed_slo=seen_slo, slo_condition=slo_condition,
            observed_reuse=reuse_observed.observed_reuse(
                [p.pool_name for p in inp.spec.pools], inp.previous.pools, seen.own, result,
                conditions.now_rfc3339())))
    return RetuneOutcome(reason, message, rolled_out=rolled_out, profile=result,
                         pool_profiles={t.name: t.choice for t in ticks}, events=events)


def _reconcile_events(result: rec.ReconcileResult) -> list[RetuneEvent]:
    return [RetuneEvent(e.type, e.reason, e.message) for e in result.events]


def observed_slo(spec: api.InferenceDeploymentSpec, previous: api.InferenceDeploymentStatus,
                 own: Mapping[str, ProfileResult], wide: ProfileResult, min_requests: int
                 ) -> tuple[dict[str, api.ObservedSLOStatus], tuple[str, str, str] | None]:
    """Per pool, the SLO attainment its histograms showed over the window beside the capacity
    search's prediction for the plan it ran (operator/retune/slo_observed.py), and the
    SLOBelowPrediction condition (None: no pool has a prediction to compare with). A pool
    without its own series is judged on the deployment's only when it is the only pool."""
    from kvtune.tuner.planner.decide_max_num_seqs import DEFAULT_TPOT_SECONDS
    from kvtune.tuner.planner.search import DEFAULT_SETTINGS, DEFAULT_TTFT_SECONDS

    policy = plan_stage.policy_for(spec)
    # The targets the search scored against (its defaults where the spec sets none).
    ttft = policy.slo.ttft_p95_seconds or DEFAULT_TTFT_SECONDS
    tpot = policy.slo.tpot_p95_seconds or DEFAULT_TPOT_SECONDS
    predicted_requests = max(DEFAULT_SETTINGS.rungs)  # the finalists' stream (the operator's)
    prev_pools = {p.name: p for p in previous.pools}
    out: dict[str, api.ObservedSLOStatus] = {}
    below: list[str] = []
    fine: list[str] = []
    short: list[str] = []
    at = conditions.now_rfc3339()
    for pool in spec.pools:
        name = pool.pool_name
        source = own.get(name) or (wide if len(spec.pools) == 1 else None)
        if source is None:
            continue
        scope: ProfileScope = "pool" if name in own else "deployment"
        obs = source.observed
        seen = slo_observed.observe(obs.ttft_buckets, obs.tpot_buckets, obs.requests,
                                    obs.window_seconds, ttft, tpot)
        prev = prev_pools.get(name)
        predicted = prev.expected.slo_attainment if prev and prev.expected else None
        verdict = slo_observed.judge(seen, predicted, predicted_requests, min_requests)
        out[name] = api.ObservedSLOStatus(
            at=at, window_seconds=obs.window_seconds, requests=obs.requests, scope=scope,
            ttft_within_slo=finite(seen.ttft_within_slo),
            tpot_within_slo=finite(seen.tpot_within_slo),
            ttft_bound_seconds=seen.ttft_bound_seconds,
            tpot_bound_seconds=seen.tpot_bound_seconds,
            attainment_upper_bound=finite(seen.attainment_upper_bound),
            predicted_attainment=predicted, verdict=verdict.verdict,
            message=verdict.message)
        line = f"pool {name}: {verdict.message}"
        if verdict.below:
            below.append(line)
        elif verdict.verdict == slo_observed.AS_PREDICTED:
            fine.append(line)
        elif verdict.verdict == slo_observed.INSUFFICIENT_SAMPLE:
            short.append(line)
    if below:
        return out, ("True", slo_observed.BELOW_PREDICTION, " | ".join(below))
    if fine:
        return out, ("False", slo_observed.AS_PREDICTED, " | ".join(fine))
    if short:
        return out, ("Unknown", slo_observed.INSUFFICIENT_SAMPLE, " | ".join(short))
    return out, None


def sync_alert_rules(kube: kapply.Kube, body: Mapping[str, Any], memo: Any,
                     *, now_seconds: float | None = None) -> None:
    """Apply the deployment's PrometheusRule and its pools' PodMonitors/ServiceMonitors when
    their rendering changed, and delete the ones spec.monitoring switched off (best effort:
    a monitoring problem never stops profiling or re-tuning). A name taken by an object
    kvtune did not create is on the InferenceDeployment (``report_monitoring_collisions``);
    anything else is logged.

    The rendering's digest is remembered only once every object was applied: an apply the
    API server answered 404 (its CRD not installed, or not served yet: the Prometheus
    operator may come after kvtune) or refused is tried again after ``INTERVAL_SECONDS`` x 2^n
    (at most ``MAX_BACKOFF_SECONDS``), and at once when the rendering changes."""
    now = time.time() if now_seconds is None else now_seconds
    try:
        objects, unwanted = alert_rules.rendered_objects(body)
    except Exception:  # a spec the reconcile reports on; nothing to apply
        LOG.exception("cannot render the monitoring objects")
        return
    digest = alert_rules.digest([objects, unwanted])
    if memo.get("alert_rules_digest") == digest:
        return
    retry: _AlertRulesRetry | None = memo.get("alert_rules_retry")
    if retry is not None and retry.digest == digest and now < retry.next_attempt:
        return
    namespace = body["metadata"]["namespace"]
    collisions: list[str] = []
    try:
        for kind, name in unwanted:
            if alert_rules.delete_object(kube, namespace, kind, name, body):
                LOG.info("deleted %s %s/%s (switched off)", kind, namespace, name)
        skipped = []
        for obj in objects:
            try:
                applied = alert_rules.apply_object(kube, obj, body)
            except kapply.NameCollision as exc:  # the others are still applied
                collisions.append(str(exc))
                continue
            if applied:
                LOG.info("applied %s %s/%s", obj["kind"], namespace, obj["metadata"]["name"])
            else:
                skipped.append(obj["kind"])
        # MonitoringReady is written only here: with nothing colliding it needs a look (a
        # read of the object) only when it may exist: the watch's copy shows it, or this
        # process wrote it since (a GET per object and tick fewer at scale otherwise).
        if collisions or memo.get("monitoring_condition_written") or any(
                c.get("type") == conditions.MONITORING_READY
                for c in (body.get("status") or {}).get("conditions") or []):
            report_monitoring_collisions(kube, body, collisions)
        if collisions:
            memo["monitoring_condition_written"] = True
    except Exception as exc:
        LOG.exception("cannot apply the monitoring objects")
        why = f"{type(exc).__name__}: {exc}"
    else:
        if not skipped and not collisions:
            memo["alert_rules_digest"] = digest
            memo.pop("alert_rules_retry", None)
            return
        why = "; ".join(collisions + ([
            f"the API server does not serve {', '.join(sorted(set(skipped)))} "
            f"(monitoring.coreos.com: no Prometheus operator yet)"] if skipped else []))
    failures = retry.failures + 1 if retry is not None and retry.digest == digest else 1
    delay = min(INTERVAL_SECONDS * 2 ** (failures - 1), MAX_BACKOFF_SECONDS)
    memo["alert_rules_retry"] = _AlertRulesRetry(digest, failures, now + delay)
    LOG.info("monitoring objects of %s/%s not all applied (%s); next try in %.0fs",
             namespace, body["metadata"]["name"], why, delay)


def report_monitoring_collisions(kube: kapply.Kube, body: Mapping[str, Any],
                                 collisions: list[str]) -> None:
    """MonitoringReady=False/NameCollision naming each object whose name is taken, and one
    Warning Event when that appears or changes (not one per retry); True/MonitoringApplied
    once nothing collides. An object that never collided gets no condition."""
    meta = body["metadata"]
    message = " | ".join(collisions)
    # Under the object's lock: the reconcile seam reads the status and writes it whole, and
    # must not drop this condition written in between.
    with object_lock(meta["namespace"], meta["name"]):
        if not collisions:
            status_writer.write_condition(
                kube, meta["namespace"], meta["name"], conditions.MONITORING_READY, "True",
                conditions.MONITORING_APPLIED, "no monitoring object's name is taken by "
                "another object", only_if_present=True)
            return
        changed = status_writer.write_condition(
            kube, meta["namespace"], meta["name"], conditions.MONITORING_READY, "False",
            conditions.NAME_COLLISION, message)
    if changed:
        kapply.post_event(kube, body, "Warning", conditions.NAME_COLLISION, message)


@dataclass(frozen=True)
class _AlertRulesRetry:
    """When to try the monitoring objects of one rendering (``digest``) again."""

    digest: str
    failures: int
    next_attempt: float


@dataclass
class _Backoff:
    failures: int = 0
    next_attempt: float = 0.0


# A periodic (not kopf) timer: kopf's would put a finalizer on every object (periodic.py).
@periodic.timer(id="retune", interval=INTERVAL_SECONDS, initial_delay=INTERVAL_SECONDS,
                spread=True)
def retune_timer(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    backoff: _Backoff = memo.setdefault("retune_backoff", _Backoff())
    now = time.time()
    if now < backoff.next_attempt:
        return
    kube: kapply.Kube = memo["kube"] if "kube" in memo else kapply.Kube.connect()
    try:
        outcome = retune_once(body, kube=kube, now_seconds=now)
    except Exception as exc:  # a bug or the API server: report, back off, never tear down
        outcome = RetuneOutcome("RetuneFailed", f"retune failed: {exc}", failed=True,
                                events=[RetuneEvent("Warning", "RetuneFailed", str(exc))])
        metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
        logger.exception("retune failed")
    if outcome.failed:
        backoff.failures += 1
        delay = min(INTERVAL_SECONDS * 2 ** backoff.failures, MAX_BACKOFF_SECONDS)
        backoff.next_attempt = now + delay
        outcome.message += f" (attempt {backoff.failures}; next in {delay:.0f}s)"
    else:
        backoff.failures, backoff.next_attempt = 0, 0.0
    for event in outcome.events:
        kapply.post_event(kube, body, event.type, event.reason, event.message)
    sync_alert_rules(kube, body, memo)
    logger.info("retune: %s: %s", outcome.reason, outcome.message)
