"""One reconcile of an InferenceDeployment: plan every pool, apply (mode ``auto``), report.

This is the seam other parts call: the kopf handlers (spec changes, node changes, resume)
call ``reconcile(body, kube=…)``; the retune timer calls it with the profiles it observed
(``profile=…`` deployment-wide, ``profiles={pool: …}`` per pool, ``profile_window=…``) and
the plans it already made for the pools it re-planned (``plans={pool: …}``, not planned
again). It knows nothing of kopf: it returns what happened (status, events, when to look
again) and the caller turns that into kopf's retry policy.

Each pool's rollout is a sequence of stages (``operator/rollout/``: plan -> render ->
canary -> apply -> observe); this module checks the spec, resolves what all pools share
(the model, the profiles, the GPU inventory), runs the stages per pool, and turns the
outcomes into conditions; ``operator/kube/status.py`` writes status.

Failure policy: a spec that can never work (bad field, unknown model, a pool that cannot fit
the model, a template that renders an invalid object) sets ``Degraded`` with a message naming
the field, the value and the fix, and leaves that pool's running objects as they are.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kvtune.operator.api import (
    OBJECT_NAME_PATTERN,
    OBJECT_NAME_RULE,
    Condition,
    InferenceDeploymentSpec,
    InferenceDeploymentStatus,
    PoolSpec,
    PoolStatus,
    ProfileScope,
    ProfileStatus,
    pair_of,
)
from kvtune.operator.api import conditions as cond
from kvtune.operator.api.dropped_fields import dropped_fields
from kvtune.operator.api.names import LABEL_DEPLOYMENT, object_name
from kvtune.operator.api.workloads import declared_profile, profile_from_status, profile_status
from kvtune.operator.calibration import calibration_flow
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import model_calibrations
from kvtune.operator.kube import pools as gpu_pools
from kvtune.operator.kube import status as status_writer
from kvtune.operator.kube.locks import object_lock
from kvtune.operator.monitoring import routing_status
from kvtune.operator.rollout import observe
from kvtune.operator.rollout.outcome import Event, PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import PlanInput, policy_for, resolve_model
from kvtune.operator.rollout.pool import rollout_pool
from kvtune.operator.rollout.pool_conditions import (
    NO_NODES_RETRY_SECONDS,
    Stamp,
    conditions_from_outcomes,
)
from kvtune.operator.routing import http_route
from kvtune.operator.routing import inference_pool as routing_module
from kvtune.operator.search import search_job_flow, search_jobs
from kvtune.tuner.errors import InvalidInput, KVTuneError, UnknownName
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.policy import PlanPolicy
from kvtune.tuner.workload import WorkloadProfile

__all__ = ["Event", "ReconcileRequest", "ReconcileResult", "reconcile", "refresh_rollout"]


@dataclass
class ReconcileResult:
    status: dict[str, Any]
    status_changed: bool
    events: list[Event] = field(default_factory=list)
    # Seconds until the caller should reconcile again (a pool without nodes, a rollout in
    # progress); None when everything is settled.
    retry_after: float | None = None
    # Set when the spec can never work as written; retrying will not help until it changes.
    permanent_error: str | None = None


def _loc(loc: tuple[Any, ...]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


# The fix for pydantic's generic errors (a spec admitted under an older CRD: issue 25).
_FIXES = {"string_pattern_mismatch": "change it to match", "string_too_long": "shorten it",
          "string_too_short": "lengthen it", "too_long": "remove entries",
          "greater_than": "raise it", "greater_than_equal": "raise it",
          "less_than": "lower it", "less_than_equal": "lower it",
          "extra_forbidden": "remove it or correct its name",
          "literal_error": "use one of the values listed"}


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem: the field path (as in YAML), the value, and what is wrong."""
    lines = []
    for err in exc.errors()[:5]:
        value = err.get("input")
        shown = json.dumps(value, default=str)[:80] if not isinstance(value, dict) else "{…}"
        fix = _FIXES.get(err["type"])
        lines.append(f"{_loc(tuple(err['loc']))}={shown}: {err['msg']}"
                     + (f" (fix: {fix})" if fix else ""))
    return "; ".join(lines)


