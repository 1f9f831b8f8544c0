"""Pipeline parallel, pinned (``--pp``): each stage's layers, weights and KV as vLLM 0.33 lays
them out, the decode step with pp micro-batches in flight, and prefill across the stages
(docs/layouts.md). vLLM's own split and KV-cache configs: tests/oracle/
test_oracle_layout_kv_config.py."""

from __future__ import annotations

import re

import pytest

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.layouts import pipeline_stage_layers, pipeline_stages
from kvtune.tuner.facts.weights import weights_bytes_per_gpu
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner import decode
from kvtune.tuner.planner.layout_choice import candidate_layouts
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.presets import preset_profile

L70 = "meta-llama/Llama-3.3-70B-Instruct"
DSV3 = "deepseek-ai/DeepSeek-V3"


def _plan(model: str, gpu: str, tp: int, pp: int) -> PoolPlan:
    return plan_pool(PlanRequest(model=get_model(model), gpu=get_gpu_class(gpu),
                                 tensor_parallel=tp, pipeline_parallel=pp,
                                 profile=preset_profile("chat")))


def _ttft_seconds(pool: PoolPlan) -> float:
    """The p95 prompt's prefill time the max-num-batched-tokens reason quotes."""
    reason = next(r for r in pool.reasons if r.knob == "max-num-batched-tokens")
    found = re.search(r"prefills in about ([0-9.]+) s", reason.message)
    assert found, reason.message
    return float(found.group(1))


def test_flag_label_and_gpus() -> None:
    layout = ParallelLayout(tensor_parallel=4, pipeline_parallel=2)
    assert layout.label == "TP4+PP2" and layout.gpus == 8 and layout.stage_gpus == 4
    assert layout.vllm_args() == ["--tensor-parallel-size=4", "--pipeline-parallel-size=2"]
    moe = ParallelLayout(tensor_parallel=2, data_parallel=2, expert_parallel=True,
                         pipeline_parallel=2)
    # vLLM's EP group is one stage's TP x DP ranks.
    assert moe.gpus == 8 and moe.expert_parallel_size == 4 and moe.label == "TP2xDP2+EP+PP2"


@pytest.mark.parametrize(("layers", "pp", "shares"), [
    (80, 2, (40, 40)), (61, 4, (15, 15, 16, 15)), (80, 3, (27, 27, 26)),
    (61, 8, (7, 7, 8, 8, 8, 8, 8, 7)),
])
def test_stage_layers_split_as_get_pp_indices(layers: int, pp: int,
                                              shares: tuple[int, ...]) -> None:
    # vLLM: even shares, the remainder to the stages before the last, counting back.
    assert pipeline_stage_layers(layers, pp) == shares
    assert sum(shares) == layers


def test_stage_weights_add_up_to_the_engines_and_the_tables_go_first_and_last() -> None:
    model = get_model(L70)
    whole = weights_bytes_per_gpu(model, "auto", 4)
    stages = pipeline_stages(model, "auto", ParallelLayout(tensor_parallel=4,
                                                           pipeline_parallel=4))
    assert [s.layers for s in stages] == [20, 20, 20, 20]
    # The stages hold the engine's TP4 share between them (rounding: a byte per stage).
    assert abs(sum(s.weights_bytes for s in stages) - whole) <= 4
    table = 128_256 * 8_192 * 2 // 4
    assert stages[0].weights_bytes == stages[3].weights_bytes
    assert stages[0].weights_bytes - stages[1].weights_bytes == table
    assert stages[1].weights_bytes == stages[2].weights_bytes


def test_deeper_pp_lowers_weights_per_gpu_and_raises_kv_tokens() -> None:
    plans = [_plan(L70, "H100", 4, pp) for pp in (1, 2, 4)]
    weights = [p.expected.weights_bytes_per_gpu for p in plans]
    tokens = [p.expected.kv_cache_tokens for p in plans]
    assert weights[0] > weights[1] > weights[2]
    assert tokens[0] < tokens[1] < tokens[2]
    # Each stage holds fewer layers' KV: a GPU's bytes per block fall with the layers.
    assert plans[2].expected.num_gpu_blocks > 3 * plans[0].expected.num_gpu_blocks
    assert plans[1].layout is not None and plans[1].layout.label == "TP4+PP2"
    assert "--pipeline-parallel-size=2" in plans[1].vllm_args()


