"""Status is the channel from one writer to the next reconcile, so it must give back what
was put in (issue 24): every status type through its API form (camelCase JSON, as the API
server stores and returns it), and every model the operator keeps in status (the profile
a plan was made for, the plan, its expected figures, the retune clocks) model -> status ->
model. A lossy profile changed the planning-inputs digest, so the plan in force was not
recognised after a retune."""

from __future__ import annotations

import json
import math
import types
import typing
from typing import Any, Literal, get_args, get_origin

import pytest
from op_samples import make_pool_plan
from pydantic import BaseModel

from kvtune.operator import api
from kvtune.operator.api import PoolSpec, WorkloadSpec
from kvtune.operator.api.workloads import declared_profile, profile_from_status, profile_status
from kvtune.operator.kube import status as status_writer
from kvtune.operator.prometheus.profiling import ProfilingSettings, RawWindow, build_profile
from kvtune.operator.retune import retune_state
from kvtune.operator.retune.decide import RetuneState
from kvtune.operator.rollout import plan as plan_stage
from kvtune.tuner.plan import ExpectedFigures
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

STATUS_TYPES = sorted((t for t in vars(api).values() if isinstance(t, type)
                       and issubclass(t, api._Status) and t is not api._Status),
                      key=lambda t: t.__name__)


def through_api(data: Any) -> Any:
    """``data`` as the API server gives it back: JSON, and a float with an integral value
    as an integer (Go's encoder writes 60.0 as 60)."""
    if isinstance(data, dict):
        return {k: through_api(v) for k, v in data.items()}
    if isinstance(data, list):
        return [through_api(v) for v in data]
    if isinstance(data, float) and data.is_integer():
        return int(data)
    return json.loads(json.dumps(data))


def _sample(annotation: Any, name: str, depth: int = 0) -> Any:
    """A value of ``annotation`` other than the field's default: every field set."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return args[-1]
    if origin in (typing.Union, types.UnionType):
        return _sample(next(a for a in args if a is not type(None)), name, depth)
    if origin is list:
        return [_sample(args[0], name, depth), _sample(args[0], name + "2", depth)] \
            if isinstance(args[0], type) and issubclass(args[0], BaseModel) \
            else [_sample(args[0], name, depth)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return filled(annotation, depth + 1, name)
    return {bool: True, int: 7, float: 0.25, str: f"{name}-x"}[annotation]


def filled(model: type[BaseModel], depth: int = 0, prefix: str = "") -> Any:
    """An instance of ``model`` with every field set (lists of objects: two, distinct)."""
    hints = typing.get_type_hints(model)
    return model.model_validate({field: _sample(hints[field], f"{prefix}{field}", depth)
                                 for field in model.model_fields}, by_name=True)


@pytest.mark.parametrize("status_type", STATUS_TYPES, ids=lambda t: t.__name__)
def test_every_status_type_survives_its_api_form(status_type: type[BaseModel]) -> None:
    made = filled(status_type)
    unset = [f for f, info in status_type.model_fields.items()
             if getattr(made, f) == info.default]
    assert not unset, f"the sample leaves {unset} at their defaults"
    stored = through_api(made.model_dump(mode="json", by_alias=True, exclude_none=True))
    assert status_type.model_validate(stored) == made


def test_the_whole_status_survives_read_after_dump() -> None:
    made = filled(api.InferenceDeploymentStatus)
    assert status_writer.read({"status": through_api(status_writer.dump(made))}) == made


DECLARED = declared_profile(WorkloadSpec.model_validate(
    {"profile": "chat", "contextTokens": {"p50": 1000, "p99": 4000}}))


def _observed_window() -> WorkloadProfile:
    """A profile as the profiling module makes it from a window (with its notes and the
    window's length), with the declared kind and multi-turn as the retune timer sets them."""
    bounds = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]
    prompt = [(float(b), float(min(1200, i * 90))) for i, b in enumerate(bounds)]
    out = [(float(b), float(min(1200, i * 150))) for i, b in enumerate(bounds)]
    raw = RawWindow(window_seconds=60.0, at_unix_seconds=1000.0, requests=1200.0,
                    prompt_buckets=[*prompt, (math.inf, 1200.0)],
                    output_buckets=[*out, (math.inf, 1200.0)], ttft_buckets=[],
                    tpot_buckets=[], prefix_cache_queries=1.0e6, prefix_cache_hits=3.0e5,
                    kv_cache_usage_mean=0.5, kv_cache_usage_max=0.9, preemptions=0.0,
                    waiting_mean=0.0,
                    # vLLM's --kv-cache-metrics (issue 27): lost in status, the plan in
                    # force was not recognised after a restart.
                    reuse_gap_buckets=[(1.0, 5.0), (10.0, 40.0), (math.inf, 50.0)],
                    idle_before_evict_buckets=[(10.0, 3.0), (60.0, 30.0), (math.inf, 30.0)])
    made = build_profile(raw, ProfilingSettings(window_seconds=60.0, min_requests=100))
    assert made.trusted and made.profile is not None, made.message
    assert made.profile.notes and made.profile.window_seconds == 60.0
    assert made.profile.prefix_reuse_gap_seconds is not None
    assert made.profile.kv_block_idle_before_evict_seconds is not None
    return made.profile.model_copy(update={"kind": DECLARED.kind,
                                           "multi_turn": DECLARED.multi_turn})


