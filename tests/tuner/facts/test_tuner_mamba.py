"""Hybrid attention/Mamba models parse and size as vLLM 0.33 lays them out (the same
figures checked against vLLM's own code: tests/oracle/test_oracle_hybrid_kv_config.py)."""

from __future__ import annotations

import pytest
from hybrid_configs import (
    FALCON_H1_7B,
    GRANITE_4_H_SMALL,
    HYBRID_CONFIGS,
    JAMBA_V01,
    NEMOTRON_H_8B,
    QWEN3_NEXT_80B,
)

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.kvmemory import (
    block_bytes,
    hybrid_block_size,
    kv_bytes_per_token,
    kv_cache_groups,
    kv_cache_tokens,
    mamba_state_bytes,
    num_gpu_blocks,
    request_blocks,
)
from kvtune.tuner.facts.mamba import state_shapes
from kvtune.tuner.facts.models import ModelArchitecture


def _model(name: str) -> ModelArchitecture:
    return ModelArchitecture.from_hf_config(HYBRID_CONFIGS[name], name)


@pytest.mark.parametrize(("name", "layers"), [
    ("granite-4.0-h-small", {"full": 4, "mamba": 36}),
    ("nemotron-h-8b", {"full": 4, "mamba": 24}),
    ("jamba-v0.1", {"full": 4, "mamba": 28}),
    ("falcon-h1-7b", {"full": 44, "mamba": 44}),
    ("qwen3-next-80b-a3b", {"full": 12, "mamba": 36}),
    ("gemma-3-12b", {"full": 8, "sliding_window": 40}),
])
def test_hybrid_configs_parse_into_their_layer_kinds(name: str, layers: dict[str, int]) -> None:
    model = _model(name)
    assert {g.kind: g.num_layers for g in model.layer_groups} == layers
    assert (model.mamba is None) == ("mamba" not in layers)


def test_granite_worked_example() -> None:
    model = _model("granite-4.0-h-small")
    # Mamba-2: conv 3 x (8,192 + 2 x 128), SSM 128 heads x 64 x 128, both bf16.
    assert state_shapes(model.mamba, 1) == ((3, 8448), (128, 64, 128))  # type: ignore[arg-type]
    state = mamba_state_bytes(model, 1)
    assert state == (3 * 8448 + 128 * 64 * 128) * 2 == 2_147_840
    # One attention token in one layer: 2 x 8 x 128 x 2 = 4,096 bytes; the block rises to
    # 16 x cdiv(2,147,840, 16 x 4,096) = 528 tokens, and a block of the pool is 4 layers' pages.
    assert hybrid_block_size(model, "auto", 1, 16) == 528
    assert block_bytes(model, "auto", 1, 16) == 4 * 528 * 4096
    assert [(g.kind, g.layers_per_group, g.count) for g in kv_cache_groups(model)] == [
        ("full", 4, 1), ("mamba", 4, 9)]
    # A request holds one block per Mamba group and a block per 528 tokens of attention.
    assert request_blocks(model, 1000, 528, 8192, 131072) == 2 + 9
    assert kv_bytes_per_token(model, "auto", 1) == 4 * 4096
    blocks = num_gpu_blocks(model, "auto", 1, 16, 40 * 2**30)
    assert blocks == 40 * 2**30 // (4 * 528 * 4096)
    assert kv_cache_tokens(model, "auto", 1, 16, 40 * 2**30, 64) == (blocks - 1 - 64 * 9) * 528


def test_fp8_kv_raises_the_block_further() -> None:
    # Half the bytes per token: twice the tokens to hold the same Mamba page.
    model = _model("granite-4.0-h-small")
    assert hybrid_block_size(model, "fp8", 1, 16) == 16 * -(-2_147_840 // (16 * 2048))


def test_a_larger_user_block_is_the_alignment() -> None:
    model = _model("granite-4.0-h-small")
    assert hybrid_block_size(model, "auto", 1, 1024) == 1024
    assert hybrid_block_size(model, "auto", 1, 400) == 400 * 2  # 400 x 4,096 < the state


def test_tensor_parallel_shards_the_state() -> None:
    model = _model("granite-4.0-h-small")
    # 1 group is replicated on each of 2 ranks: conv width (8,192 + 2 x 2 x 128) / 2.
    assert state_shapes(model.mamba, 2) == ((3, 4352), (64, 64, 128))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="tensor_parallel"):
        mamba_state_bytes(model, 3)


