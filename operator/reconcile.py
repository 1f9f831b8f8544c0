"""One reconcile of an InferenceDeployment: plan every pool, apply (mode ``auto``), report.

This is the seam other parts call: the kopf handlers (spec changes, node changes, resume)
call ``reconcile(body, kube=…)``; the retune timer calls it with the profiles it observed
(``profile=…`` deployment-wide, ``profiles={pool: …}`` per pool, ``profile_window=…``).
It knows nothing of kopf: it returns what happened (status, events, when to look again) and
the caller turns that into kopf's retry policy.

Failure policy: a spec that can never work (bad field, unknown model, a pool that cannot fit
the model, a template that renders an invalid object) sets ``Degraded`` with a message naming
the field, the value and the fix, and leaves that pool's running objects as they are.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from kvtune.operator import apply as kapply
from kvtune.operator import calibration_flow, canary
from kvtune.operator import conditions as cond
from kvtune.operator import pools as gpu_pools
from kvtune.operator.api import (
    CanaryStatus,
    Condition,
    ExpectedStatus,
    InferenceDeploymentSpec,
    InferenceDeploymentStatus,
    PlanStatus,
    PoolSpec,
    PoolStatus,
    ProfileScope,
    ProfileStatus,
    RolloutSpec,
)
from kvtune.operator.durations import parse_duration
from kvtune.operator.render import (
    ANNOTATION_PLAN_HASH,
    RenderError,
    RenderInput,
    object_name,
    plan_hash,
    render_pool,
)
from kvtune.operator.render import vllm_args as render_vllm_args
from kvtune.operator.workloads import declared_profile, profile_from_status, profile_status
from kvtune.tuner.errors import KVTuneError, NoFeasiblePlan, UnknownName
from kvtune.tuner.kv_quality import KVQualityEvidence, KVQualityPolicy
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.policy import SLO, Pins, PlanPolicy
from kvtune.tuner.units import GiB
from kvtune.tuner.workload import WorkloadProfile

NO_NODES_RETRY_SECONDS = 30.0
RUNTIME_ACCESS_KINDS = ("ServiceAccount", "Role", "RoleBinding")


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


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


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem: the field path (as in YAML), the value, and what is wrong."""
    lines = []
    for err in exc.errors()[:5]:
        value = err.get("input")
        shown = json.dumps(value, default=str)[:80] if not isinstance(value, dict) else "{…}"
        lines.append(f"{_loc(tuple(err['loc']))}={shown}: {err['msg']}")
    return "; ".join(lines)


def policy_for(spec: InferenceDeploymentSpec) -> PlanPolicy:
    pin = spec.tuning.pin
    pins = Pins() if pin is None else pin.to_pins()
    slo = SLO() if spec.slo is None else SLO(
        ttft_p95_seconds=spec.slo.ttft_p95_seconds(), tpot_p95_seconds=spec.slo.tpot_p95_seconds()
    )
    ctx = spec.workload.context_tokens
    return PlanPolicy(
        slo=slo,
        lowest_kv_precision=spec.quality.lowest_kv_precision if spec.quality else "fp8",
        pins=pins,
        target_concurrent_sequences=spec.workload.concurrent_sequences,
        # The spec promises clients its declared max context: never plan below it.
        min_max_model_len_tokens=ctx.max if ctx is not None else None,
        kv_quality=KVQualityPolicy() if spec.quality is None else KVQualityPolicy(
            max_kv_quantization_kl=spec.quality.max_kv_quantization_kl,
            require_measurement=spec.quality.require_measurement),
        cpu_offload_budget_bytes=round(spec.tuning.cpu_offload_gib * GiB),
    )