def reconcile(
    body: Mapping[str, Any],
    *,
    kube: kapply.Kube,
    profile: WorkloadProfile | None = None,
    profiles: Mapping[str, WorkloadProfile] | None = None,
    profile_scopes: Mapping[str, ProfileScope] | None = None,
    profile_window: str | None = None,
    plans: Mapping[str, PoolPlan] | None = None,
    nodes: list[dict[str, Any]] | None = None,
    discovered: Mapping[str, gpu_pools.GPUPool] | None = None,
    now: str | None = None,
    write_status: bool = True,
    request: ReconcileRequest | None = None,
) -> ReconcileResult:
    """Plan, apply (``auto``), and write status when it changed.

    ``request``: all of the keyword arguments below as one typed value (the retune timer's
    way); when given, the others are left at their defaults.

    Each pool is planned on, first found: ``profiles[pool]`` (its scope from
    ``profile_scopes``, default ``pool``); ``profile`` (the observed deployment-wide workload,
    which is also what ``status.profile`` shows); the pool's profile kept in
    ``status.pools[].profile`` when observed; the deployment's kept in ``status.profile``;
    the spec's declared workload. ``pools[].profile`` says which, with its scope.
    ``plans[pool]``: the plan already made on ``profiles[pool]`` (not planned again).
    ``discovered``: the GPU pools as the operator's node watch holds them (else the nodes
    are listed: ``nodes``, or a list call).

    ``body`` names the object; it is read again under a per-object lock, so a caller holding
    an older copy (a queued handler, a listing made before a spec change) can never apply an
    older spec over a newer one."""
    request = request or ReconcileRequest(
        profile=profile, profiles=profiles or {}, profile_scopes=profile_scopes or {},
        profile_window=profile_window, plans=plans or {}, nodes=nodes, discovered=discovered,
        now=now, write_status=write_status)
    meta = body["metadata"]
    with object_lock(meta["namespace"], meta["name"]):
        fresh = kapply.read_inference_deployment(kube, meta["namespace"], meta["name"])
        if fresh is None:  # deleted meanwhile: the garbage collector has the children
            return ReconcileResult(status=dict(body.get("status") or {}), status_changed=False)
        try:
            return _reconcile_locked(fresh, kube=kube, request=request)
        except Exception as exc:
            # Never a failure without status: say it (the caller retries with a backoff).
            if write_status:
                _report_failure(fresh, kube, exc, now)
            raise


def _report_failure(body: Mapping[str, Any], kube: kapply.Kube, exc: Exception,
                    now: str | None) -> None:
    message = (f"the reconcile failed ({type(exc).__name__}: {str(exc)[:300]}); kvtune "
               f"retries with a growing delay; running objects are left as they are")

    def degraded(current: InferenceDeploymentStatus,
                 obj: Mapping[str, Any]) -> InferenceDeploymentStatus:
        conditions = cond.set_condition(current.conditions, cond.DEGRADED, True,
                                        cond.RECONCILE_FAILED, message,
                                        generation=obj["metadata"].get("generation"), now=now)
        return current.model_copy(update={"conditions": conditions})

    meta = body["metadata"]
    with contextlib.suppress(Exception):  # the API server may be what failed
        status_writer.update(kube, meta["namespace"], meta["name"], degraded, body=body)


@dataclass(frozen=True)
class ReconcileRequest:
    """What a caller hands the seam besides the object (``reconcile``'s keyword arguments):
    the retune timer's observed profiles and the plans it made, the GPU inventory, the clock,
    and whether to write status."""

    profile: WorkloadProfile | None = None
    profiles: Mapping[str, WorkloadProfile] = field(default_factory=dict)
    profile_scopes: Mapping[str, ProfileScope] = field(default_factory=dict)
    profile_window: str | None = None
    plans: Mapping[str, PoolPlan] = field(default_factory=dict)
    nodes: list[dict[str, Any]] | None = None
    discovered: Mapping[str, gpu_pools.GPUPool] | None = None
    now: str | None = None
    write_status: bool = True