def test_nemotron_keeps_its_ssm_state_in_float32() -> None:
    model = _model("nemotron-h-8b")
    conv, ssm = state_shapes(model.mamba, 1)  # type: ignore[arg-type]
    assert conv == (3, 8192 + 2 * 8 * 128) and ssm == (128, 64, 128)
    assert mamba_state_bytes(model, 1) == (3 * 10240) * 2 + 128 * 64 * 128 * 4
    cfg = dict(NEMOTRON_H_8B, mamba_ssm_cache_dtype="bfloat16")
    assert mamba_state_bytes(ModelArchitecture.from_hf_config(cfg, "n"), 1) == (
        3 * 10240 + 128 * 64 * 128) * 2


def test_jamba_qwen3_next_falcon_state_shapes() -> None:
    jamba = ModelArchitecture.from_hf_config(JAMBA_V01, "j")
    assert state_shapes(jamba.mamba, 1) == ((3, 8192), (8192, 16))  # type: ignore[arg-type]
    qwen = ModelArchitecture.from_hf_config(QWEN3_NEXT_80B, "q")
    assert state_shapes(qwen.mamba, 1) == (  # type: ignore[arg-type]
        (3, 2 * 16 * 128 + 32 * 128), (32, 128, 128))
    falcon = ModelArchitecture.from_hf_config(FALCON_H1_7B, "f")
    assert state_shapes(falcon.mamba, 1) == (  # type: ignore[arg-type]
        (3, 6144 + 2 * 256), (24, 256, 256))
    # Falcon-H1: both kinds in every layer, one group of 44 each.
    assert [(g.kind, g.layers_per_group, g.count) for g in kv_cache_groups(falcon)] == [
        ("full", 44, 1), ("mamba", 44, 1)]


def test_an_unknown_layer_type_is_refused() -> None:
    cfg = dict(GRANITE_4_H_SMALL, layer_types=["mamba"] * 39 + ["retention"])
    with pytest.raises(InvalidInput, match="not modelled") as info:
        ModelArchitecture.from_hf_config(cfg, "x")
    assert info.value.field == "config.json:layer_types[39]"


@pytest.mark.parametrize(("name", "weights"), [
    ("granite-4.0-h-small", "auto"), ("qwen3-next-80b-a3b", "fp8"), ("nemotron-h-8b", "auto")])
def test_the_planner_plans_a_hybrid_model_at_the_block_size_vllm_forces(
        name: str, weights: str) -> None:
    from kvtune.tuner.facts.gpus import get_gpu_class
    from kvtune.tuner.planner.planning import PlanRequest, plan_pool
    from kvtune.tuner.planner.presets import fixed_session_profile

    model = _model(name)
    pool = plan_pool(PlanRequest(model=model, gpu=get_gpu_class("H200"),
                                 weights_dtype=weights,  # type: ignore[arg-type]
                                 profile=fixed_session_profile(4096)))
    plan = pool.plan
    assert plan.block_size == hybrid_block_size(model, plan.kv_cache_dtype, 1, 16)
    assert plan.block_size > 16
    reason = next(r for r in pool.reasons if r.knob == "block-size")
    assert reason.code == "HybridMambaPage"
    # The pool's blocks are vLLM's: the budget over one block at the forced size.
    expected = pool.expected
    assert expected.num_gpu_blocks == num_gpu_blocks(
        model, plan.kv_cache_dtype, 1, plan.block_size, expected.kv_cache_bytes)
    assert kv_cache_tokens(model, plan.kv_cache_dtype, 1, plan.block_size,
                           expected.kv_cache_bytes, plan.max_num_seqs) > 0


def test_the_simulator_sets_the_mamba_states_aside() -> None:
    from kvtune.tuner.facts.gpus import get_gpu_class
    from kvtune.tuner.planner import planning
    from kvtune.tuner.planner.presets import fixed_session_profile
    from kvtune.tuner.simulator.engine import simulated_plan

    model = _model("granite-4.0-h-small")
    request = planning.PlanRequest(model=model, gpu=get_gpu_class("H200"),
                                   profile=fixed_session_profile(4096))
    plan = planning.plan_pool(request).plan
    _, _, available = planning.preflight(request, plan)
    sim = simulated_plan(request, plan, "granite")
    tokens = kv_cache_tokens(model, plan.kv_cache_dtype, 1, plan.block_size, available,
                             plan.max_num_seqs)
    assert sim.engine.num_gpu_blocks == tokens // plan.block_size + 1
    # Fewer than if the budget were all attention pages.
    assert sim.engine.num_gpu_blocks < available // block_bytes(
        model, plan.kv_cache_dtype, 1, plan.block_size) + 1
