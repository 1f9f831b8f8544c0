"""``spec.pools[].pipelineParallel`` (issue 26 item 1): pinned pipeline stages, planned as
``kvtune plan --pp`` plans them and rendered as one pod of TP x PP GPUs with vLLM's
``--pipeline-parallel-size``; over nodes (whole stages a node, one engine a replica) as a
LeaderWorkerSet (test_op_pipeline_nodes.py); refused (CEL and Python alike) over nodes that
would split a stage or beside dataParallel, beside a chosen layout, with a role or with
tensorParallel auto."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from test_op_leader_worker_set import planned, rendered, spec_for

from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.rollout.plan import plan_one_pool, planning_inputs, policy_for
from kvtune.tuner.facts.catalog import get_model

L70 = "meta-llama/Llama-3.3-70B-Instruct"
STAGED: dict[str, Any] = {"gpuClass": "H100", "name": "h100", "replicas": 1,
                          "tensorParallel": 4, "pipelineParallel": 2}


def test_a_pinned_pipeline_renders_one_pod_of_tp_x_pp_gpus() -> None:
    spec = spec_for(STAGED, L70)
    plan = planned(spec)
    assert plan.layout is not None and plan.layout.label == "TP4+PP2"
    # Each stage holds half the layers: about half TP4's weights per GPU.
    alone = planned(spec_for({**STAGED, "pipelineParallel": 1}, L70))
    assert plan.expected.weights_bytes_per_gpu < 0.6 * alone.expected.weights_bytes_per_gpu
    deployment = rendered(spec)[0]
    assert deployment["kind"] == "Deployment"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (8, "8")
    assert "--tensor-parallel-size=4" in container["args"]
    assert "--pipeline-parallel-size=2" in container["args"]


@pytest.mark.parametrize(("change", "needle"), [
    ({"tensorParallel": "auto"}, "pipelineParallel needs a pinned tensorParallel"),
    ({"nodesPerReplica": 2, "dataParallel": 2}, "over nodesPerReplica nodes runs one engine"),
    ({"pipelineParallel": 3, "nodesPerReplica": 2}, "must be a multiple of nodesPerReplica"),
    ({"tensorParallel": 1, "gpusPerReplica": 8}, "runs at a pinned layout, without a role"),
])
def test_pipeline_parallel_is_refused_where_it_is_not_planned(change: dict[str, Any],
                                                                needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        spec_for({**STAGED, **change}, L70)


def test_pipeline_parallel_counts_in_the_planning_digest() -> None:
    model = get_model(L70)
    staged, flat = spec_for(STAGED, L70), spec_for({**STAGED, "pipelineParallel": 1}, L70)
    profile = declared_profile(staged.workload)
    assert planning_inputs(staged, staged.pools[0], model, profile, policy_for(staged),
                           None) != planning_inputs(flat, flat.pools[0], model, profile,
                                                    policy_for(flat), None)


@pytest.mark.slow
def test_a_pinned_pipeline_with_a_rate_is_planned_by_the_capacity_search() -> None:
    """A rate in the pool's profile: the capacity search replays the PP engine's
    micro-batches (the simulator refused pipeline stages before)."""
    spec = spec_for({**STAGED, "tensorParallel": 1}, "Qwen/Qwen2.5-7B-Instruct")
    profile = declared_profile(spec.workload).model_copy(
        update={"request_rate_per_second": 2.0})
    plan = plan_one_pool(spec, spec.pools[0], get_model(spec.model.name), profile,
                         policy_for(spec))
    assert plan.layout is not None and plan.layout.label == "TP1+PP2"
    assert plan.search is not None and plan.search.capacity_requests_per_second > 0
    assert "--pipeline-parallel-size=2" in plan.vllm_args()
