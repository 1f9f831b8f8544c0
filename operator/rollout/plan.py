"""Stage 1, plan: the pool's ``PoolPlan`` from the spec, the model and the profile.

Also the two inputs every pool shares (``resolve_model``, ``policy_for``), and
``plan_one_pool``, the call into the pure planner that the retune timer makes too (it plans
a drifted pool once and hands the plan to the reconcile seam, which does not plan it again).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtune.operator.api import (
    ExpectedStatus,
    InferenceDeploymentSpec,
    KVTierStatus,
    PinSpec,
    PlanStatus,
    PoolSpec,
    PoolStatus,
    ProfileScope,
    ProfileStatus,
    RolloutSpec,
    pair_of,
    pin_path,
)
from kvtune.operator.api import conditions as cond
from kvtune.operator.calibration import calibration_flow
from kvtune.operator.kube import apply as kapply
from kvtune.operator.render.objects import RenderInput, plan_hash, vllm_args
from kvtune.operator.rollout import plan_checks, role_plan, search_job_stage, tier_stage
from kvtune.operator.rollout.layout_status import layout_terms, layouts_status
from kvtune.operator.rollout.outcome import Event, PoolContext, PoolOutcome
from kvtune.operator.search import gpu_prices, reuse_summary, search_budget
from kvtune.tuner.errors import KVTuneError, NoFeasiblePlan, UnknownName
from kvtune.tuner.kv_quality import KVQualityEvidence, KVQualityPolicy
from kvtune.tuner.model_calibration import CalibrationSet, ModelCalibration
from kvtune.tuner.plan import KVPlan, PoolPlan
from kvtune.tuner.plan_tier import KVTier
from kvtune.tuner.planner.calibration_predict import with_calibration
from kvtune.tuner.planner.policy import SLO, Pins, PlanPolicy
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_budget import SearchBudgetSpent, SearchCancelled
from kvtune.tuner.units import GiB
from kvtune.tuner.workload import WorkloadProfile

LOG = logging.getLogger("kvtune.operator")
# Distinct plan requests kept (a request and its plan: a few kB each).
PLAN_CACHE_SIZE = 512


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

    if spec.model.config is not None:
        ref = spec.model.config.config_map_ref
        if kube is None:
            raise LookupError("spec.model.config: no API access to read the ConfigMap")
        data = kapply.read_config_map_data(kube, namespace, ref.name,
                                           field="spec.model.config.configMapRef")
        return model_from_config_map(spec.model.name, data, namespace, ref.name, ref.key)
    known = {m.lower() for m in list_models()} | {m.split("/")[-1].lower() for m in list_models()}
    if spec.model.name.lower() not in known:
        raise UnknownName(
            "spec.model.name", spec.model.name, [],
            "It is not in kvtune's catalog: set spec.model.config.configMapRef to a ConfigMap "
            "holding its config.json, or use a catalog id (`kvtune plan --list-models`).",
        )
    return get_model(spec.model.name)


def model_from_config_map(model_name: str, data: Mapping[str, str], namespace: str,
                          config_map: str, key: str) -> Any:
    """The model from a ConfigMap holding its ``config.json`` under ``key``, and beside it,
    under their own names, the quantization files vLLM reads when config.json has none
    (``quantize_config.json``, ``quant_config.json``, ``hf_quant_config.json``)."""
    from kvtune.tuner.facts.catalog import quantization_file
    from kvtune.tuner.facts.models import ModelArchitecture

    field = "spec.model.config.configMapRef"
    text = kapply.config_map_key(data, namespace, config_map, key, field=field)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LookupError(f"{field}: ConfigMap {config_map} key {key!r} is not JSON ({exc}); "
                          "put the model's config.json there") from exc
    beside = (quantization_file(config, data.get, where=f"configmap/{config_map}")
              if isinstance(config, dict) else None)  # from_hf_config refuses a non-object
    return ModelArchitecture.from_hf_config(config, model_name, source=f"configmap/{config_map}",
                                            quantization_file=beside)


def plan_one_pool(spec: InferenceDeploymentSpec, pool: PoolSpec, model: Any,
                  profile: WorkloadProfile, policy: PlanPolicy,
                  kv_quality_evidence: KVQualityEvidence | None = None,
                  running: KVPlan | None = None, pool_field: str = "spec.pools[]",
                  scope: ProfileScope = "deployment",
                  calibrations: CalibrationSet | None = None) -> PoolPlan:
    """The pool's plan: by the capacity search on traffic made from the observed profile
    when Prometheus gave one with an arrival rate (the same function as ``kvtune plan``),
    else by the planner's rules. ``running``: the plan the pool runs now (ties go to the
    fewer changed knobs). ``calibrations``: the cluster's model calibrations (the closed
    loop, docs/calibration-loop.md); the pool's key's entry corrects the planner's models
    (not under tensorParallel auto: each degree would need its own)."""
    from kvtune.tuner.simulator.goodput_search import plan_by_goodput

    request = plan_request(spec, pool, model, profile, policy, kv_quality_evidence)
    pair = pair_of(spec.pools, pool)
    if pair is not None:
        # A prefill/decode pair: both planned together and checked (rollout/role_plan.py).
        return role_plan.plan_pair(spec, pool, (
            plan_request(spec, pair[0], model, profile, policy, kv_quality_evidence),
            plan_request(spec, pair[1], model, profile, policy, kv_quality_evidence)))
    if pool.tp_auto:
        return _plan_auto(spec, pool, request, running, pool_field, scope)
    if pool.gpus_per_replica is not None:
        return _plan_layout(spec, pool, request, running, pool_field, scope)
    request = with_calibration(request, calibrations)
    if searched(profile):
        from kvtune.tuner.planner.cost import priced
        from kvtune.tuner.planner.layout_replica import per_replica

        # Seconds of CPU (a cached result: none); the log says what the operator is busy with.
        LOG.info("%s (%s): capacity search at %.4g req/s", pool_field, pool.gpu_class,
                 profile.request_rate_per_second)

        replicas = sharing_replicas(spec, pool, scope)
        # A pinned dataParallel: each DP rank is an engine serving its share (as the CLI's
        # --dp), and the summary is restated per replica (tuner/planner/layout_replica.py).
        by_goodput: PoolPlan = per_replica(plan_by_goodput(
            request, running=running, replicas=replicas * request.data_parallel,
            budget=search_budget.budget()))
        # The tier kind the spec allows beyond the native CPU tier (spec.tuning.kvTiers).
        by_goodput = tier_stage.with_tiers(spec, pool, request, by_goodput, replicas)
        return priced(by_goodput, gpu_prices.price_of(pool, pool_field))
    return _plan_by_rules(request)


def _plan_auto(spec: InferenceDeploymentSpec, pool: PoolSpec, request: PlanRequest,
               running: KVPlan | None, pool_field: str, scope: ProfileScope) -> PoolPlan:
    """``tensorParallel: auto``: every degree planned on the rate this pool serves, the degree
    and replicas chosen for the lowest cost per good request, at most the spec's replicas
    (``tuner/planner/tp_choice.py``). The pool's rate: its own series' rate, else its part of
    the deployment's, by the spec's replicas."""
    from kvtune.tuner.planner.tp_choice import choose_tensor_parallel
    from kvtune.tuner.simulator.goodput_search import plan_by_goodput

    profile = request.profile
    if not searched(profile):
        return choose_tensor_parallel(request, lambda req, _n: _plan_by_rules(req),
                                      price=gpu_prices.price_of(pool, pool_field),
                                      max_replicas=max(1, pool.replicas))
    share = 1.0 if scope == "pool" else max(1, pool.replicas) / sharing_replicas(
        spec, pool, "deployment")
    rate = (profile.request_rate_per_second or 0.0) * share
    request = request.model_copy(update={"profile": profile.model_copy(
        update={"request_rate_per_second": rate})})
    LOG.info("%s (%s): tensorParallel auto, capacity search per degree at %.4g req/s",
             pool_field, pool.gpu_class, rate)

    def by_goodput(req: PlanRequest, replicas: int) -> PoolPlan:
        return plan_by_goodput(req, running=running, replicas=replicas,
                               budget=search_budget.budget())

    return choose_tensor_parallel(request, by_goodput, price=gpu_prices.price_of(pool, pool_field),
                                  max_replicas=max(1, pool.replicas))


def _plan_layout(spec: InferenceDeploymentSpec, pool: PoolSpec, request: PlanRequest,
                 running: KVPlan | None, pool_field: str, scope: ProfileScope) -> PoolPlan:
    """``gpusPerReplica``: every layout of that many GPUs (DP a multiple of the nodes a
    replica spans) planned, the best kept, as ``kvtune plan --gpus-per-replica`` chooses
    (``tuner/planner/layout_choice.py``): by the capacity search when the pool has a rate,
    else by the rules. The closed loop's calibration is keyed by layout, so it is not applied
    before the layout is chosen (as under tensorParallel auto)."""
    from kvtune.tuner.planner.cost import priced
    from kvtune.tuner.planner.layout_choice import choose_layout
    from kvtune.tuner.simulator.goodput_search import plan_by_goodput

    gpus = pool.gpus_per_replica
    assert gpus is not None
    if not searched(request.profile):
        return choose_layout(request, gpus, _plan_by_rules, nodes=pool.nodes_per_replica,
                             dcp=pool.decode_context_parallel)
    LOG.info("%s (%s): the layout of %d GPUs, capacity search per layout at %.4g req/s",
             pool_field, pool.gpu_class, gpus, request.profile.request_rate_per_second)
    replicas = sharing_replicas(spec, pool, scope)

    def by_goodput(req: PlanRequest) -> PoolPlan:
        # Each DP rank is an engine serving its share, as a replica would (as the CLI's).
        return plan_by_goodput(req, running=running, replicas=replicas * req.data_parallel,
                               budget=search_budget.budget())

    return priced(choose_layout(request, gpus, by_goodput, nodes=pool.nodes_per_replica,
                                dcp=pool.decode_context_parallel),
                  gpu_prices.price_of(pool, pool_field))


def rendered_replicas(spec: InferenceDeploymentSpec, pool: PoolSpec, pool_plan: PoolPlan
                      ) -> int:
    """The replicas the pool's Deployment runs: the spec's; under ``tensorParallel: auto`` the
    replicas chosen (at most the spec's, at least the canary's; none when scaled to zero)."""
    c = pool_plan.tp_choice
    if not pool.tp_auto or c is None or c.replicas is None or pool.replicas == 0:
        return pool.replicas
    canary = (spec.rollout or RolloutSpec()).canary_replicas
    return min(pool.replicas, max(c.replicas, canary))


def plan_request(spec: InferenceDeploymentSpec, pool: PoolSpec, model: Any,
                 profile: WorkloadProfile, policy: PlanPolicy,
                 kv_quality_evidence: KVQualityEvidence | None = None) -> PlanRequest:
    """What the pool's plan is asked for (the planner's and the search's one input)."""
    from kvtune.tuner.facts.gpus import get_gpu_class

    return PlanRequest(
        model=model, gpu=get_gpu_class(pool.gpu_declaration),
        # tensorParallel auto: each degree in turn (_plan_auto); 1 until then.
        tensor_parallel=pool.tensor_parallel if isinstance(pool.tensor_parallel, int) else 1,
        data_parallel=pool.data_parallel, expert_parallel=pool.expert_parallel,
        pipeline_parallel=pool.pipeline_parallel,
        decode_context_parallel=pool.decode_context_parallel,
        nodes_per_replica=pool.nodes_per_replica,
        weights_dtype=spec.model.weights_dtype, profile=profile, policy=policy,
        vllm_version=spec.runtime.vllm_version, kv_quality_evidence=kv_quality_evidence,
    )


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def _plan_by_rules(request: PlanRequest) -> PoolPlan:
    """``plan_pool``, once per request: a pure function of the request, which holds
    everything a plan depends on (model, GPU class, tensor parallelism, weights dtype,
    profile, policy with pins, SLO and KV-quality gate, evidence, vLLM version) and is
    frozen and compared by value; so a thousand objects of one shape, a restart's resume
    and every re-plan of an unchanged spec plan once. The plan is frozen: shared safely."""
    from kvtune.tuner.planner.planning import plan_pool

    result: PoolPlan = plan_pool(request)
    return result