@dataclass(frozen=True)
class _Stop:
    """A step's outcome when the reconcile ends there: the status to write and why."""

    status: InferenceDeploymentStatus
    events: list[Event]
    retry_after: float | None = None
    permanent_error: str | None = None


@dataclass(frozen=True)
class _Accepted:
    """Step 1, resolve: a spec that validates, its planner policy, the model."""

    spec: InferenceDeploymentSpec
    policy: PlanPolicy


@dataclass(frozen=True)
class _Profiles:
    """Step 2, profile: the workload each pool is planned on, and what status shows."""

    request: ReconcileRequest
    declared: WorkloadProfile
    used: WorkloadProfile
    used_status: ProfileStatus
    deployment_wide: ProfileStatus
    prev_pools: Mapping[str, PoolStatus]

    def for_pool(self, pool_name: str) -> tuple[WorkloadProfile, ProfileStatus]:
        req = self.request
        if pool_name in req.profiles:
            observed = req.profiles[pool_name]
            return observed, profile_status(observed, window=req.profile_window,
                                            observed_at=req.now,
                                            scope=req.profile_scopes.get(pool_name, "pool"))
        kept = self.prev_pools[pool_name].profile if pool_name in self.prev_pools else None
        if req.profile is not None or kept is None:  # told so, or a pool planned the first time
            return self.used, self.deployment_wide
        # The profile the pool's plan in force was made for: only the timer's accepted
        # decision (``profiles``) changes it, never a restart or an unrelated edit.
        if kept.source == "prometheus":
            return profile_from_status(kept, self.declared), kept
        return self.declared, profile_status(self.declared, scope="deployment")


@dataclass(frozen=True)
class _PoolsDone:
    """Steps 3-7 (plan, gate, render, canary, apply, observe: ``rollout_pool``) of every
    pool, with the deployment-wide failures and the pools' statuses after routing."""

    outcomes: list[PoolOutcome]
    failures: list[tuple[str, str]]
    gate: calibration_flow.Gate


def _reconcile_locked(body: Mapping[str, Any], *, kube: kapply.Kube,
                      request: ReconcileRequest) -> ReconcileResult:
    meta = body["metadata"]
    stamp = Stamp(meta.get("generation"), request.now)
    previous = status_writer.read(body)
    try:
        accepted = _resolve_spec(body)
    except (ValidationError, KVTuneError) as exc:
        return _finish(kube, body, previous, _refuse_spec(previous, exc, stamp), request)
    spec = accepted.spec
    conditions = _conditions_in_scope(list(previous.conditions), spec)
    if spec.tuning.mode == "off":
        return _finish(kube, body, previous, _tuning_off(previous, conditions, stamp), request)
    try:
        model = resolve_model(spec, meta["namespace"], kube)
    except (KVTuneError, LookupError) as exc:
        stop = _no_model(previous, conditions, spec, exc, stamp)
        return _finish(kube, body, previous, stop, request)
    events: list[Event] = []
    profiles = _choose_profiles(spec, previous, request)
    done = _roll_out_pools(kube, body, accepted, model, profiles, request, events)
    _prune(kube, body, spec, previous, stamp.generation, events)
    failures = _route_and_gate_failures(kube, body, spec, done)
    conditions, new_events = conditions_from_outcomes(
        conditions, stamp, spec=spec, previous=previous, outcomes=done.outcomes,
        failures=failures, gate=done.gate)
    events += new_events
    pool_statuses = [o.status for o in done.outcomes]
    if spec.tuning.mode == "auto" and spec.routing.enabled:
        # The pickers' availability and the gateway's word on the route, as they are now
        # (the routing-status timer follows them between reconciles).
        pool_statuses, routing_ready = routing_status.evaluate(kube, body, spec, pool_statuses)
        warning = routing_status.warning(conditions, routing_ready)
        if warning is not None:
            events.append(warning)
        conditions = stamp.set(conditions, cond.ROUTING_READY, *routing_ready)
    # What other parts keep in status (the retune timer's part of status.profile, the
    # KV-quality evidence) stays as it is.
    status = previous.model_copy(update=dict(
        observed_generation=stamp.generation, mode=spec.tuning.mode, conditions=conditions,
        profile=status_writer.with_timer_part(profiles.used_status, previous.profile),
        pools=pool_statuses,
        pool_summary=pool_summary(pool_statuses), kv_quality=done.gate.status(),
    ))
    # Rollouts are followed by the rollout timer (refresh_rollout), not by retries.
    retries = [o.retry_after for o in done.outcomes if o.retry_after is not None]
    if any(o.no_nodes for o in done.outcomes):
        retries.append(NO_NODES_RETRY_SECONDS)
    return _finish(kube, body, previous, _Stop(status, events, retry_after=min(retries)
                                               if retries else None), request)