def resolve_model(spec: InferenceDeploymentSpec, namespace: str, kube: kapply.Kube | None) -> Any:
    """The model's architecture: from its ConfigMap'd config.json, else from the catalog.

    Only catalog ids are looked up (never a path): the model name is user input.
    """
    from kvtune.tuner.facts.catalog import get_model, list_models
    from kvtune.tuner.facts.models import ModelArchitecture

    if spec.model.config is not None:
        ref = spec.model.config.config_map_ref
        if kube is None:
            raise LookupError("spec.model.config: no API access to read the ConfigMap")
        text = kapply.read_config_map_key(kube, namespace, ref.name, ref.key,
                                          field="spec.model.config.configMapRef")
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LookupError(f"spec.model.config.configMapRef: ConfigMap {ref.name} key "
                              f"{ref.key!r} is not JSON ({exc}); put the model's config.json "
                              f"there") from exc
        return ModelArchitecture.from_hf_config(config, spec.model.name,
                                                source=f"configmap/{ref.name}")
    known = {m.lower() for m in list_models()} | {m.split("/")[-1].lower() for m in list_models()}
    if spec.model.name.lower() not in known:
        raise UnknownName(
            "spec.model.name", spec.model.name, [],
            "It is not in kvtune's catalog: set spec.model.config.configMapRef to a ConfigMap "
            "holding its config.json, or use a catalog id (`kvtune plan --list-models`).",
        )
    return get_model(spec.model.name)


def plan_one_pool(spec: InferenceDeploymentSpec, pool: PoolSpec, model: Any,
                  profile: WorkloadProfile, policy: PlanPolicy,
                  kv_quality_evidence: KVQualityEvidence | None = None) -> PoolPlan:
    from kvtune.tuner.facts.gpus import get_gpu_class
    from kvtune.tuner.planner.planning import PlanRequest, plan_pool

    request = PlanRequest(
        model=model, gpu=get_gpu_class(pool.gpu_declaration),
        tensor_parallel=pool.tensor_parallel,
        weights_dtype=spec.model.weights_dtype, profile=profile, policy=policy,
        vllm_version=spec.runtime.vllm_version, kv_quality_evidence=kv_quality_evidence,
    )
    result: PoolPlan = plan_pool(request)
    return result


_PIN_FIELD = re.compile(r"\bpins\.([a-z_]+)")


def spec_field_names(exc: Exception) -> str:
    """The planner names pins as ``pins.kv_cache_dtype``; the user wrote
    ``spec.tuning.pin.kvCacheDtype``: say it the user's way."""
    def camel(match: re.Match[str]) -> str:
        return "spec.tuning.pin." + to_camel(match.group(1)).replace("Gib", "GiB")

    return _PIN_FIELD.sub(camel, str(exc))


def _plan_status(pool_plan: PoolPlan) -> tuple[PlanStatus, ExpectedStatus, list[str]]:
    knobs = PlanStatus.model_validate(pool_plan.plan.model_dump())
    expected = ExpectedStatus.model_validate(pool_plan.expected.model_dump())
    reasons = [f"{r.knob}={r.choice}: {r.message}" for r in pool_plan.reasons]
    return knobs, expected, reasons


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) turning ``old`` into ``new``: keys that disappeared are
    nulled at every depth (else the server keeps them); lists are replaced whole."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def _dump(status: InferenceDeploymentStatus) -> dict[str, Any]:
    data: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return data


def dump_status(status: InferenceDeploymentStatus) -> dict[str, Any]:
    """Status as written to the API (camelCase, no nulls): what "changed" compares."""
    return _dump(status)


def _previous_status(body: Mapping[str, Any]) -> InferenceDeploymentStatus:
    raw = dict(body.get("status") or {})
    try:
        return InferenceDeploymentStatus.model_validate(raw)
    except ValidationError:
        # A status written by an older kvtune: start over rather than fail the reconcile.
        return InferenceDeploymentStatus()


@dataclass
class _PoolOutcome:
    status: PoolStatus
    failure: tuple[str, str] | None = None  # (reason, message)
    rolling: str | None = None  # what a rollout still waits for
    no_nodes: bool = False