def planning_inputs(spec: InferenceDeploymentSpec, pool: PoolSpec, model: Any,
                    profile: WorkloadProfile, policy: PlanPolicy,
                    evidence: KVQualityEvidence | None, replicas: int = 1,
                    calibration: ModelCalibration | None = None) -> str:
    """Digest of what a pool's plan is made from: the spec's planning inputs (model, weights,
    GPU class, TP, vLLM version, policy: SLO, pins, quality), the profile it is planned for
    and the KV-quality evidence. A catalog model counts by its id (an upgrade that corrects
    a catalog fact does not re-plan running pools); a model from a ConfigMap by its facts."""
    from_config_map = spec.model.config is not None
    payload = {
        "model": model.model_dump(mode="json") if from_config_map else spec.model.name,
        "weights": spec.model.weights_dtype, "gpu": pool.gpu_declaration,
        "tp": pool.tensor_parallel, "vllm": spec.runtime.vllm_version,
        # Defaults left out: a field a later kvtune adds (at its default) changes no digest.
        "profile": profile.model_dump(mode="json", exclude_defaults=True),
        # Not who required a measurement (the gate's words differ between the reconcile that
        # found no calibration can run and the later ones that hold from its status).
        "policy": policy.model_dump(mode="json", exclude_defaults=True,
                                    exclude={"kv_quality": {"required_by"}}),
        "evidence": evidence.model_dump(mode="json", exclude_defaults=True)
        if evidence is not None else None,
    }
    if pool.data_parallel != 1 or pool.expert_parallel:
        # The layout beyond TP (left out at its default, so digests from before it stay).
        payload["layout"] = [pool.data_parallel, pool.expert_parallel]
    if pool.pipeline_parallel != 1:
        # Pipeline stages (left out at 1, so digests from before it stay), and over how many
        # nodes when more than one: the sends between stages cross the NIC.
        payload["pipeline_parallel"] = (pool.pipeline_parallel if pool.nodes_per_replica == 1
                                        else [pool.pipeline_parallel, pool.nodes_per_replica])
    if pool.decode_context_parallel != 1:
        payload["decode_context_parallel"] = pool.decode_context_parallel  # as PP's, above
    if pool.gpus_per_replica is not None:
        # A chosen layout: over how many GPUs and nodes (left out when unset, as above).
        payload["gpus_per_replica"] = [pool.gpus_per_replica, pool.nodes_per_replica]
    pair = role_plan.pair_inputs(spec, pool)
    if pair is not None:
        # A role's plan follows its peer's pool and pins (left out without a role, so
        # digests from before roles stay).
        payload["disaggregation"] = pair
    if spec.tuning.kv_tiers is not None:
        # The tiers a pool may use beyond host memory (left out without them, as above).
        payload["kv_tiers"] = spec.tuning.kv_tiers.model_dump(mode="json", exclude_none=True)
    if calibration is not None:
        # The loop's correction terms (left out without one: digests of before stay).
        payload["calibration"] = [calibration.kv_tokens_scale, calibration.prefill_efficiency,
                                  calibration.decode_efficiency]
    if replicas != 1:
        # The capacity search plans each replica on its share of the rate: more replicas,
        # another plan (left out at one, so digests from before replicas counted stay).
        payload["replicas"] = replicas
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()) \
        .hexdigest()[:16]