def _finish(kube: kapply.Kube, body: Mapping[str, Any], previous: InferenceDeploymentStatus,
            stop: _Stop, request: ReconcileRequest) -> ReconcileResult:
    """Step 8: write status when it changed (one transaction), and say what happened."""
    status = stop.status
    changed = status_writer.changed(body, status)
    if changed and request.write_status:
        meta = body["metadata"]
        # This reconcile's changes, onto the status stored when it writes: a report the
        # retune timer (or another writer) stored since ``body`` was read stays.
        stored = status_writer.update(kube, meta["namespace"], meta["name"],
                                      status_writer.rebase(previous, status),
                                      body=body).status
        status = stored if stored is not None else status
    return ReconcileResult(status=status_writer.dump(status), status_changed=changed,
                           events=stop.events, retry_after=stop.retry_after,
                           permanent_error=stop.permanent_error)


def _resolve_spec(body: Mapping[str, Any]) -> _Accepted:
    """Step 1: the object's name, its spec, the planner policy, the fields the API server
    dropped; raises ValidationError or KVTuneError for a spec that can never work."""
    name = body["metadata"]["name"]
    if not re.fullmatch(OBJECT_NAME_PATTERN, name):  # the CRD's rule, for older CRDs
        raise InvalidInput("metadata.name", name, OBJECT_NAME_RULE)
    spec = InferenceDeploymentSpec.model_validate(body.get("spec") or {})
    policy = policy_for(spec)  # the SLO's and pins' own checks
    dropped = dropped_fields(body)  # pruned by the API server: never run without it
    if dropped:
        (field_, value), more = dropped[0], len(dropped) - 1
        raise InvalidInput(field_, value, "the API server dropped this field (the "
                           "InferenceDeployment has none of that name), so kvtune would "
                           "run without it. Fix: correct its name or remove it (kubectl "
                           "apply --validate=strict refuses such a field)"
                           + (f" (and {more} more)" if more else ""))
    return _Accepted(spec, policy)


def _refuse_spec(previous: InferenceDeploymentStatus, exc: ValidationError | KVTuneError,
                 stamp: Stamp) -> _Stop:
    message = describe_validation_error(exc) if isinstance(exc, ValidationError) \
        else str(exc)
    conditions = stamp.set(list(previous.conditions), cond.DEGRADED, True, cond.INVALID_SPEC,
                           message)
    conditions = stamp.set(conditions, cond.READY, False, cond.INVALID_SPEC,
                           "the spec is invalid; running objects are left as they are")
    conditions = stamp.set(conditions, cond.PROGRESSING, False, cond.INVALID_SPEC,
                           "waiting for a valid spec")
    events = []
    if previous.observed_generation != stamp.generation or not any(
            c.type == cond.DEGRADED and c.status == "True" for c in previous.conditions):
        events.append(Event("Warning", cond.INVALID_SPEC, message))
    status = previous.model_copy(update={"observed_generation": stamp.generation,
                                         "conditions": conditions})
    return _Stop(status, events, permanent_error=message)


def _conditions_in_scope(conditions: list[Condition],
                         spec: InferenceDeploymentSpec) -> list[Condition]:
    """The conditions of parts the spec no longer runs are dropped."""
    if spec.runtime.entrypoint != "kvtune":  # no runtime reports without kvtune's entrypoint
        conditions = [c for c in conditions if c.type != cond.RUNTIME_AS_PLANNED]
    if not spec.routing.enabled or spec.tuning.mode != "auto":  # no routing objects applied
        conditions = [c for c in conditions if c.type != cond.ROUTING_READY]
    return conditions


