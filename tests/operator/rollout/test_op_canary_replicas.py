"""The canary stage weighs the replicas the plan chose, not the spec's bound: under
``tensorParallel: auto`` the pool runs the replicas its plan chose (``rendered_replicas``),
which may be fewer than ``spec.pools[].replicas``."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC

from kvtune.operator import reconcile as rec
from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.kube import apply as kapply
from kvtune.operator.render.objects import render_pool
from kvtune.operator.rollout import canary_stage
from kvtune.operator.rollout.canary_stage import CanaryResult
from kvtune.operator.rollout.outcome import Event, PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import PlanInput, Planned, plan, policy_for, resolve_model
from kvtune.operator.rollout.render_stage import Rendered
from kvtune.tuner.plan import PoolPlan, SearchSummary
from kvtune.tuner.planner.planning import PlanRequest, plan_pool

BODY = {"metadata": {"name": "bot", "namespace": "llm", "uid": "u"}}
AFFINITY = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                           "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}
CAPACITY_BY_TP = {1: 5.0, 2: 12.0, 4: 20.0, 8: 30.0}  # req/s per replica, stated


def _by_capacity(request: PlanRequest, replicas: int = 1, **_: Any) -> PoolPlan:
    """``plan_by_goodput`` with stated capacities, so the replicas chosen follow from them."""
    rate = request.profile.request_rate_per_second or 0.0
    capacity = CAPACITY_BY_TP[request.tensor_parallel]
    met = rate / replicas <= capacity
    return plan_pool(request).model_copy(update={"search": SearchSummary(
        observed_rate_per_second=rate, replicas=replicas,
        rate_per_replica_per_second=rate / replicas, littles_law_sequences=4,
        capacity_requests_per_second=capacity, slo_attainment=0.99 if met else 0.5,
        ttft_p95_seconds=0.3, tpot_p95_seconds=0.02, slo_met=met, slo_set=True,
        replicas_needed=math.ceil(rate / capacity), candidates=1, simulated_requests=10,
        requests_per_candidate=10, changed_from="rules' plan")})


def _stage(monkeypatch: pytest.MonkeyPatch, rate: float, bound: int
           ) -> tuple[Planned, CanaryResult | PoolOutcome, list[Any]]:
    """A pool under tensorParallel auto planned for ``rate`` with at most ``bound`` replicas
    and a one-replica canary, whose running plan is another: its canary stage."""
    from kvtune.tuner.simulator import goodput_search

    monkeypatch.setattr(goodput_search, "plan_by_goodput", _by_capacity)
    applied: list[Any] = []
    monkeypatch.setattr(kapply, "apply_pool", lambda kube, objects, body: applied.append(
        objects))
    spec = InferenceDeploymentSpec.model_validate({
        **copy.deepcopy(SAMPLE_SPEC),
        "pools": [{"gpuClass": "H100", "replicas": bound, "tensorParallel": "auto"}],
        "workload": {**SAMPLE_SPEC["workload"], "requestRatePerSecond": rate}})
    ctx = PoolContext(spec=spec, index=0, pool=spec.pools[0], body=BODY,
                      kube=None, now="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
                      base=rec.base_status(spec, spec.pools[0], None, "bot"),
                      events=list[Event]())
    planned = plan(ctx, PlanInput(model=resolve_model(spec, "llm", None),
                                  profile=declared_profile(spec.workload),
                                  policy=policy_for(spec), profile_used=None))
    assert isinstance(planned, Planned), planned
    placed = dataclasses.replace(planned.render_input, affinity=AFFINITY)
    rendered = Rendered(render_input=placed, status=planned.status,
                        objects=render_pool(placed), access=[], running_hash="an-older-plan")
    return planned, canary_stage.canary(ctx, planned, rendered), applied


def test_no_canary_when_the_plan_chose_no_more_replicas_than_the_canary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 11 req/s: one TP2 replica serves it, though the spec allows 6.
    planned, result, applied = _stage(monkeypatch, rate=11.0, bound=6)
    assert planned.render_input.replicas == 1
    assert isinstance(result, CanaryResult), result
    assert result.action == "plain" and applied == []


def test_the_canary_message_counts_the_replicas_the_plan_chose(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 24 req/s: two TP2 replicas, though the spec allows 6.
    planned, result, applied = _stage(monkeypatch, rate=24.0, bound=6)
    assert planned.render_input.replicas == 2
    assert isinstance(result, PoolOutcome), result
    assert result.status.phase == "Canary" and len(applied) == 1
    assert result.rolling is not None
    assert result.rolling.endswith("2 replica(s) keep the previous plan"), result.rolling