def plan_in_force(ctx: PoolContext, inputs: str) -> KVPlan | None:
    """The running plan when it was made from ``inputs``: kept as it is. A status written
    by a kvtune before ``planInputs`` counts as made from the current inputs when the spec
    has not changed since (its observed generation)."""
    base = ctx.base
    if base.plan is None or base.plan_hash is None:
        return None
    if base.plan_inputs is None:
        meta, status = ctx.body.get("metadata") or {}, ctx.body.get("status") or {}
        if status.get("observedGeneration") != meta.get("generation"):
            return None
    elif base.plan_inputs != inputs:
        return None
    return running_plan(base)


def _keep(pool_plan: PoolPlan, kept: KVPlan, base: PoolStatus) -> tuple[PoolPlan, str]:
    """The new plan with the running knobs and expected figures put back, and the warning
    that says what this kvtune would choose instead."""
    from kvtune.tuner import knobs as knob_table

    material, noise = knob_table.material_changes(kept.model_dump(), pool_plan.plan.model_dump())
    tier, new_tier = tier_in_force(base), pool_plan.kv_tier
    if tier != new_tier:  # the LMCache tier, kept with the knobs
        material.append("kv tier " + (f"{new_tier.kind} {new_tier.size_gib:g} GiB"
                                      if new_tier is not None else "none"))
    update: dict[str, Any] = {"plan": kept, "kv_tier": tier}
    if base.expected is not None:
        # Status keeps every expected figure; one an older kvtune did not store (weights and
        # other non-KV bytes: they do not depend on the KV knobs) is the new plan's.
        stored = base.expected.model_dump()
        fields = type(pool_plan.expected).model_fields
        update["expected"] = pool_plan.expected.model_copy(update={
            k: v for k, v in stored.items()
            if k in fields and (v is not None or not fields[k].is_required())})
    warning = (f"{KEPT_WARNING}: this kvtune would now plan {', '.join(material + noise)} "
               "for the same inputs; the plan stays until a planning input (spec, profile, "
               "KV-quality evidence) or an accepted retune changes")
    return pool_plan.model_copy(update=update), warning


