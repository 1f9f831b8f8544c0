"""The layout chosen by the operator (issue 26 item 1): ``spec.pools[].gpusPerReplica`` has
the planner weigh every layout of that many GPUs, as ``kvtune plan --gpus-per-replica``
does, over the nodes a replica spans (DP a multiple of them); the layout chosen is rendered
(a Deployment on one node, a LeaderWorkerSet over several)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from test_op_leader_worker_set import TWO_NODES, planned, spec_for

from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.render import leader_worker_set as lws
from kvtune.operator.render.objects import RenderInput, render_pool
from kvtune.operator.rollout.plan import planning_inputs, policy_for
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.planner.layout_choice import candidate_layouts

CHOSEN_TWO_NODES: dict[str, Any] = {"gpuClass": "H100", "name": "h100", "replicas": 2,
                                    "gpusPerReplica": 16, "nodesPerReplica": 2}
CHOSEN_ONE_NODE: dict[str, Any] = {"gpuClass": "H200", "name": "h200", "replicas": 1,
                                   "gpusPerReplica": 8}


def _render(pool: dict[str, Any]) -> list[dict[str, Any]]:
    spec = spec_for(pool)
    p = spec.pools[0]
    return render_pool(RenderInput(
        name="dsv3", namespace="llm", pool=p.pool_name, pool_plan=planned(spec),
        model_name=spec.model.name, image="vllm/vllm-openai:v0.33.0", replicas=p.replicas,
        revision=1, nodes_per_replica=p.nodes_per_replica))


def test_a_replica_over_two_nodes_weighs_only_layouts_that_span_them() -> None:
    model = get_model("deepseek-ai/DeepSeek-V3")
    labels = [x.label for x in candidate_layouts(model, 16, nodes=2)]
    assert "TP16" in [x.label for x in candidate_layouts(model, 16)]
    assert "TP16" not in labels and "DP16+EP" in labels and "TP8xDP2+EP" in labels


def test_the_operator_chooses_dp16_ep_over_two_nodes_of_h100() -> None:
    plan = planned(spec_for(CHOSEN_TWO_NODES))
    assert plan.layout is not None and plan.layout.label == "DP16+EP", plan.layout
    considered = {o.layout.label: o for o in plan.layouts_considered}
    assert set(considered) == {"TP8xDP2+EP", "TP4xDP4+EP", "TP2xDP8+EP", "DP16+EP"}
    assert considered["DP16+EP"].chosen
    # Its KV holds more tokens per replica than the pinned TP8xDP2+EP's.
    assert considered["DP16+EP"].kv_cache_tokens_per_replica > \
        considered["TP8xDP2+EP"].kv_cache_tokens_per_replica
    assert plan.reasons[0].knob == "layout"
    group = _render(CHOSEN_TWO_NODES)[0]
    assert group["kind"] == lws.KIND and group["spec"]["leaderWorkerTemplate"]["size"] == 2
    args = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0][
        "args"]
    assert "--data-parallel-size=16" in args and "--data-parallel-size-local=8" in args
    assert "--enable-expert-parallel" in args


def test_one_node_of_h200_gets_dp8_ep_as_a_deployment_of_eight_gpus() -> None:
    plan = planned(spec_for(CHOSEN_ONE_NODE))
    assert plan.layout is not None and plan.layout.label == "DP8+EP"
    deployment = _render(CHOSEN_ONE_NODE)[0]
    assert deployment["kind"] == "Deployment"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (8, "8")
    assert "--data-parallel-size=8" in container["args"]


@pytest.mark.parametrize(("change", "needle"), [
    ({"tensorParallel": 2}, "has kvtune choose the whole layout"),
    ({"dataParallel": 2}, "has kvtune choose the whole layout"),
    ({"expertParallel": True}, "has kvtune choose the whole layout"),
    ({"gpusPerReplica": 9}, "must be a multiple of nodesPerReplica"),
])
def test_a_chosen_layout_refuses_pins_beside_it(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        spec_for({**CHOSEN_TWO_NODES, **change})


def test_gpus_per_replica_counts_in_the_planning_digest() -> None:
    model, spec = get_model("deepseek-ai/DeepSeek-V3"), spec_for(CHOSEN_TWO_NODES)
    pinned = spec_for(TWO_NODES)
    profile = declared_profile(spec.workload)
    assert planning_inputs(spec, spec.pools[0], model, profile, policy_for(spec), None) != \
        planning_inputs(pinned, pinned.pools[0], model, profile, policy_for(pinned), None)
