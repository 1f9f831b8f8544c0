"""Pipeline parallel across nodes (issue 26 item 2): a replica of one engine in stages over
``nodesPerReplica`` nodes (Llama-3.1-405B as TP8 x PP2 on 2 nodes of 8 H100) is a
LeaderWorkerSet of one pod per node, each with whole stages, joined without Ray by vLLM 0.33's
``--nnodes``/``--node-rank``/``--master-addr``/``--master-port``; the worker runs headless.
Each pod's line, expanded as the kubelet and the shell expand it, parses in vLLM's own
``vllm serve`` parser, and vLLM's ``ParallelConfig`` lays the ranks out as the render
assumes (8 GPUs a node, the worker from global rank 8)."""

from __future__ import annotations

from typing import Any

import pytest
from test_op_leader_worker_set import _expand, _group, planned, rendered, spec_for

from kvtune.operator.render import leader_worker_set as lws
from kvtune.operator.render.objects import RenderError, RenderInput, render_pool
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.kv_links import kv_link
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.planner.decode import pipeline_send_seconds

L405 = "meta-llama/Llama-3.1-405B-Instruct"
L70 = "meta-llama/Llama-3.3-70B-Instruct"
STAGES_OVER_NODES: dict[str, Any] = {"gpuClass": "H100", "name": "h100", "replicas": 1,
                                     "tensorParallel": 8, "pipelineParallel": 2,
                                     "nodesPerReplica": 2}
LEADER_ADDRESS = "10.1.2.3"