_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextmanager
def object_lock(namespace: str, name: str) -> Iterator[None]:
    """One reconcile per object at a time in this process (kopf's handlers, the GPU-inventory
    thread and the retune timer all call in)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault((namespace, name), threading.Lock())
    with lock:
        yield


def reconcile(
    body: Mapping[str, Any],
    *,
    kube: kapply.Kube,
    profile: WorkloadProfile | None = None,
    profiles: Mapping[str, WorkloadProfile] | None = None,
    profile_scopes: Mapping[str, ProfileScope] | None = None,
    profile_window: str | None = None,
    nodes: list[dict[str, Any]] | None = None,
    now: str | None = None,
    write_status: bool = True,
) -> ReconcileResult:
    """Plan, apply (``auto``), and write status when it changed.

    Each pool is planned on, first found: ``profiles[pool]`` (its scope from
    ``profile_scopes``, default ``pool``); ``profile`` (the observed deployment-wide workload,
    which is also what ``status.profile`` shows); the pool's profile kept in
    ``status.pools[].profile`` when observed; the deployment's kept in ``status.profile``;
    the spec's declared workload. ``pools[].profile`` says which, with its scope.

    ``body`` names the object; it is read again under a per-object lock, so a caller holding
    an older copy (a queued handler, a listing made before a spec change) can never apply an
    older spec over a newer one."""
    meta = body["metadata"]
    with object_lock(meta["namespace"], meta["name"]):
        fresh = kapply.read_inference_deployment(kube, meta["namespace"], meta["name"])
        if fresh is None:  # deleted meanwhile: the garbage collector has the children
            return ReconcileResult(status=dict(body.get("status") or {}), status_changed=False)
        return _reconcile_locked(fresh, kube=kube, profile=profile,
                                 profiles=profiles or {}, profile_scopes=profile_scopes or {},
                                 profile_window=profile_window, nodes=nodes, now=now,
                                 write_status=write_status)


def _reconcile_locked(
    body: Mapping[str, Any],
    *,
    kube: kapply.Kube,
    profile: WorkloadProfile | None,
    profiles: Mapping[str, WorkloadProfile],
    profile_scopes: Mapping[str, ProfileScope],
    profile_window: str | None,
    nodes: list[dict[str, Any]] | None,
    now: str | None,
    write_status: bool,
) -> ReconcileResult:
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    generation = meta.get("generation")
    previous = _previous_status(body)
    events: list[Event] = []
    conditions: list[Condition] = list(previous.conditions)

    def set_c(type_: str, ok: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = cond.set_condition(conditions, type_, ok, reason, message,
                                        generation=generation, now=now)

    def finish(status: InferenceDeploymentStatus, **kw: Any) -> ReconcileResult:
        new, old = _dump(status), _dump(previous)
        changed = new != old
        if changed and write_status:
            stored = dict(body.get("status") or {})
            kapply.patch_status(kube, namespace, name, merge_patch(stored, new))
        return ReconcileResult(status=new, status_changed=changed, events=events, **kw)

    try:
        spec = InferenceDeploymentSpec.model_validate(body.get("spec") or {})
        if spec.slo is not None:  # durations are checked here too, not only by the CRD
            spec.slo.ttft_p95_seconds()
            spec.slo.tpot_p95_seconds()
    except (ValidationError, KVTuneError) as exc:
        message = describe_validation_error(exc) if isinstance(exc, ValidationError) \
            else str(exc)
        set_c(cond.DEGRADED, True, cond.INVALID_SPEC, message)
        set_c(cond.READY, False, cond.INVALID_SPEC, "the spec is invalid; running objects are "
              "left as they are")
        set_c(cond.PROGRESSING, False, cond.INVALID_SPEC, "waiting for a valid spec")
        if previous.observed_generation != generation or not any(
                c.type == cond.DEGRADED and c.status == "True" for c in previous.conditions):
            events.append(Event("Warning", cond.INVALID_SPEC, message))
        status = previous.model_copy(update={"observed_generation": generation,
                                             "conditions": conditions})
        return finish(status, permanent_error=message)

    if spec.runtime.entrypoint != "kvtune":  # no runtime reports without kvtune's entrypoint
        conditions = [c for c in conditions if c.type != cond.RUNTIME_AS_PLANNED]

    mode = spec.tuning.mode
    if mode == "off":
        set_c(cond.READY, True, cond.TUNING_OFF, "tuning is off: kvtune leaves the runtime as "
              "it is")
        set_c(cond.PROGRESSING, False, cond.TUNING_OFF, "nothing to roll out")
        set_c(cond.DEGRADED, False, cond.AS_EXPECTED, "")
        pools_off = [p.model_copy(update={"phase": "Unmanaged", "message": "tuning.mode=off"})
                     for p in previous.pools]
        status = previous.model_copy(update={"observed_generation": generation, "mode": mode,
                                             "conditions": conditions, "pools": pools_off})
        return finish(status)

    # The model and the workload are shared by all pools.
    try:
        model = resolve_model(spec, namespace, kube)
    except (KVTuneError, LookupError) as exc:
        reason = cond.UNKNOWN_MODEL if isinstance(exc, UnknownName) else cond.INVALID_SPEC
        set_c(cond.DEGRADED, True, reason, str(exc))
        set_c(cond.READY, False, reason, "no plan without a model; running objects are left "
              "as they are")
        set_c(cond.PROGRESSING, False, reason, "waiting for a valid model")
        before = cond.get_condition(previous.conditions, cond.DEGRADED)
        if before is None or (before.status, before.message) != ("True", str(exc)):
            events.append(Event("Warning", reason, str(exc)))  # once, not on every retry
        status = previous.model_copy(update={"observed_generation": generation, "mode": mode,
                                             "conditions": conditions})
        # A missing ConfigMap may appear later: retry; an unknown catalog id will not.
        if isinstance(exc, LookupError):
            return finish(status, retry_after=NO_NODES_RETRY_SECONDS)
        return finish(status, permanent_error=str(exc))

    declared = declared_profile(spec.workload)
    if profile is not None:
        used_profile = profile
        used_profile_status = profile_status(profile, window=profile_window, observed_at=now)
    else:
        used_profile = profile_from_status(previous.profile, declared)
        used_profile_status = previous.profile if used_profile.source == "prometheus" \
            and previous.profile is not None else profile_status(used_profile)
    deployment_wide = used_profile_status.model_copy(update={"scope": "deployment"})
    prev_pools = {p.name: p for p in previous.pools}

    def for_pool(pool_name: str) -> tuple[WorkloadProfile, ProfileStatus]:
        if pool_name in profiles:
            observed = profiles[pool_name]
            return observed, profile_status(observed, window=profile_window, observed_at=now,
                                            scope=profile_scopes.get(pool_name, "pool"))
        kept = prev_pools[pool_name].profile if pool_name in prev_pools else None
        if profile is None and kept is not None and kept.source == "prometheus":
            return profile_from_status(kept, declared), kept
        return used_profile, deployment_wide

    policy = policy_for(spec)
    # The KV-quality evidence of the served model revision, and its calibration Job.
    gate = calibration_flow.prepare(kube, body, spec)
    discovered = gpu_pools.discover_pools(nodes if nodes is not None
                                          else kapply.list_nodes(kube))
    outcomes = []
    for i, pool in enumerate(spec.pools):
        pool_profile, pool_profile_status = for_pool(pool.pool_name)
        outcomes.append(_reconcile_pool(
            spec, i, pool, model, pool_profile, policy, discovered,
            prev_pools.get(pool.pool_name), body, kube, events, now,
            profile_used=pool_profile_status, gate=gate))
    if mode == "auto":
        for deleted in kapply.prune_pools(kube, namespace, name,
                                          {p.pool_name for p in spec.pools}):
            events.append(Event("Normal", "PoolRemoved", f"deleted {deleted}: its pool is no "
                                "longer in the spec"))

    failures = [o.failure for o in outcomes if o.failure]
    rolling = [f"{o.status.name}: {o.rolling}" for o in outcomes if o.rolling]
    waiting = [o.status.name for o in outcomes if o.no_nodes]
    if failures:
        set_c(cond.DEGRADED, True, failures[0][0], " | ".join(m for _, m in failures))
    else:
        set_c(cond.DEGRADED, False, cond.AS_EXPECTED, "")
    if rolling:
        set_c(cond.PROGRESSING, True, cond.ROLLING_OUT, "; ".join(rolling))
    else:
        set_c(cond.PROGRESSING, False, cond.ROLLED_OUT if mode == "auto" else cond.RECOMMENDED,
              "every pool runs its current plan" if mode == "auto"
              else "plans are in status; nothing is applied (tuning.mode=recommend)")
    if failures:
        set_c(cond.READY, False, failures[0][0], failures[0][1])
    elif waiting:
        set_c(cond.READY, False, cond.POOL_WITHOUT_NODES,
              f"no schedulable nodes of the GPU class for pool(s) {', '.join(waiting)}; "
              f"retrying every {NO_NODES_RETRY_SECONDS:.0f}s")
    elif rolling:
        set_c(cond.READY, False, cond.ROLLING_OUT, "; ".join(rolling))
    elif mode == "recommend":
        set_c(cond.READY, True, cond.RECOMMENDED,
              f"{len(outcomes)} pool plan(s) recommended in status; nothing applied")
    else:
        set_c(cond.READY, True, cond.ALL_POOLS_APPLIED,
              f"{len(outcomes)} pool(s) run their plan")

    status = InferenceDeploymentStatus(
        observed_generation=generation, mode=mode, conditions=conditions,
        profile=used_profile_status, pools=[o.status for o in outcomes],
        pool_summary=pool_summary([o.status for o in outcomes]), kv_quality=gate.status(),
    )
    # Rollouts are followed by the rollout timer (refresh_rollout), not by retries.
    return finish(status, retry_after=NO_NODES_RETRY_SECONDS if waiting else None)


def _reconcile_pool(
    spec: InferenceDeploymentSpec, index: int, pool: PoolSpec, model: Any,
    profile: WorkloadProfile, policy: PlanPolicy, discovered: Mapping[str, gpu_pools.GPUPool],
    prev: PoolStatus | None, body: Mapping[str, Any], kube: kapply.Kube, events: list[Event],
    now: str | None = None, profile_used: ProfileStatus | None = None,
    gate: calibration_flow.Gate | None = None,
) -> _PoolOutcome:
    """``profile_used``: how ``profile`` is shown in the pool's status (scope, window)."""
    now = now or cond.now_rfc3339()
    meta = body["metadata"]
    field_ = f"spec.pools[{index}]"
    base = PoolStatus(
        name=pool.pool_name, gpu_class=pool.gpu_class, tensor_parallel=pool.tensor_parallel,
        replicas=pool.replicas, phase="Failed",
        deployment=object_name(meta["name"], pool.pool_name),
        # A failing pool keeps showing what it runs now.
        plan=prev.plan if prev else None, expected=prev.expected if prev else None,
        reasons=list(prev.reasons) if prev else [], vllm_args=list(prev.vllm_args) if prev
        else [], plan_hash=prev.plan_hash if prev else None, revision=prev.revision if prev
        else 0, canary=prev.canary if prev else None,
        rejected_plan_hash=prev.rejected_plan_hash if prev else None,
        # What the runtime reported is refreshed by the runtime-reports timer only.
        runtime=prev.runtime if prev and spec.runtime.entrypoint == "kvtune" else None,
        profile=prev.profile if prev else None,
    )

    def failed(reason: str, message: str) -> _PoolOutcome:
        return _PoolOutcome(base.model_copy(update={"phase": "Failed", "message": message}),
                            failure=(reason, message))

    try:
        pool_plan = plan_one_pool(
            spec, pool, model, profile,
            calibration_flow.with_gate(policy, gate) if gate is not None else policy,
            gate.evidence if gate is not None else None)
    except UnknownName as exc:
        return failed(cond.INVALID_SPEC, f"{field_}.gpuClass: {exc}")
    except NoFeasiblePlan as exc:
        return failed(cond.NO_FEASIBLE_PLAN, f"{field_} ({pool.gpu_class}, "
                      f"tensorParallel={pool.tensor_parallel}): {exc}")
    except KVTuneError as exc:
        return failed(cond.INVALID_SPEC, f"{field_} ({pool.gpu_class}): {spec_field_names(exc)}")

    gpu_class = pool_plan.gpu_class
    knobs, expected, reasons = _plan_status(pool_plan)
    hash_ = plan_hash(pool_plan, spec.runtime.image)
    revision = base.revision if base.plan_hash == hash_ else base.revision + 1
    inp = RenderInput(
        name=meta["name"], namespace=meta["namespace"], pool=pool.pool_name,
        pool_plan=pool_plan, model_name=spec.model.name, image=spec.runtime.image,
        replicas=pool.replicas, revision=revision, entrypoint=spec.runtime.entrypoint,
        progress_deadline_seconds=(spec.rollout or RolloutSpec()).progress_deadline_seconds(),
        node_selector=dict(pool.node_selector or {}),
        tolerations=[t.model_dump(by_alias=True, exclude_none=True)
                     for t in pool.tolerations or []],
    )
    planned = base.model_copy(update={
        "gpu_class": gpu_class, "plan": knobs, "expected": expected, "reasons": reasons,
        "warnings": list(pool_plan.warnings), "vllm_args": render_vllm_args(inp),
        "plan_hash": hash_, "revision": revision, "message": "", "profile": profile_used,
    })
    if base.plan_hash != hash_:
        events.append(Event("Normal", "PlanChanged", f"pool {pool.pool_name} ({gpu_class}) "
                            f"plan revision {revision}: {' '.join(pool_plan.plan.vllm_args())}"))

    nodes = discovered.get(gpu_class.upper())
    node_count = len(nodes.schedulable_nodes) if nodes else 0
    planned = planned.model_copy(update={"nodes": node_count})
    if spec.tuning.mode == "recommend":
        return _PoolOutcome(planned.model_copy(update={
            "phase": "Recommended", "message": "tuning.mode=recommend: not applied"}))
    if nodes is None or node_count == 0 or nodes.node_affinity() is None:
        return _PoolOutcome(planned.model_copy(update={
            "phase": "NoNodes",
            "message": f"no schedulable node is labelled as a {gpu_class} GPU; label the "
                       f"nodes (e.g. nvidia.com/gpu.product) or add nodes to the pool"}),
            no_nodes=True)
    if nodes.max_gpus_per_node and nodes.max_gpus_per_node < pool.tensor_parallel:
        return failed(cond.INVALID_SPEC, f"{field_}.tensorParallel={pool.tensor_parallel}: "
                      f"{gpu_class} nodes have at most {nodes.max_gpus_per_node} GPUs; lower "
                      f"tensorParallel or add larger nodes")

    template = None
    if spec.runtime.pod_template is not None:
        ref = spec.runtime.pod_template.config_map_ref
        try:
            template = kapply.read_config_map_key(kube, meta["namespace"], ref.name, ref.key,
                                                  field="spec.runtime.podTemplate.configMapRef")
        except LookupError as exc:
            return failed(cond.INVALID_POD_TEMPLATE, str(exc))
    inp = RenderInput(**{**inp.__dict__, "affinity": nodes.node_affinity(),
                         "pod_template": template})
    namespace = meta["namespace"]
    # What the Deployment runs now (the plan in status may be one only recommended).
    running = kapply.read_deployment(kube, namespace, object_name(meta["name"],
                                                                  pool.pool_name))
    running_hash = ((running or {}).get("metadata", {}).get("annotations") or {}).get(
        ANNOTATION_PLAN_HASH)
    try:
        objects = render_pool(inp)
    except RenderError as exc:
        return failed(cond.INVALID_POD_TEMPLATE, f"pool {pool.pool_name}: {exc}; nothing was "
                      f"changed")
    if gate is not None and not gate.hold:
        # A narrower KV dtype no measurement covers: measure it first (a Job on this pool's
        # nodes, as this pool's pod), and plan the pool again with the wider dtype held.
        deployment_obj = next(o for o in objects if o["kind"] == "Deployment")
        try:
            started = calibration_flow.maybe_start(kube, body, spec, gate, pool_plan,
                                                   deployment_obj)
        except kapply.ApplyError as exc:
            return failed(cond.APPLY_FAILED, f"pool {pool.pool_name}: the KV-quality "
                          f"calibration Job: {exc}")
        if started:
            events.append(Event("Normal", "CalibrationStarted", f"pool {pool.pool_name}: Job "
                                f"{gate.started_jobs[-1]} measures "
                                f"{pool_plan.plan.kv_cache_dtype} before it rolls out"))
            return _reconcile_pool(spec, index, pool, model, profile, policy, discovered,
                                   prev, body, kube, events, now, profile_used, gate)

    # The runtime's ServiceAccount, Role, RoleBinding (entrypoint kvtune) come first, for
    # real, one by one: the pods (canary ones too) run as it, and the RoleBinding's dry run
    # needs the Role to exist.
    access = [o for o in objects if o["kind"] in RUNTIME_ACCESS_KINDS]
    objects = [o for o in objects if o["kind"] not in RUNTIME_ACCESS_KINDS]
    try:
        kapply.apply_each(kube, access, body)
    except kapply.ApplyError as exc:
        return failed(cond.APPLY_FAILED, f"pool {pool.pool_name}: the runtime's access "
                      f"(spec.runtime.entrypoint=kvtune): {exc}")

    rollout = spec.rollout or RolloutSpec()
    canary_name = object_name(meta["name"], f"{pool.pool_name}-canary")
    prev_canary = base.canary
    canary_dep = kapply.read_deployment(kube, namespace, canary_name) if prev_canary else None
    decision = canary.decide(
        canary_replicas=rollout.canary_replicas, replicas=pool.replicas,
        running_hash=running_hash, new_hash=hash_,
        canary_hash=prev_canary.plan_hash if prev_canary else None,
        canary_started_at=prev_canary.started_at if prev_canary else None,
        rejected_hash=base.rejected_plan_hash, canary_deployment=canary_dep, now=now,
        analysis_seconds=parse_duration(rollout.analysis, field="spec.rollout.analysis"),
        deadline_seconds=rollout.progress_deadline_seconds(),
    )
    old_plan = f"{pool.replicas} replica(s) keep the previous plan"
    if decision.action == "rejected":
        return failed(cond.CANARY_FAILED, f"pool {pool.pool_name}: plan revision {revision} "
                      f"failed its canary before; the pool keeps its previous plan. Change the "
                      f"spec, pins or workload to get another plan")
    if decision.action == "rollback":
        kapply.delete_deployment(kube, namespace, canary_name)
        message = (f"pool {pool.pool_name}: plan revision {revision} rolled back: "
                   f"{decision.message}; {old_plan}")
        events.append(Event("Warning", "CanaryRolledBack", message))
        out = failed(cond.CANARY_FAILED, message)
        out.status = out.status.model_copy(update={"rejected_plan_hash": hash_,
                                                   "canary": None})
        return out
    if decision.action in ("start", "wait"):
        canary_status = prev_canary
        if decision.action == "start":
            try:
                kapply.apply_pool(kube, [canary.canary_objects(
                    objects, name=canary_name, replicas=rollout.canary_replicas)], body)
            except kapply.ApplyError as exc:
                return failed(cond.APPLY_FAILED, f"pool {pool.pool_name} canary: {exc}")
            canary_status = CanaryStatus(plan_hash=hash_, revision=revision, started_at=now,
                                         deployment=canary_name)
            events.append(Event("Normal", "CanaryStarted", f"Deployment {canary_name} runs "
                                f"plan revision {revision} on {rollout.canary_replicas} "
                                f"replica(s) for a {rollout.analysis} analysis"))
        message = f"{decision.message}; {old_plan}"
        return _PoolOutcome(planned.model_copy(update={
            "phase": "Canary", "message": message, "canary": canary_status}), rolling=message)

    try:
        applied = kapply.apply_pool(kube, objects, body)
    except kapply.ApplyError as exc:
        return failed(cond.APPLY_FAILED, f"pool {pool.pool_name}: {exc}; nothing was changed")
    if prev_canary is not None:
        kapply.delete_deployment(kube, namespace, canary_name)
        if decision.action == "promote":
            events.append(Event("Normal", "CanaryPromoted", f"pool {pool.pool_name}: plan "
                                f"revision {revision} promoted: {decision.message}"))
    planned = planned.model_copy(update={"canary": None})

    deployment = next(o for o in applied if o.get("kind") == "Deployment")
    if running_hash != hash_:
        deployment_name = object_name(inp.name, pool.pool_name)
        events.append(Event("Normal", "RolloutStarted", f"Deployment {deployment_name} rolls "
                            f"out plan revision {revision}"))
    done, progress = kapply.rollout_done(deployment)
    stuck = None if done else kapply.rollout_stuck(deployment)
    applied_status = planned.model_copy(update={"phase": "Applied", "message": progress})
    if stuck is not None:
        message = stuck_message(pool.pool_name, deployment, stuck, revision)
        return _PoolOutcome(applied_status.model_copy(update={"message": message}),
                            failure=(cond.ROLLOUT_STUCK, message), rolling=progress)
    return _PoolOutcome(applied_status, rolling=None if done else progress)