def test_ttft_rises_with_pp_at_the_same_gpus_and_at_the_same_tp() -> None:
    same_gpus = [_ttft_seconds(_plan(L70, "H100", 8 // pp, pp)) for pp in (1, 2, 4)]
    assert same_gpus[0] < same_gpus[1] < same_gpus[2]
    model, gpu = get_model(L70), get_gpu_class("H100")
    alone = decode.prefill_seconds_per_token(model, gpu, 4, 16)
    staged = decode.prefill_seconds_per_token(
        model, gpu, 4, 16, ParallelLayout(tensor_parallel=4, pipeline_parallel=2))
    # The same compute per stage in turn, plus one send of a token's activations.
    assert staged == pytest.approx(alone + 8_192 * 2 * 2 / 450e9)


def test_decode_step_is_pp_micro_batches_across_every_stage_plus_the_sends() -> None:
    model, gpu = get_model(L70), get_gpu_class("H100")
    layout = ParallelLayout(tensor_parallel=4, pipeline_parallel=2)
    weights, kv = 20 * 2**30, 2 * 2**20
    stage = decode.decode_step_seconds(model, gpu, 4, weights, 32, kv,
                                       ParallelLayout(tensor_parallel=4))
    comm = decode.communication_seconds(model, gpu, ParallelLayout(tensor_parallel=4), 32)
    send = 32 * 8_192 * 2 * 2 / 450e9  # hidden states + residual over NVLink
    step = decode.decode_step_seconds(model, gpu, 4, weights, 64, kv, layout)
    # 64 sequences: two micro-batches of 32, each stage's all-reduces over its half the layers.
    assert step == pytest.approx(2 * (stage - comm / 2) + send)
    # Across nodes (16 GPUs of a class with 8 per node) the send takes the RDMA NIC.
    wide = ParallelLayout(tensor_parallel=8, pipeline_parallel=2)
    assert decode.pipeline_send_seconds(model, gpu, wide, 32) == pytest.approx(
        32 * 8_192 * 4 / 50e9)
    # So does a replica that would fit one node, laid over two (nodesPerReplica: 2).
    split = ParallelLayout(tensor_parallel=2, pipeline_parallel=2, nodes_per_replica=2)
    assert decode.pipeline_send_seconds(model, gpu, split, 32) == pytest.approx(
        32 * 8_192 * 4 / 50e9)
    assert decode.pipeline_send_seconds(
        model, gpu, split.model_copy(update={"nodes_per_replica": 1}), 32) == pytest.approx(
        32 * 8_192 * 4 / 450e9)


def test_pp_pins_are_refused_where_they_cannot_work() -> None:
    model = get_model(DSV3)
    with pytest.raises(InvalidInput, match="pipeline_parallel"):
        candidate_layouts(model, 8, pp=3)
    # PP splits the GPUs first; the rest is laid out as without it.
    labels = [x.label for x in candidate_layouts(model, 16, tp=8, pp=2)]
    assert labels == ["TP8+PP2"]
    # Over nodes, each node holds whole stages, and every layout says over how many.
    over_nodes = candidate_layouts(model, 16, tp=8, pp=2, nodes=2)
    assert {x.nodes_per_replica for x in over_nodes} == {2}
    with pytest.raises(InvalidInput, match=r"nodes_per_replica.*whole stages"):
        candidate_layouts(model, 24, tp=8, pp=3, nodes=2)
    with pytest.raises(InvalidInput, match="one attention kind"):
        _plan("google/gemma-3-27b-it", "H100", 2, 2)
    with pytest.raises(InvalidInput, match="at most that many stages"):
        _plan(L70, "H100", 1, 81)


def test_the_simulator_costs_one_stage_of_a_pp_engine() -> None:
    """The simulator replays PP (it refused it before: tests/simulator/test_sim_pipeline.py):
    its step is one stage's, the heaviest stage's weights and half the layers' KV at PP 2."""
    from kvtune.tuner.simulator.engine import step_cost_for

    def request(pp: int) -> PlanRequest:
        return PlanRequest(model=get_model(L70), gpu=get_gpu_class("H100"), tensor_parallel=4,
                           pipeline_parallel=pp, profile=preset_profile("chat"))

    stage, whole = step_cost_for(request(2), "auto"), step_cost_for(request(1), "auto")
    assert stage.kv_bytes_per_token * 2 == whole.kv_bytes_per_token
    assert stage.weights_bytes == max(
        s.weights_bytes for s in pipeline_stages(get_model(L70), "auto", request(2).layout))
