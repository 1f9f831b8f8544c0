"""A replica that spans nodes (issue 26 item 2): a LeaderWorkerSet of one pod per node running
vLLM 0.33's multi-node data parallel, the leader serving HTTP and the workers headless, each
with its ranks; the flags parse in vLLM's own ``vllm serve`` parser as the kubelet and the
shell expand them on each pod."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from bad_specs import BASE
from pydantic import ValidationError

from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.kube import leader_worker_sets
from kvtune.operator.render import leader_worker_set as lws
from kvtune.operator.render.objects import RenderInput, render_pool
from kvtune.operator.rollout.observe import rollout_done
from kvtune.operator.rollout.plan import plan_one_pool, planning_inputs, policy_for
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.plan import PoolPlan

DEEPSEEK = "deepseek-ai/DeepSeek-V3"
# DeepSeek-V3 on 2 nodes x 8 H100: DP16 attention with expert parallel, 8 engines a node.
TWO_NODES: dict[str, Any] = {"gpuClass": "H100", "name": "h100", "replicas": 2,
                             "tensorParallel": 1, "dataParallel": 16, "expertParallel": True,
                             "nodesPerReplica": 2}


def spec_for(pool: dict[str, Any], model: str = DEEPSEEK) -> InferenceDeploymentSpec:
    raw = copy.deepcopy(BASE)
    raw["model"], raw["pools"] = {"name": model}, [pool]
    return InferenceDeploymentSpec.model_validate(raw)


def planned(spec: InferenceDeploymentSpec) -> PoolPlan:
    return plan_one_pool(spec, spec.pools[0], get_model(spec.model.name),
                         declared_profile(spec.workload), policy_for(spec))


def rendered(spec: InferenceDeploymentSpec) -> list[dict[str, Any]]:
    pool = spec.pools[0]
    return render_pool(RenderInput(
        name="dsv3", namespace="llm", pool=pool.pool_name, pool_plan=planned(spec),
        model_name=spec.model.name, image="vllm/vllm-openai:v0.33.0", replicas=pool.replicas,
        revision=1, nodes_per_replica=pool.nodes_per_replica))


@pytest.mark.parametrize(("change", "needle"), [
    ({"nodesPerReplica": 3}, "must be a multiple of nodesPerReplica"),
    ({"dataParallel": 1}, "must be a multiple of nodesPerReplica"),
    ({"tensorParallel": "auto"}, "dataParallel needs a pinned tensorParallel"),
])
def test_a_layout_that_cannot_span_its_nodes_is_refused(change: dict[str, Any],
                                                        needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        spec_for({**TWO_NODES, **change})


def test_the_layout_is_planned_and_counts_in_the_planning_digest() -> None:
    spec = spec_for(TWO_NODES)
    plan = planned(spec)
    assert plan.layout is not None and plan.layout.gpus == 16 and plan.layout.expert_parallel
    assert "--data-parallel-size=16" in plan.vllm_args()
    model, profile = get_model(DEEPSEEK), declared_profile(spec.workload)
    one_node = spec_for({**TWO_NODES, "dataParallel": 8, "nodesPerReplica": 1})
    assert planning_inputs(spec, spec.pools[0], model, profile, policy_for(spec), None) != \
        planning_inputs(one_node, one_node.pools[0], model, profile, policy_for(spec), None)


def _group(objects: list[dict[str, Any]]) -> dict[str, Any]:
    assert [o["kind"] for o in objects] == [lws.KIND, "Service", "PodDisruptionBudget"]
    return objects[0]


def test_a_replica_over_two_nodes_is_a_leader_worker_set_of_two_pods() -> None:
    objects = rendered(spec_for(TWO_NODES))
    group, service = _group(objects), objects[1]
    assert group["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert group["spec"]["replicas"] == 2
    lwt = group["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    # A headless Service per group: the pool's Service has the LWS's name (the Shared policy's).
    assert group["spec"]["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    for container in (leader, worker):  # 8 GPUs a pod, not the replica's 16
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "--data-parallel-size-local=8" in leader["args"]
    assert "--data-parallel-address=$(LWS_LEADER_ADDRESS)" in leader["args"]
    assert "--headless" not in leader["args"] and "ports" in leader
    assert worker["command"][:2] == ["/bin/sh", "-c"] and "--headless" in worker["args"]
    assert "ports" not in worker and "readinessProbe" not in worker
    # The workers run the leader's line (its vLLM command first), plus --headless.
    assert worker["args"][:-1] == [*leader["command"], *leader["args"]]
    # The Service sends HTTP to the leaders only.
    assert service["spec"]["selector"][lws.LABEL_WORKER_INDEX] == "0"


def _expand(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The argv a pod runs: ``$(VAR)`` expanded as the kubelet does, then a worker's
    ``/bin/sh -c`` script (``exec "$@" --flag="$((VAR * n))"``) as the shell does."""
    def kubelet(text: str) -> str:
        return re.sub(r"\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], text)

    command = [kubelet(a) for a in container.get("command") or []]
    args = [kubelet(a) for a in container.get("args") or []]
    if command[:2] != ["/bin/sh", "-c"]:
        return [*command, *args]
    script = re.fullmatch(r'exec "\$@" (--[a-z-]+)="\$\(\(([A-Z_]+) \* (\d+)\)\)"', command[2])
    assert script is not None, command[2]
    flag, var, factor = script.groups()
    return [*args, f"{flag}={int(env[var]) * int(factor)}"]


@pytest.mark.vllm
def test_each_pods_line_parses_in_vllms_serve_parser_with_its_ranks() -> None:
    """vLLM 0.33's own ``vllm serve`` parser (``make_arg_parser``; its device default, which
    needs a GPU, is stubbed) reads each pod's line: the leader the API server with ranks 0-7,
    the worker headless from rank 8, both coordinated by the leader's address and port."""
    from unittest import mock

    from vllm.config.device import DeviceConfig
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def on_cpu(self: Any) -> None:
        self.device_type = "cpu"

    with mock.patch.object(DeviceConfig, "__post_init__", on_cpu):
        parser = make_arg_parser(FlexibleArgumentParser())
    lwt = _group(rendered(spec_for(TWO_NODES)))["spec"]["leaderWorkerTemplate"]
    for template, index in (("leaderTemplate", 0), ("workerTemplate", 1)):
        container = lwt[template]["spec"]["containers"][0]
        argv = _expand(container, {"LWS_LEADER_ADDRESS": "10.1.2.3",
                                   "LWS_WORKER_INDEX": str(index)})
        serve = argv.index("serve")
        ns = parser.parse_args(argv[serve + 1:])
        assert ns.model_tag == DEEPSEEK
        assert (ns.data_parallel_size, ns.data_parallel_size_local) == (16, 8)
        assert ns.enable_expert_parallel and ns.tensor_parallel_size == 1
        assert ns.data_parallel_address == "10.1.2.3"
        assert ns.data_parallel_rpc_port == lws.DP_RPC_PORT
        assert ns.headless == (index == 1)
        assert (ns.data_parallel_start_rank or 0) == index * 8
        assert json.dumps(argv).count("$(") == 0


def _reported(generation: int, seen: int, *, updated: int, ready: int, total: int,
              condition: str) -> dict[str, Any]:
    """An LWS of 2 groups with the status the v0.9.0 controller writes."""
    return {"kind": lws.KIND, "metadata": {"name": "dsv3-h100", "generation": generation},
            "spec": {"replicas": 2},
            "status": {"observedGeneration": seen, "updatedReplicas": updated,
                       "readyReplicas": ready, "replicas": total, "conditions": [
                           {"type": condition, "status": "True", "observedGeneration": seen}]}}


@pytest.mark.parametrize(("status", "done", "left"), [
    (dict(seen=1, updated=0, ready=0, total=0, condition="Progressing"), False,
     "controller has not seen"),
    (dict(seen=2, updated=1, ready=2, total=2, condition="UpdateInProgress"), False,
     "1/2 groups updated"),
    # Every group counted updated, but the controller still rolls (UpdateInProgress).
    (dict(seen=2, updated=2, ready=2, total=2, condition="UpdateInProgress"), False,
     "2/2 groups updated"),
    (dict(seen=2, updated=2, ready=2, total=3, condition="Progressing"), False,
     "1 old groups pending termination"),
    (dict(seen=2, updated=2, ready=1, total=2, condition="Progressing"), False,
     "1/2 groups ready"),
    # Counts complete but Available not yet set for this generation.
    (dict(seen=2, updated=2, ready=2, total=2, condition="Progressing"), False,
     "2/2 groups ready"),
    (dict(seen=2, updated=2, ready=2, total=2, condition="Available"), True,
     "2/2 groups updated and ready"),
])
def test_the_rollout_is_read_from_the_lws_status(status: dict[str, Any], done: bool,
                                                 left: str) -> None:
    got, message = rollout_done(_reported(2, **status))
    assert got is done and left in message and "dsv3-h100" in message, message


def test_the_lws_pods_are_selected_by_their_pool() -> None:
    group = rendered(spec_for(TWO_NODES))[0]
    assert leader_worker_sets.pod_selector(group) == \
        "kvtune.io/deployment=dsv3,kvtune.io/pool=h100"