def _tuning_off(previous: InferenceDeploymentStatus, conditions: list[Condition],
                stamp: Stamp) -> _Stop:
    conditions = stamp.set(conditions, cond.READY, True, cond.TUNING_OFF,
                           "tuning is off: kvtune leaves the runtime as it is")
    conditions = stamp.set(conditions, cond.PROGRESSING, False, cond.TUNING_OFF,
                           "nothing to roll out")
    conditions = stamp.set(conditions, cond.DEGRADED, False, cond.AS_EXPECTED, "")
    pools_off = [p.model_copy(update={"phase": "Unmanaged", "message": "tuning.mode=off"})
                 for p in previous.pools]
    status = previous.model_copy(update={"observed_generation": stamp.generation,
                                         "mode": "off", "conditions": conditions,
                                         "pools": pools_off})
    return _Stop(status, [])


def _no_model(previous: InferenceDeploymentStatus, conditions: list[Condition],
              spec: InferenceDeploymentSpec, exc: Exception, stamp: Stamp) -> _Stop:
    """The model (shared by all pools) could not be resolved."""
    reason = cond.UNKNOWN_MODEL if isinstance(exc, UnknownName) else cond.INVALID_SPEC
    conditions = stamp.set(conditions, cond.DEGRADED, True, reason, str(exc))
    conditions = stamp.set(conditions, cond.READY, False, reason,
                           "no plan without a model; running objects are left as they are")
    conditions = stamp.set(conditions, cond.PROGRESSING, False, reason,
                           "waiting for a valid model")
    events = []
    before = cond.get_condition(previous.conditions, cond.DEGRADED)
    if before is None or (before.status, before.message) != ("True", str(exc)):
        events.append(Event("Warning", reason, str(exc)))  # once, not on every retry
    status = previous.model_copy(update={"observed_generation": stamp.generation,
                                         "mode": spec.tuning.mode, "conditions": conditions})
    # A missing ConfigMap may appear later: retry; an unknown catalog id will not.
    if isinstance(exc, LookupError):
        return _Stop(status, events, retry_after=NO_NODES_RETRY_SECONDS)
    return _Stop(status, events, permanent_error=str(exc))


def _choose_profiles(spec: InferenceDeploymentSpec, previous: InferenceDeploymentStatus,
                     request: ReconcileRequest) -> _Profiles:
    """Step 2: the deployment-wide workload (observed, kept, or declared)."""
    declared = declared_profile(spec.workload)
    if request.profile is not None:
        used = request.profile
        used_status = profile_status(used, window=request.profile_window,
                                     observed_at=request.now)
    else:
        used = profile_from_status(previous.profile, declared)
        used_status = previous.profile if used.source == "prometheus" \
            and previous.profile is not None \
            else profile_status(used)
    deployment_wide = status_writer.without_timer_part(
        used_status.model_copy(update={"scope": "deployment"}))
    return _Profiles(request=request, declared=declared, used=used, used_status=used_status,
                     deployment_wide=deployment_wide,
                     prev_pools={p.name: p for p in previous.pools})


