"""``spec.pools[].tensorParallel: auto``: the plan stage chooses the degree and the replicas
(tuner/planner/tp_choice.py), and the rendered Deployment asks for that many GPUs per pod and
runs that many replicas, at most the spec's (no API server needed to get there)."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC
from pydantic import ValidationError

from kvtune.operator import reconcile as rec
from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.render.objects import render_pool
from kvtune.operator.rollout.outcome import Event, PoolContext
from kvtune.operator.rollout.plan import PlanInput, Planned, plan, policy_for, resolve_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import PoolPlan, SearchSummary, TPChoice
from kvtune.tuner.planner.planning import PlanRequest, plan_pool

BODY = {"metadata": {"name": "bot", "namespace": "llm", "uid": "u"}}
AFFINITY = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                           "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}


def _spec(pool: dict[str, Any], **change: Any) -> InferenceDeploymentSpec:
    spec = {**copy.deepcopy(SAMPLE_SPEC), "pools": [pool], **change}
    return InferenceDeploymentSpec.model_validate(spec)


def _planned(spec: InferenceDeploymentSpec) -> Planned:
    ctx = PoolContext(spec=spec, index=0, pool=spec.pools[0], body=BODY,
                      kube=None, now="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
                      base=rec.base_status(spec, spec.pools[0], None, "bot"),
                      events=list[Event]())
    out = plan(ctx, PlanInput(model=resolve_model(spec, "llm", None),
                              profile=declared_profile(spec.workload), policy=policy_for(spec),
                              profile_used=None))
    assert isinstance(out, Planned), out
    return out


def _deployment(planned: Planned) -> dict[str, Any]:
    objects = render_pool(dataclasses.replace(planned.render_input, affinity=AFFINITY))
    deployment: dict[str, Any] = next(o for o in objects if o["kind"] == "Deployment")
    return deployment


def test_auto_renders_the_chosen_tp_as_gpus_and_flag() -> None:
    spec = _spec({"gpuClass": "H100", "replicas": 3, "tensorParallel": "auto"},
                 model={"name": "meta-llama/Llama-3.3-70B-Instruct"})
    planned = _planned(spec)
    tp = planned.pool_plan.tensor_parallel
    choice = planned.pool_plan.tp_choice
    assert choice is not None and tp in (2, 4, 8)  # TP1: 70B of weights on an 80 GB GPU
    assert next(o for o in choice.options if o.tensor_parallel == 1).refused
    container = _deployment(planned)["spec"]["template"]["spec"]["containers"][0]
    assert f"--tensor-parallel-size={tp}" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(tp)
    # No rate: nothing says how many replicas; the spec's run.
    assert _deployment(planned)["spec"]["replicas"] == 3
    status = planned.status
    assert status.tensor_parallel == tp and status.replicas == 3
    assert status.reasons[0].startswith(f"tensor-parallel-size={tp}: ")


class StatedCapacity:
    """``plan_by_goodput`` with a stated capacity per replica per degree (the real rules plan
    under it), so the replicas chosen follow from stated figures."""

    def __init__(self, capacity_by_tp: dict[int, float]) -> None:
        self.capacity_by_tp = capacity_by_tp

    def __call__(self, request: PlanRequest, replicas: int = 1, **_: Any) -> PoolPlan:
        rate = request.profile.request_rate_per_second or 0.0
        capacity = self.capacity_by_tp[request.tensor_parallel]
        met = rate / replicas <= capacity
        pool = plan_pool(request)
        return pool.model_copy(update={"search": SearchSummary(
            observed_rate_per_second=rate, replicas=replicas,
            rate_per_replica_per_second=rate / replicas, littles_law_sequences=4,
            capacity_requests_per_second=capacity,
            slo_attainment=0.99 if met else 0.5, ttft_p95_seconds=0.3,
            tpot_p95_seconds=0.02, slo_met=met, slo_set=True,
            replicas_needed=math.ceil(rate / capacity), candidates=1,
            simulated_requests=10, requests_per_candidate=10, changed_from="rules' plan")})


@pytest.mark.parametrize(("rate", "max_replicas", "tp", "replicas"), [
    (11.0, 6, 2, 1),   # one TP2 replica (2 GPUs) against three TP1 (3 GPUs)
    (24.0, 6, 2, 2),   # TP1 x 5, TP2 x 2, TP4 x 2: TP2's 4 GPUs
    (24.0, 1, 8, 1),   # one replica at most: only TP8 serves 24 req/s alone
    (4.0, 6, 1, 1),    # one TP1 replica
])
def test_auto_chooses_the_replicas_the_rate_needs_within_the_spec(
        monkeypatch: pytest.MonkeyPatch, rate: float, max_replicas: int, tp: int,
        replicas: int) -> None:
    from kvtune.tuner.simulator import goodput_search

    monkeypatch.setattr(goodput_search, "plan_by_goodput",
                        StatedCapacity({1: 5.0, 2: 12.0, 4: 20.0, 8: 30.0}))
    spec = _spec({"gpuClass": "H100", "replicas": max_replicas, "tensorParallel": "auto"},
                 workload={**SAMPLE_SPEC["workload"], "requestRatePerSecond": rate},
                 rollout=None)
    planned = _planned(spec)
    assert planned.pool_plan.tensor_parallel == tp
    deployment = _deployment(planned)
    assert deployment["spec"]["replicas"] == replicas
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(tp)
    assert planned.status.replicas == replicas


def test_auto_replicas_never_drop_below_the_canary() -> None:
    from kvtune.operator.rollout.plan import rendered_replicas

    spec = _spec({"gpuClass": "H100", "replicas": 4, "tensorParallel": "auto"},
                 rollout={"canaryReplicas": 2, "analysis": "10m"})
    pool_plan = plan_pool(PlanRequest(model=resolve_model(spec, "llm", None),
                                      gpu=get_gpu_class("H100"),
                                      profile=declared_profile(spec.workload)))
    chosen = pool_plan.model_copy(update={"tp_choice": TPChoice(by="capacity", replicas=1)})
    assert rendered_replicas(spec, spec.pools[0], chosen) == 2
    fixed = _spec({"gpuClass": "H100", "replicas": 4, "tensorParallel": 2})
    assert rendered_replicas(fixed, fixed.pools[0], chosen) == 4


@pytest.mark.parametrize("value", [3, "three", 16, 0])
def test_bad_tensor_parallel_is_one_line_naming_field_value_and_fix(value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        _spec({"gpuClass": "H100", "tensorParallel": value})
    line = rec.describe_validation_error(info.value)
    assert "\n" not in line
    assert line.startswith(f"spec.pools[0].tensorParallel={value!r}".replace("'", '"')), line
    assert "1, 2, 4, 8 or 'auto'" in line and "fix:" in line