KEPT_WARNING = "plan in force kept"


def tier_in_force(base: PoolStatus) -> KVTier | None:
    """The LMCache tier the plan in force runs with (none in a status from before tiers were
    kept, when no spec could allow one)."""
    return None if base.kv_tier is None else KVTier.model_validate(base.kv_tier.model_dump())


def searched(profile: WorkloadProfile) -> bool:
    """A pool is planned by the capacity search when its traffic has an arrival rate
    (observed, or declared in ``spec.workload.requestRatePerSecond``)."""
    return profile.source in ("prometheus", "declared") and bool(
        profile.request_rate_per_second)


def sharing_replicas(spec: InferenceDeploymentSpec, pool: PoolSpec,
                     scope: ProfileScope) -> int:
    """How many replicas share the profile's arrival rate: the pool's own when the rate was
    observed on its own series, else every pool's (the deployment's traffic is spread over
    all of them)."""
    n = pool.replicas if scope == "pool" else sum(p.replicas for p in spec.pools)
    return max(1, n)


def running_plan(prev: PoolStatus | None) -> KVPlan | None:
    """The plan a pool runs now, from its status (None: nothing yet, or a status an older
    kvtune wrote)."""
    if prev is None or prev.plan is None:
        return None
    try:
        return KVPlan.model_validate(prev.plan.model_dump())
    except ValueError:
        return None