def stuck_message(pool: str, deployment: Mapping[str, Any], reason: str, revision: int) -> str:
    name = deployment.get("metadata", {}).get("name", "?")
    return (f"pool {pool}: Deployment {name} is stuck at plan revision {revision} ({reason}); "
            f"see `kubectl describe pod -l kvtune.io/pool={pool}` and the container's "
            f"termination message (kvtune's runtime refuses a plan that does not fit the GPU); "
            f"fix the cause, or pin a smaller gpuMemoryUtilization/maxNumSeqs")


def pool_summary(pools: list[PoolStatus]) -> str:
    """``H200x2,H100x1`` for the printer column (kubectl prints only one item of a list)."""
    return ",".join(f"{p.gpu_class}x{p.replicas}" for p in pools)


def refresh_rollout(body: Mapping[str, Any], *, kube: kapply.Kube,
                    now: str | None = None) -> bool:
    """Re-read the pool Deployments of an ``auto`` InferenceDeployment and update
    Progressing/Ready and the pools' messages; nothing is planned or applied. Called when a
    child Deployment changes. Returns whether status was written.

    The patch carries the resourceVersion it was computed from, so it never overwrites a
    status a concurrent reconcile wrote meanwhile."""
    meta = body["metadata"]
    with object_lock(meta["namespace"], meta["name"]):
        fresh = kapply.read_inference_deployment(kube, meta["namespace"], meta["name"])
        return fresh is not None and _refresh_rollout_locked(fresh, kube=kube, now=now)