OBSERVED = _observed_window()
PROFILES = {
    "observed window": OBSERVED,
    "bursty, rate 12.345/s": OBSERVED.model_copy(update={
        "arrival_cv": 2.5, "request_rate_per_second": 12.345, "prefix_hit_rate": None}),
    "shared prefix, no window": OBSERVED.model_copy(update={
        "shared_prefix_tokens": 640, "window_seconds": None, "notes": ()}),
}


@pytest.mark.parametrize("profile", PROFILES.values(), ids=PROFILES.keys())
def test_an_observed_profile_comes_back_whole(profile: WorkloadProfile) -> None:
    for scope in (None, "pool", "deployment"):
        kept = profile_status(profile, window="1m", observed_at="2026-01-01T00:00:00Z",
                              scope=scope)
        stored = api.ProfileStatus.model_validate(
            through_api(kept.model_dump(mode="json", by_alias=True, exclude_none=True)))
        assert profile_from_status(stored, DECLARED) == profile


@pytest.mark.parametrize("profile", PROFILES.values(), ids=PROFILES.keys())
def test_the_planning_inputs_digest_is_the_same_after_status(profile: WorkloadProfile) -> None:
    """What ``plan_in_force`` compares: the digest the retune timer's reconcile stored and
    the one the next reconcile computes on the profile read back from status."""
    spec = api.InferenceDeploymentSpec.model_validate({
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "workload": {"profile": "chat", "contextTokens": {"p50": 1000, "p99": 4000}},
        "pools": [{"gpuClass": "H100", "replicas": 1}]})
    pool: PoolSpec = spec.pools[0]
    policy = plan_stage.policy_for(spec)
    stored = api.DeploymentProfileStatus.model_validate(through_api(
        status_writer.with_timer_part(profile_status(profile, window="1m"), None)
        .model_dump(mode="json", by_alias=True, exclude_none=True)))
    back = profile_from_status(stored, DECLARED)
    assert plan_stage.planning_inputs(spec, pool, None, back, policy, None) == \
        plan_stage.planning_inputs(spec, pool, None, profile, policy, None)


def test_the_declared_workload_is_not_taken_for_an_observed_one() -> None:
    """A declared profile in status is not read back (the spec is): the declared stands."""
    assert profile_from_status(profile_status(DECLARED), DECLARED) is DECLARED
    assert profile_from_status(None, DECLARED) is DECLARED


def test_a_status_an_older_kvtune_wrote_gets_no_preset_notes() -> None:
    older = api.ProfileStatus.model_validate({
        k: v for k, v in profile_status(OBSERVED).model_dump(by_alias=True).items()
        if k not in ("arrivalCv", "windowSeconds", "notes")})
    back = profile_from_status(older, DECLARED)
    assert back.notes == () and back.window_seconds is None
    assert back.context_tokens == OBSERVED.context_tokens


def test_the_plan_and_its_expected_figures_come_back_whole() -> None:
    pool_plan = make_pool_plan(kv_offloading_size_gib=12.5, kv_offloading_backend="native",
                               attention_backend="FLASHINFER", dtype="bfloat16",
                               kv_cache_memory_bytes=80 * 2**30)
    pool_plan = pool_plan.model_copy(update={"expected": pool_plan.expected.model_copy(update={
        "decode_step_seconds": 0.021, "prefix_hit_rate": 0.4, "slo_attainment": 0.97,
        "capacity_requests_per_second": 31.5, "ttft_p95_seconds": 0.8,
        "tpot_p95_seconds": 0.05})})
    knobs, expected, _ = plan_stage.plan_status(pool_plan)
    base = api.PoolStatus(name="h200", gpu_class="H200", tensor_parallel=1, replicas=1,
                          phase="Applied", plan=knobs, expected=expected)
    stored = api.PoolStatus.model_validate(
        through_api(base.model_dump(mode="json", by_alias=True, exclude_none=True)))
    assert plan_stage.running_plan(stored) == pool_plan.plan
    assert stored.expected is not None
    assert ExpectedFigures.model_validate(stored.expected.model_dump()) == pool_plan.expected


def test_the_retune_clocks_and_candidate_come_back_whole() -> None:
    state = RetuneState(drift_since_seconds=1000.5, stable_since_seconds=1010.0,
                        last_rollout_seconds=900.0,
                        candidate=PROFILES["bursty, rate 12.345/s"])
    kept = api.RetunePoolStatus(name="h200", reason="DwellPending",
                                state=retune_state.state_status(state))
    status = api.InferenceDeploymentStatus(profile=api.DeploymentProfileStatus(
        source="prometheus", retune=api.RetuneStatus(reason="DwellPending", pools=[kept])))
    stored = status_writer.read({"status": through_api(status_writer.dump(status))})
    assert retune_state.state_from_status(stored, "h200", DECLARED) == state


def test_token_quantiles_come_back_whole() -> None:
    q = TokenQuantiles(p50=10, p90=20, p95=30, p99=40, max=50)
    shown = profile_status(OBSERVED.model_copy(update={"context_tokens": q})).context_tokens
    assert shown is not None and TokenQuantiles.model_validate(shown.model_dump()) == q