def _roll_out_pools(kube: kapply.Kube, body: Mapping[str, Any], accepted: _Accepted,
                    model: Any, profiles: _Profiles, request: ReconcileRequest,
                    events: list[Event]) -> _PoolsDone:
    """Steps 3-7 per pool (``rollout_pool``), after the KV-quality gate is prepared; then
    the HTTPRoute over the routed pools."""
    spec = accepted.spec
    # The KV-quality evidence of the served model revision, and its calibration Job.
    gate = calibration_flow.prepare(kube, body, spec)
    # The closed loop's model calibrations (operator/kube/model_calibrations.py): one read.
    calibrations = model_calibrations.read_or_none(kube)
    discovered = request.discovered
    if discovered is None:
        discovered = gpu_pools.discover_pools(request.nodes if request.nodes is not None
                                              else kapply.list_nodes(kube))
    outcomes = []
    for i, pool in enumerate(spec.pools):
        # A prefill/decode pair is planned on one traffic, its decode pool's.
        pair = pair_of(spec.pools, pool)
        pool_profile, pool_profile_status = profiles.for_pool(
            pair[1].pool_name if pair is not None else pool.pool_name)
        ctx = PoolContext(spec=spec, index=i, pool=pool, body=body, kube=kube,
                          now=request.now or cond.now_rfc3339(),
                          base=base_status(spec, pool, profiles.prev_pools.get(pool.pool_name),
                                           body["metadata"]["name"]),
                          events=events)
        outcomes.append(rollout_pool(ctx, PlanInput(
            model=model, profile=pool_profile, policy=accepted.policy,
            profile_used=pool_profile_status,
            given=request.plans.get(pool.pool_name) if pool.pool_name in request.profiles
            else None,
            gate=gate, calibrations=calibrations,
        ), discovered))
    return _PoolsDone(outcomes=outcomes, failures=[o.failure for o in outcomes if o.failure],
                      gate=gate)


def _prune(kube: kapply.Kube, body: Mapping[str, Any], spec: InferenceDeploymentSpec,
           previous: InferenceDeploymentStatus, generation: int | None,
           events: list[Event]) -> None:
    """The children of pools no longer in the spec, and routing no longer asked for."""
    kept = {p.pool_name for p in spec.pools}
    if spec.tuning.mode == "auto" and may_have_removed_pools(generation, previous, kept):
        for deleted in kapply.prune_pools(kube, body, kept):
            events.append(Event("Normal", "PoolRemoved", f"deleted {deleted}: its pool is no "
                                "longer in the spec"))
        # Only where the chart enabled routing (its rights, and the only place kvtune made
        # routing objects): no extra calls per reconcile elsewhere.
        routed = routing_module.operator_enabled()
        for deleted in kapply.prune_routing(
                kube, body, routing=spec.routing.enabled,
                route=spec.routing.enabled and spec.routing.gateway is not None,
                keep=kept) if routed else []:
            events.append(Event("Normal", "RoutingRemoved", f"deleted {deleted}: "
                                "spec.routing no longer asks for it"))
    removed = {p.name for p in previous.pools} - kept
    if removed and search_jobs.settings().mode != "inProcess":
        # its search Jobs and ConfigMaps (operator/search/search_jobs.py)
        for gone in sorted(removed):
            search_job_flow.delete_stale(kube, body, gone, keep=None)


def _route_and_gate_failures(kube: kapply.Kube, body: Mapping[str, Any],
                             spec: InferenceDeploymentSpec, done: _PoolsDone
                             ) -> list[tuple[str, str]]:
    """The pools' failures, the HTTPRoute's (applied over the routed pools) and the
    calibration Job's name collision, in that order."""
    failures = list(done.failures)
    if spec.tuning.mode == "auto":
        refused = _apply_route(kube, body, spec, [o.status for o in done.outcomes])
        if refused is not None:
            failures.append(refused)
    if done.gate.collision is not None:
        failures.append((cond.NAME_COLLISION, done.gate.collision))
    return failures


def _apply_route(kube: kapply.Kube, body: Mapping[str, Any], spec: InferenceDeploymentSpec,
                 pools: list[PoolStatus]) -> tuple[str, str] | None:
    """Apply the HTTPRoute of ``spec.routing.gateway`` over the pools that are routed; the
    failure (reason, message) when the API server refused it."""
    meta = body["metadata"]
    route = http_route.route_for(
        name=meta["name"], namespace=meta["namespace"],
        labels={LABEL_DEPLOYMENT: meta["name"]}, routing=spec.routing, pools=pools,
        inference_pool_name={p.pool_name: object_name(meta["name"], p.pool_name)
                             for p in spec.pools})
    if route is None:
        return None
    try:
        kapply.apply_pool(kube, [route], body)
    except kapply.ApplyError as exc:
        reason = cond.NAME_COLLISION if isinstance(exc, kapply.NameCollision) \
            else cond.APPLY_FAILED
        return reason, (f"spec.routing.gateway: the HTTPRoute {meta['name']}: {exc} (Gateway "
                        f"API's CRDs {http_route.GATEWAY_API_VERSION} or later, experimental "
                        f"channel for sessionHeader, must be installed)")
    return None