def _refresh_rollout_locked(body: Mapping[str, Any], *, kube: kapply.Kube,
                            now: str | None) -> bool:
    previous = _previous_status(body)
    degraded = cond.get_condition(previous.conditions, cond.DEGRADED)
    ready = cond.get_condition(previous.conditions, cond.READY)
    # Only a rollout's own states are refreshed here; any other failure needs a reconcile.
    if previous.mode != "auto" or not previous.pools or (
            degraded and degraded.status == "True" and degraded.reason != cond.ROLLOUT_STUCK):
        return False
    if ready and ready.reason not in (cond.ALL_POOLS_APPLIED, cond.ROLLING_OUT,
                                      cond.ROLLOUT_STUCK):
        return False
    if any(p.phase == "Canary" for p in previous.pools):
        return False  # a canary's analysis needs a reconcile (promote or roll back)
    meta = body["metadata"]
    pools, rolling, stuck = [], [], []
    for pool in previous.pools:
        if pool.phase == "Applied" and pool.deployment:
            deployment = kapply.read_deployment(kube, meta["namespace"], pool.deployment)
            if deployment is None:
                return False  # the next reconcile re-creates it
            done, progress = kapply.rollout_done(deployment)
            pool = pool.model_copy(update={"message": progress})
            reason = None if done else kapply.rollout_stuck(deployment)
            if reason is not None:
                pool = pool.model_copy(update={"message": stuck_message(
                    pool.name, deployment, reason, pool.revision)})
                stuck.append(pool.message)
            if not done:
                rolling.append(f"{pool.name}: {progress}")
        pools.append(pool)
    conditions = list(previous.conditions)
    generation = previous.observed_generation
    # A stuck rollout stays Progressing (it may still recover: the timer keeps looking).
    if stuck:
        conditions = cond.set_condition(conditions, cond.DEGRADED, True, cond.ROLLOUT_STUCK,
                                        " | ".join(stuck), generation=generation, now=now)
    elif degraded and degraded.reason == cond.ROLLOUT_STUCK:
        conditions = cond.set_condition(conditions, cond.DEGRADED, False, cond.AS_EXPECTED, "",
                                        generation=generation, now=now)
    if stuck:
        conditions = cond.set_condition(conditions, cond.PROGRESSING, True, cond.ROLLOUT_STUCK,
                                        "; ".join(rolling), generation=generation, now=now)
        conditions = cond.set_condition(conditions, cond.READY, False, cond.ROLLOUT_STUCK,
                                        " | ".join(stuck), generation=generation, now=now)
    elif rolling:
        conditions = cond.set_condition(conditions, cond.PROGRESSING, True, cond.ROLLING_OUT,
                                        "; ".join(rolling), generation=generation, now=now)
        conditions = cond.set_condition(conditions, cond.READY, False, cond.ROLLING_OUT,
                                        "; ".join(rolling), generation=generation, now=now)
    else:
        conditions = cond.set_condition(conditions, cond.PROGRESSING, False, cond.ROLLED_OUT,
                                        "every pool runs its current plan",
                                        generation=generation, now=now)
        conditions = cond.set_condition(conditions, cond.READY, True, cond.ALL_POOLS_APPLIED,
                                        f"{len(pools)} pool(s) run their plan",
                                        generation=generation, now=now)
    status = previous.model_copy(update={"pools": pools, "conditions": conditions})
    new = _dump(status)
    if new == _dump(previous):
        return False
    return kapply.patch_status(kube, meta["namespace"], meta["name"],
                               merge_patch(dict(body.get("status") or {}), new),
                               resource_version=meta.get("resourceVersion"))


def status_of(body: Mapping[str, Any]) -> InferenceDeploymentStatus:
    return _previous_status(body)


def stored_profile(body: Mapping[str, Any]) -> ProfileStatus | None:
    return _previous_status(body).profile