def _containers(pool: dict[str, Any] = STAGES_OVER_NODES, model: str = L405
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    lwt = _group(rendered(spec_for(pool, model)))["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == pool["nodesPerReplica"]
    return (lwt["leaderTemplate"]["spec"]["containers"][0],
            lwt["workerTemplate"]["spec"]["containers"][0])


def test_a_staged_replica_over_two_nodes_is_an_lws_of_two_8_gpu_pods() -> None:
    plan = planned(spec_for(STAGES_OVER_NODES, L405))
    assert plan.layout is not None and plan.layout.label == "TP8+PP2"
    assert plan.layout.gpus == 16
    leader, worker = _containers()
    for container in (leader, worker):  # one node's 8 GPUs each, not the replica's 16
        assert container["resources"]["limits"]["nvidia.com/gpu"] in (8, "8")
    assert "--nnodes=2" in leader["args"] and "--master-port=29501" in leader["args"]
    assert "--master-addr=$(LWS_LEADER_ADDRESS)" in leader["args"]
    # No data-parallel coordination: one engine per replica.
    assert not any(a.startswith("--data-parallel") for a in leader["args"])
    assert "--headless" not in leader["args"] and "ports" in leader
    assert worker["command"][:2] == ["/bin/sh", "-c"] and "--headless" in worker["args"]
    assert lws.NODE_RANK_FLAG in worker["command"][2] and "ports" not in worker
    assert worker["args"][:-1] == [*leader["command"], *leader["args"]]


def _serve_parser() -> Any:
    """vLLM 0.33's ``vllm serve`` parser (its device default, which needs a GPU, stubbed)."""
    from unittest import mock

    from vllm.config.device import DeviceConfig
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def on_cpu(self: Any) -> None:
        self.device_type = "cpu"

    with mock.patch.object(DeviceConfig, "__post_init__", on_cpu):
        return make_arg_parser(FlexibleArgumentParser())


@pytest.mark.vllm
@pytest.mark.parametrize("model", [L405, "deepseek-ai/DeepSeek-V3"])
def test_each_pods_line_parses_and_vllm_lays_out_whole_stages_per_node(model: str) -> None:
    """The leader is node 0 and serves HTTP; the worker is node 1, headless. vLLM's own
    ``ParallelConfig`` from the parsed flags: a DP replica spanning both nodes, 8 local
    workers each, the worker's first global rank 8 (stage 1: ranks are TP fastest), and
    ``vllm serve`` runs the worker's executor only (``node_rank_within_dp > 0``)."""
    from vllm.config.parallel import ParallelConfig

    parser = _serve_parser()
    leader, worker = _containers(model=model)
    for container, index in ((leader, 0), (worker, 1)):
        argv = _expand(container, {"LWS_LEADER_ADDRESS": LEADER_ADDRESS,
                                   "LWS_WORKER_INDEX": str(index)})
        assert "$(" not in " ".join(argv)
        ns = parser.parse_args(argv[argv.index("serve") + 1:])
        assert ns.model_tag == model
        assert (ns.tensor_parallel_size, ns.pipeline_parallel_size) == (8, 2)
        assert (ns.nnodes, ns.node_rank) == (2, index)
        assert (ns.master_addr, ns.master_port) == (LEADER_ADDRESS, lws.MASTER_PORT)
        assert ns.headless == (index == 1) and ns.data_parallel_size == 1
        # EngineArgs.create_engine_config's inference for internal DP over nodes:
        # data_parallel_size_local = max(local world // world within DP, 1) = 1.
        config = ParallelConfig(
            tensor_parallel_size=ns.tensor_parallel_size,
            pipeline_parallel_size=ns.pipeline_parallel_size,
            data_parallel_size=ns.data_parallel_size, data_parallel_size_local=1,
            nnodes=ns.nnodes, node_rank=ns.node_rank, master_addr=ns.master_addr,
            master_port=ns.master_port, distributed_executor_backend="mp")
        assert config.world_size == 16 and config.nnodes_within_dp == 2
        assert config.local_world_size == 8  # the pod's GPUs
        assert config.node_rank_within_dp == index
        # The executor's first global rank on this node (MultiprocExecutor): stage `index`.
        first = config.local_world_size * config.node_rank_within_dp
        assert first // config.tensor_parallel_size == index


@pytest.mark.parametrize(("layout", "needle"), [
    ({"pipelineParallel": 3, "nodesPerReplica": 2}, "does not divide the layout's "
     "pipelineParallel=3"),
    ({"dataParallel": 2}, "dataParallel=2 beside pipelineParallel=2"),
])
def test_the_render_refuses_a_split_the_api_would(layout: dict[str, Any], needle: str) -> None:
    """The renderer's own guard (a spec the API admitted before a rule, or built in code):
    the CRD refuses these too (bad_specs.py)."""
    admitted = spec_for({**STAGES_OVER_NODES, **layout, "nodesPerReplica": 1}, L405)
    pool_plan = planned(admitted)
    nodes = layout.get("nodesPerReplica", 2)
    with pytest.raises(RenderError, match=needle):
        render_pool(RenderInput(
            name="l405", namespace="llm", pool="h100", pool_plan=pool_plan,
            model_name=L405, image="vllm/vllm-openai:v0.33.0", replicas=1, revision=1,
            nodes_per_replica=nodes))


def test_the_stage_sends_cross_the_nic_when_the_replica_spans_nodes() -> None:
    """tuner/planner/decode.py sends between stages over the link kv_link picks for the
    replica's GPUs: the planned TP8 x PP2 (16 H100, two nodes) at the RDMA NIC's rate, a
    TP4 x PP2 replica (one node) at NVLink's."""
    plan = planned(spec_for(STAGES_OVER_NODES, L405))
    assert plan.layout is not None
    model, gpu = get_model(L405), get_gpu_class("H100")
    one_node = ParallelLayout(tensor_parallel=4, pipeline_parallel=2)
    over_nic = pipeline_send_seconds(model, gpu, plan.layout, 64)
    over_nvlink = pipeline_send_seconds(model, gpu, one_node, 64)
    nic, nvlink = kv_link("H100", plan.layout.gpus), kv_link("H100", one_node.gpus)
    assert (nic.fabric, nvlink.fabric) == ("RDMA", "NVLink")
    assert over_nic / over_nvlink == pytest.approx(nvlink.bytes_per_second
                                                   / nic.bytes_per_second)
    assert over_nic > over_nvlink


def test_a_replica_over_nodes_that_would_fit_one_sends_over_the_nic() -> None:
    """TP2 x PP2 (4 GPUs) laid over 2 nodes: the planner reads nodesPerReplica, so the stages'
    sends are charged at the NIC's rate, not NVLink's, and the digest tells the two apart."""
    over_two = spec_for({**STAGES_OVER_NODES, "tensorParallel": 2}, L70)
    on_one = spec_for({**STAGES_OVER_NODES, "tensorParallel": 2, "nodesPerReplica": 1}, L70)
    split, local = planned(over_two), planned(on_one)
    assert split.layout is not None and local.layout is not None
    assert (split.layout.nodes_per_replica, local.layout.nodes_per_replica) == (2, 1)
    model, gpu = get_model(L70), get_gpu_class("H100")
    nic, nvlink = kv_link("H100", 4, nodes=2), kv_link("H100", 4)
    assert (nic.fabric, nvlink.fabric) == ("RDMA", "NVLink")
    assert pipeline_send_seconds(model, gpu, split.layout, 64) / pipeline_send_seconds(
        model, gpu, local.layout, 64) == pytest.approx(nvlink.bytes_per_second
                                                       / nic.bytes_per_second)
    # What the plan expects moves with the link.
    assert split.expected != local.expected
