"""A pool that can never work fails alone, with a message naming the field, the value and
the fix, before anything is applied (no API access is needed to get there)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC

from kvtune.operator import reconcile as rec
from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.kube import pools as gpu_pools
from kvtune.operator.rollout.outcome import Event, PoolContext
from kvtune.operator.rollout.plan import PlanInput, policy_for, resolve_model
from kvtune.operator.rollout.pool import rollout_pool

BODY = {"metadata": {"name": "bot", "namespace": "llm", "uid": "u"}}


def _outcome(spec_dict: dict[str, Any],
             nodes: dict[str, gpu_pools.GPUPool] | None = None) -> Any:
    spec = InferenceDeploymentSpec.model_validate(spec_dict)
    model = resolve_model(spec, "llm", None)
    events: list[Event] = []
    ctx = PoolContext(spec=spec, index=0, pool=spec.pools[0], body=BODY,
                      kube=None, now="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
                      base=rec.base_status(spec, spec.pools[0], None, "bot"), events=events)
    return rollout_pool(ctx, PlanInput(  # one pool's stages, as reconcile runs them
        model=model, profile=declared_profile(spec.workload), policy=policy_for(spec),
        profile_used=None), nodes or {})


@pytest.mark.parametrize(("change", "reason", "needles"), [
    ({"pools": [{"gpuClass": "Z999"}]}, "InvalidSpec",
     ["spec.pools[0].gpuClass", "Z999", "H100"]),
    ({"model": {"name": "meta-llama/Llama-3.3-70B-Instruct"},
      "pools": [{"gpuClass": "H100", "tensorParallel": 1}], "rollout": None},
     "NoFeasiblePlan", ["spec.pools[0]", "H100", "tensorParallel=1"]),
    ({"tuning": {"pin": {"kvCacheDtype": "fp8_ds_mla"}}}, "InvalidSpec",
     ["spec.pools[0]", "spec.tuning.pin.kvCacheDtype", "fp8_ds_mla"]),
])
def test_pool_failures_name_field_value_and_fix(
    change: dict[str, Any], reason: str, needles: list[str]
) -> None:
    spec = {**copy.deepcopy(SAMPLE_SPEC), **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    outcome = _outcome(spec)
    assert outcome.status.phase == "Failed"
    assert outcome.failure is not None and outcome.failure[0] == reason
    for needle in needles:
        assert needle in outcome.failure[1], outcome.failure[1]


def test_pool_without_nodes_is_planned_but_not_applied() -> None:
    outcome = _outcome(copy.deepcopy(SAMPLE_SPEC))
    assert outcome.no_nodes and outcome.status.phase == "NoNodes"
    assert outcome.status.plan is not None and outcome.status.revision == 1
    assert "H200" in outcome.status.message


def _h100_nodes(count: int, gpus: int) -> dict[str, gpu_pools.GPUPool]:
    nodes = [gpu_pools.GPUNode(name=f"n{i}", gpu_class="H100", gpus=gpus,
                               selector_key="nvidia.com/gpu.product",
                               selector_value="NVIDIA-H100-80GB-HBM3", schedulable=True)
             for i in range(count)]
    return gpu_pools.pools_of(nodes)


def test_capacity_that_can_never_be_met_fails_at_once_with_the_numbers() -> None:
    """512 replicas x TP 2 on four 8-GPU nodes (issue 25 item 5): Degraded before anything is
    applied, naming the replicas, the GPUs needed, the GPUs there and what fits."""
    spec = {**copy.deepcopy(SAMPLE_SPEC),
            "pools": [{"gpuClass": "H100", "replicas": 512, "tensorParallel": 2}]}
    spec.pop("rollout")
    outcome = _outcome(spec, _h100_nodes(4, 8))
    assert outcome.status.phase == "Failed" and outcome.failure[0] == "InvalidSpec"
    assert outcome.failure[1] == (
        "spec.pools[0].replicas=512: 512 replicas x tensorParallel=2 need 1024 H100 GPUs, "
        "but the 4 schedulable H100 node(s) it may use have 32 in all, room for 16 "
        "replica(s); lower replicas to at most 16 or add nodes")
    # Per node: three 3-GPU nodes hold one TP-2 replica each, not four (9 GPUs in all).
    spec["pools"] = [{"gpuClass": "H100", "replicas": 4, "tensorParallel": 2}]
    outcome = _outcome(spec, _h100_nodes(3, 3))
    assert outcome.failure is not None and "room for 3 replica(s)" in outcome.failure[1]