def slo_at_risk(pool_plan: PoolPlan) -> str | None:
    """The SLO-at-risk line with its numbers when the capacity search found no configuration
    meeting the SLO at the observed rate."""
    if pool_plan.slo_unreachable is not None:
        return pool_plan.slo_unreachable.message
    s = pool_plan.search
    if s is None or s.slo_met or not s.slo_set:
        return None
    from kvtune.tuner.planner.search import slo_at_risk_message

    return slo_at_risk_message(s)


_PIN_FIELD = re.compile(r"\bpins\.([a-z_]+)")


def spec_field_names(exc: Exception) -> str:
    """The planner names pins as ``pins.kv_cache_dtype``; the user wrote
    ``spec.tuning.pin.kvCacheDtype``: say it the user's way."""
    def user_path(match: re.Match[str]) -> str:
        name = match.group(1)
        return pin_path(name) if name in PinSpec.model_fields else match.group(0)

    return layout_terms(_PIN_FIELD.sub(user_path, str(exc)))


def plan_status(pool_plan: PoolPlan) -> tuple[PlanStatus, ExpectedStatus, list[str]]:
    """A plan as status: its knobs, its expected figures, one reason per knob."""
    knobs = PlanStatus.model_validate(pool_plan.plan.model_dump())
    expected = ExpectedStatus.model_validate(pool_plan.expected.model_dump())
    reasons = [f"{r.knob}={r.choice}: {r.message}" for r in pool_plan.reasons]
    return knobs, expected, reasons


