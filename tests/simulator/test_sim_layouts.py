"""The simulator's engine under a parallel layout (tuner/layout.py): DP's expert share of the
weights, DCP's scheduler block and per-rank KV bytes, EP's collectives (kernel_costs)."""

from __future__ import annotations

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.weights import weights_bytes_per_gpu
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.simulator.engine import simulated_plan, step_cost_for

DSV2_LITE = get_model("deepseek-ai/DeepSeek-V2-Lite")
H100 = get_gpu_class("H100")


def _request(**layout: object) -> PlanRequest:
    return PlanRequest(model=DSV2_LITE, gpu=H100, profile=preset_profile("chat"),
                       **layout)  # type: ignore[arg-type]


def test_dcp_runs_a_block_of_block_size_x_dcp_tokens_and_half_the_kv_bytes() -> None:
    tp2 = _request(tensor_parallel=2)
    dcp2 = _request(tensor_parallel=2, decode_context_parallel=2)
    plan = plan_pool(tp2).plan
    plain, split = simulated_plan(tp2, plan, "tp2"), simulated_plan(dcp2, plan, "dcp2")
    assert split.engine.block_size == 2 * plain.engine.block_size
    assert split.engine.num_gpu_blocks == plain.engine.num_gpu_blocks
    assert split.cost.kv_bytes_per_token * 2 == plain.cost.kv_bytes_per_token
    # One more collective per layer for DCP's gather and reduce.
    layers = DSV2_LITE.num_hidden_layers
    assert split.cost.kernels.all_reduces_per_step == (
        plain.cost.kernels.all_reduces_per_step + layers)


def test_dp_ep_weights_and_all_to_alls() -> None:
    tp2 = step_cost_for(_request(tensor_parallel=2), "auto")
    dp2 = step_cost_for(_request(data_parallel=2, expert_parallel=True), "auto")
    assert dp2.weights_bytes == weights_bytes_per_gpu(DSV2_LITE, "auto", 1, data_parallel=2)
    assert tp2.weights_bytes < dp2.weights_bytes
    moe = DSV2_LITE.moe
    assert moe is not None
    # A dispatch and a combine per MoE layer, of the k routed copies, at half the bytes.
    assert dp2.kernels.all_reduces_per_step == 2 * (DSV2_LITE.num_hidden_layers
                                                    - moe.num_dense_layers)
    assert dp2.kernels.all_reduce_bytes_per_token == (
        DSV2_LITE.hidden_size * 2 * moe.experts_per_token // 2)
    assert tp2.kernels.all_reduces_per_step == 2 * DSV2_LITE.num_hidden_layers