def may_have_removed_pools(generation: int | None, previous: InferenceDeploymentStatus,
                           pools: set[str]) -> bool:
    """Whether children of a pool no longer in the spec may exist (prune lists three kinds
    in the namespace: at 1,000 objects, three lists of 1,000 per reconcile). Not while the
    spec is its first (generation 1: every pool ever applied is in it) and status names no
    other pool (a pool an older kvtune named otherwise, or a spec edited while the operator
    was down, is named there or bumps the generation)."""
    return generation != 1 or any(p.name not in pools for p in previous.pools)


def base_status(spec: InferenceDeploymentSpec, pool: PoolSpec, prev: PoolStatus | None,
                name: str) -> PoolStatus:
    """A pool's status before this reconcile's stages: what it runs now (a failing pool
    keeps showing it)."""
    return PoolStatus(
        name=pool.pool_name, gpu_class=pool.gpu_class,
        # tensorParallel auto: what the pool runs (0 until a degree is chosen).
        tensor_parallel=(pool.tensor_parallel if isinstance(pool.tensor_parallel, int)
                         else prev.tensor_parallel if prev else 0),
        replicas=pool.replicas if not pool.tp_auto or prev is None else prev.replicas,
        phase="Failed", deployment=object_name(name, pool.pool_name),
        plan=prev.plan if prev else None, expected=prev.expected if prev else None,
        reasons=list(prev.reasons) if prev else [], vllm_args=list(prev.vllm_args) if prev
        else [], plan_hash=prev.plan_hash if prev else None, revision=prev.revision if prev
        else 0, canary=prev.canary if prev else None,
        plan_inputs=prev.plan_inputs if prev else None,
        warnings=list(prev.warnings) if prev else [],
        slo_at_risk=prev.slo_at_risk if prev else None, cost=prev.cost if prev else None,
        reuse=prev.reuse if prev else None, observed_reuse=prev.observed_reuse if prev else None,
        rejected_plan_hash=prev.rejected_plan_hash if prev else None,
        # What the runtime reported is refreshed by the runtime-reports timer only.
        runtime=prev.runtime if prev and spec.runtime.entrypoint == "kvtune" else None,
        profile=prev.profile if prev else None,
        # The retune timer's reading of the pool's histograms stays until its next window.
        observed_slo=prev.observed_slo if prev else None,
        # What routing was applied with (the stable plan's max-model-len) until the main
        # Deployment takes another plan; dropped with spec.routing.
        routing=prev.routing if prev and spec.routing.enabled else None,
    )


def pool_summary(pools: list[PoolStatus]) -> str:
    """``H200x2,H100x1`` for the printer column (kubectl prints only one item of a list)."""
    return ",".join(f"{p.gpu_class}x{p.replicas}" for p in pools)


def refresh_rollout(body: Mapping[str, Any], *, kube: kapply.Kube,
                    now: str | None = None) -> bool:
    """Re-read the pool Deployments of an ``auto`` InferenceDeployment and update
    Progressing/Ready and the pools' messages; nothing is planned or applied. Called when a
    child Deployment changes. Returns whether status was written.

    One status transaction (``status.update``): it never overwrites a status written since
    (a concurrent reconcile's, the retune timer's). ``body`` is its first try, not read
    again (the timer's copy is the watch's latest; with 1,000 objects rolling out, one GET
    less per look); a copy that was already old is read again and refreshed once more."""
    meta = body["metadata"]
    namespace = meta["namespace"]

    def refreshed(current: InferenceDeploymentStatus,
                  _obj: Mapping[str, Any]) -> InferenceDeploymentStatus | None:
        return observe.refresh(current, namespace, kube, now)

    with object_lock(namespace, meta["name"]):
        return status_writer.update(kube, namespace, meta["name"], refreshed,
                                    body=body).written