@dataclass(frozen=True)
class PlanInput:
    model: Any  # the model's architecture (``resolve_model``)
    profile: WorkloadProfile  # the traffic the pool is planned for
    policy: PlanPolicy
    profile_used: ProfileStatus | None  # how ``profile`` is shown in the pool's status
    # A plan already made for this pool and profile (by the retune timer): used as is.
    given: PoolPlan | None = None
    # The KV-quality evidence of the served model revision, and its calibration Job.
    gate: calibration_flow.Gate | None = None
    # The cluster's model calibrations (the closed loop; not the KV-quality calibration).
    calibrations: CalibrationSet | None = None


@dataclass(frozen=True)
class Planned:
    pool_plan: PoolPlan
    plan_hash: str  # identity of what the pods run (render.plan_hash)
    revision: int  # bumped when the hash changes
    status: PoolStatus  # the pool's status carrying the new plan
    render_input: RenderInput  # what the render stage renders (placement added there)
    # The traffic continues conversations (history re-sent): the endpoint picker keeps a
    # request on the pods that hold its prefix (operator/routing/inference_pool.py).
    multi_turn: bool = False


def plan(ctx: PoolContext, inp: PlanInput) -> Planned | PoolOutcome:
    pool, base = ctx.pool, ctx.base
    made = _make(ctx, inp)
    if isinstance(made, PoolOutcome):
        return made
    pool_plan, policy, evidence = made.pool_plan, made.policy, made.evidence
    pool_plan = reuse_summary.with_host_price(pool_plan)  # the chart's host-memory price
    pool_plan = tier_stage.said(ctx.spec, pool, pool_plan)  # kvTiers allowed, not weighed
    scope: ProfileScope = (inp.profile_used.scope or "deployment") \
        if inp.profile_used is not None else "deployment"
    calibration = None if pool.tp_auto else with_calibration(plan_request(
        ctx.spec, pool, inp.model, inp.profile, policy, evidence), inp.calibrations).calibration
    inputs = planning_inputs(ctx.spec, pool, inp.model, inp.profile, policy, evidence,
                             sharing_replicas(ctx.spec, pool, scope) if searched(inp.profile)
                             else 1, calibration)
    kept = plan_in_force(ctx, inputs)
    kept_warning = None
    if kept is not None and (kept != pool_plan.plan or tier_in_force(base) != pool_plan.kv_tier):
        pool_plan, kept_warning = _keep(pool_plan, kept, base)
    refused = plan_checks.check(ctx.spec, pool_plan, inp.profile, pool.pin)
    if refused is not None:
        return ctx.failed(*refused)
    knobs, expected, reasons = plan_status(pool_plan)
    warnings = list(pool_plan.warnings)
    at_risk, cost = slo_at_risk(pool_plan), gpu_prices.cost_status(pool_plan)
    reuse, layouts = reuse_summary.reuse_status(pool_plan), layouts_status(pool_plan)
    if kept_warning is not None:
        # The reasons, warnings, SLO verdict and cost the plan in force was made with stay
        # beside it (the new search's are about a plan that does not run).
        reasons = list(base.reasons)
        warnings = [w for w in base.warnings if not w.startswith(KEPT_WARNING)] + [kept_warning]
        at_risk, cost, reuse, layouts = base.slo_at_risk, base.cost, base.reuse, base.layouts
    hash_ = plan_hash(pool_plan, ctx.spec.runtime.image, ctx.pool.role)
    revision = base.revision if base.plan_hash == hash_ else base.revision + 1
    render_input = _render_input(ctx, pool_plan, revision)
    status = base.model_copy(update={
        "gpu_class": pool_plan.gpu_class, "plan": knobs, "expected": expected,
        # tensorParallel auto: the degree and replicas chosen.
        "tensor_parallel": pool_plan.tensor_parallel, "replicas": render_input.replicas,
        "reasons": reasons, "warnings": warnings, "plan_inputs": inputs,
        "slo_at_risk": at_risk, "cost": cost, "reuse": reuse, "layouts": layouts,
        "kv_tier": None if pool_plan.kv_tier is None
        else KVTierStatus.model_validate(pool_plan.kv_tier.model_dump()),
        "vllm_args": vllm_args(render_input),
        "plan_hash": hash_, "revision": revision, "message": "", "profile": inp.profile_used,
    })
    if base.plan_hash != hash_:
        ctx.events.append(Event("Normal", "PlanChanged", f"pool {pool.pool_name} "
                                f"({pool_plan.gpu_class}) plan revision {revision}: "
                                f"{' '.join(pool_plan.plan.vllm_args())}"))
    return Planned(pool_plan=pool_plan, plan_hash=hash_, revision=revision, status=status,
                   render_input=render_input, multi_turn=inp.profile.multi_turn)


@dataclass(frozen=True)
class _Made:
    """The planner's answer for the pool and what it was asked with."""

    pool_plan: PoolPlan
    policy: PlanPolicy
    evidence: KVQualityEvidence | None


def _make(ctx: PoolContext, inp: PlanInput) -> _Made | PoolOutcome:
    """The plan given (the retune timer's), the search Job's, or the planner's own; the
    pool's outcome when the planner refuses the pool or its search is still running."""
    pool = ctx.pool
    try:
        gate = inp.gate
        policy = calibration_flow.with_gate(inp.policy, gate) if gate is not None \
            else inp.policy
        evidence = gate.evidence if gate is not None else None
        # The search as a Job (the chart's search.mode): its outcome, or "still running".
        by_job = None if inp.given is not None else search_job_stage.plan_by_job(
            ctx, inp.model, inp.profile, policy, evidence, inp.profile_used)
        if isinstance(by_job, PoolOutcome):
            return by_job
        pool_plan = inp.given if inp.given is not None else by_job if by_job is not None \
            else plan_one_pool(
                ctx.spec, pool, inp.model, inp.profile, policy, evidence,
                running=running_plan(ctx.base), pool_field=ctx.field,
                scope=(inp.profile_used.scope or "deployment") if inp.profile_used is not None
                else "deployment", calibrations=inp.calibrations)
    except UnknownName as exc:
        return ctx.failed(cond.INVALID_SPEC, f"{ctx.field}.gpuClass: {exc}")
    except SearchCancelled:
        LOG.info("%s: capacity search cancelled: the operator is stopping", ctx.field)
        raise
    except role_plan.PairRefused as exc:
        return ctx.failed(cond.KV_TRANSFER_INCOMPATIBLE,
                          f"{ctx.field} ({pool.role} pool {pool.pool_name}, pair "
                          f"{'/'.join(p.pool_name for p in pair_of(ctx.spec.pools, pool) or ())})"
                          f": {exc}")
    except SearchBudgetSpent as exc:
        return ctx.failed(cond.SEARCH_BUDGET_SPENT, f"{ctx.field} ({pool.gpu_class}): {exc}")
    except NoFeasiblePlan as exc:
        return ctx.failed(cond.NO_FEASIBLE_PLAN, f"{ctx.field} ({pool.gpu_class}, "
                          f"tensorParallel={pool.tensor_parallel}): {exc}")
    except KVTuneError as exc:
        return ctx.failed(cond.INVALID_SPEC,
                          f"{ctx.field} ({pool.gpu_class}): {spec_field_names(exc)}")

    return _Made(pool_plan, policy, evidence)


def _render_input(ctx: PoolContext, pool_plan: PoolPlan, revision: int) -> RenderInput:
    """What the render stage renders the pool's objects from."""
    pool, spec = ctx.pool, ctx.spec
    return RenderInput(
        name=ctx.name, namespace=ctx.namespace, pool=pool.pool_name,
        pool_plan=pool_plan, model_name=spec.model.name, image=spec.runtime.image,
        replicas=rendered_replicas(spec, pool, pool_plan), revision=revision,
        entrypoint=spec.runtime.entrypoint,
        secrets=tuple(spec.runtime.secrets),
        ttft_slo_seconds=spec.slo.ttft_p95_seconds() if spec.slo else None,
        tpot_slo_seconds=spec.slo.tpot_p95_seconds() if spec.slo else None,
        progress_deadline_seconds=(spec.rollout or RolloutSpec()).progress_deadline_seconds(),
        node_selector=dict(pool.node_selector or {}),
        tolerations=[t.model_dump(by_alias=True, exclude_none=True)
                     for t in pool.tolerations or []],
        role=pool.role, nodes_per_replica=pool.nodes_per_replica,
    )
