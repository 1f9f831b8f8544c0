"""What each weights dtype needs from vLLM 0.33 (issue 14 items 1, 3, 4): the flags the plan
renders, the refusals where vLLM cannot load a checkpoint that way, and model facts that
used to come out silently wrong (MoE layouts, KV heads under TP, float32, quantization
configs, vision towers, malformed config.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.tuner.errors import InvalidInput, NoFeasiblePlan
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.facts.weights import weights_bytes_per_gpu, weights_load
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.presets import fixed_session_profile

LLAMA_70B = get_model("meta-llama/Llama-3.3-70B-Instruct")
H200 = get_gpu_class("H200")

# mistralai/Mixtral-8x7B-Instruct-v0.1's config.json (the fields kvtune reads).
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "rope_theta": 1e6, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
}
# microsoft/phi-4: 40 query heads, 10 KV heads.
PHI_4: dict[str, Any] = {
    "model_type": "phi3", "hidden_size": 5120, "intermediate_size": 17920,
    "max_position_embeddings": 16384, "num_attention_heads": 40, "num_hidden_layers": 40,
    "num_key_value_heads": 10, "vocab_size": 100352, "torch_dtype": "bfloat16",
}


def _plan(model: ModelArchitecture, weights: str, gpu: str = "H200", tp: int = 1) -> list[str]:
    pool = plan_pool(PlanRequest(model=model, gpu=get_gpu_class(gpu), tensor_parallel=tp,
                                 weights_dtype=weights, profile=fixed_session_profile(4096)))
    return pool.plan.vllm_args()


def test_fp8_on_a_16_bit_checkpoint_renders_load_time_quantization() -> None:
    # docs/planner.md's example: without the flag vLLM would load 16-bit weights (141 GB).
    args = _plan(LLAMA_70B, "fp8")
    assert "--quantization=fp8_per_tensor" in args
    assert not any(a.startswith("--dtype") for a in args)
    # The 16-bit plan needs no flag; an FP8 checkpoint is detected by vLLM itself. (At TP 2:
    # on one H200 the 131.42 GiB of 16-bit weights leave 0.40 GiB beside vLLM 0.33's 3.80 GiB
    # of activations, buffers and CUDA graphs, short of one 4K request's 1.25 GiB.)
    assert not any(a.startswith("--quantization") for a in _plan(LLAMA_70B, "auto", tp=2))
    v3 = get_model("deepseek-ai/DeepSeek-V3")
    assert weights_load(v3, "fp8").quantization_flag is None
    assert weights_load(v3, "auto").method == "fp8"


@pytest.mark.parametrize(("weights", "complaint"), [
    ("awq", "need a checkpoint quantized that way"),
    ("gptq", "need a checkpoint quantized that way"),
    ("int4", "need a checkpoint quantized that way"),
    ("int8", "only the experts of MoE models"),
])
def test_what_vllm_cannot_quantize_at_load_time_is_refused(weights: str, complaint: str) -> None:
    with pytest.raises(InvalidInput, match=complaint) as err:
        _plan(LLAMA_70B, weights)
    assert err.value.field == "weights_dtype"


def test_int8_on_a_moe_model_quantizes_only_the_experts() -> None:
    mixtral = ModelArchitecture.from_hf_config(MIXTRAL_8X7B, "mistralai/Mixtral-8x7B")
    load = weights_load(mixtral, "int8")
    assert load.quantization_flag == "int8_per_channel_weight_only" and load.experts_only
    bf16 = weights_bytes_per_gpu(mixtral, "auto", 1)
    int8 = weights_bytes_per_gpu(mixtral, "int8", 1)
    experts = mixtral.expert_parameter_count
    assert int8 == pytest.approx(bf16 - experts * (1 - 0.001), rel=1e-6)


def test_a_quantized_checkpoint_is_not_widened_and_float16_is_refused_for_gemma() -> None:
    with pytest.raises(InvalidInput, match="neither widen nor requantize"):
        weights_load(get_model("deepseek-ai/DeepSeek-V3"), "bf16")
    with pytest.raises(InvalidInput, match="refuses float16 for gemma3"):
        weights_load(get_model("google/gemma-3-27b-it"), "float16")
    # bfloat16 on a bfloat16 checkpoint needs no --dtype; float16 on Llama does.
    assert weights_load(LLAMA_70B, "bf16").dtype_flag is None
    assert weights_load(LLAMA_70B, "fp16").dtype_flag == "float16"
    assert "--dtype=float16" in _plan(LLAMA_70B, "fp16", gpu="B200")


def test_mixtral_is_sized_with_all_its_experts() -> None:
    mixtral = ModelArchitecture.from_hf_config(MIXTRAL_8X7B, "mistralai/Mixtral-8x7B")
    assert mixtral.moe is not None and mixtral.moe.num_experts == 8
    # 46.7B parameters (model card), 12.9B active per token.
    assert mixtral.parameter_count == pytest.approx(46.7e9, rel=0.01)
    assert mixtral.active_parameter_count == pytest.approx(12.9e9, rel=0.02)
    # ~87 GiB at bf16: it does not fit one H100.
    with pytest.raises(NoFeasiblePlan):
        _plan(mixtral, "auto", gpu="H100")


def test_qwen_moe_layouts() -> None:
    # Qwen2-MoE (Qwen1.5-MoE-A2.7B): 60 experts of 1408, one shared expert of 5632.
    qwen2 = ModelArchitecture.from_hf_config({
        "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
        "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 16, "max_position_embeddings": 8192, "vocab_size": 151936,
    }, "Qwen/Qwen1.5-MoE-A2.7B")
    assert qwen2.moe is not None and qwen2.moe.shared_expert_intermediate_size == 5632
    assert qwen2.parameter_count == pytest.approx(14.3e9, rel=0.03)  # model card: 14.3B
    # MoE where (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers (vLLM).
    sparse = ModelArchitecture.from_hf_config({
        "model_type": "qwen3_moe", "hidden_size": 1024, "intermediate_size": 3072,
        "moe_intermediate_size": 512, "num_experts": 16, "num_experts_per_tok": 2,
        "decoder_sparse_step": 2, "mlp_only_layers": [1], "num_hidden_layers": 8,
        "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 4096,
        "vocab_size": 1000, "head_dim": 128,
    }, "test/sparse")
    assert sparse.moe is not None and sparse.moe.num_dense_layers == 5  # layers 0, 1, 2, 4, 6


def test_kv_heads_that_do_not_divide_tp_are_refused_as_vllm_refuses_them() -> None:
    phi4 = ModelArchitecture.from_hf_config(PHI_4, "microsoft/phi-4",
                                            parameter_count=14_659_507_200)
    assert _plan(phi4, "auto", gpu="H100", tp=2)
    for tp in (4, 8):  # 40 query heads divide; 10 KV heads neither divide nor replicate evenly
        with pytest.raises(InvalidInput, match="10 KV heads") as err:
            _plan(phi4, "auto", gpu="H100", tp=tp)
        assert err.value.field == "tensor_parallel"
    # Fewer KV heads than ranks: replicated a whole number of times (Llama: 8 heads at TP 8).
    assert _plan(LLAMA_70B, "auto", gpu="H100", tp=8)


@pytest.mark.parametrize("heads", [0, -1, "8", 2.5])
def test_bad_kv_heads_are_refused(heads: object) -> None:
    with pytest.raises(InvalidInput, match="num_key_value_heads"):
        ModelArchitecture.from_hf_config({**PHI_4, "num_key_value_heads": heads}, "x")
    assert ModelArchitecture.from_hf_config(
        {**PHI_4, "num_key_value_heads": None}, "x").num_kv_heads == 40


def test_unknown_layer_types_are_refused() -> None:
    config = {**PHI_4, "num_hidden_layers": 2,
              "layer_types": ["full_attention", "linear_attention"]}
    # linear_attention is sized for the hybrid families kvtune models (Qwen3-Next); on
    # another model_type its state is refused, not guessed.
    with pytest.raises(InvalidInput, match="not modelled") as info:
        ModelArchitecture.from_hf_config(config, "x")
    assert info.value.field == "config.json:model_type"
    config = {**config, "layer_types": ["full_attention", "retention"]}
    with pytest.raises(InvalidInput, match=r"layer_types\[1\]"):
        ModelArchitecture.from_hf_config(config, "x")


def test_float32_checkpoints_are_served_at_16_bits() -> None:
    fp32 = ModelArchitecture.from_hf_config({**PHI_4, "torch_dtype": "float32"}, "x",
                                            parameter_count=14_659_507_200)
    bf16 = ModelArchitecture.from_hf_config(PHI_4, "x", parameter_count=14_659_507_200)
    assert fp32.served_dtype == "bfloat16"
    assert weights_bytes_per_gpu(fp32, "auto", 1) == weights_bytes_per_gpu(bf16, "auto", 1)
    load = weights_load(fp32, "auto")
    assert kv_bytes_per_token(fp32, "auto", 1, model_dtype=load.served_dtype) == (
        kv_bytes_per_token(bf16, "auto", 1))


def test_checkpoint_quantization_is_honoured_or_refused() -> None:
    awq = ModelArchitecture.from_hf_config({**PHI_4, "torch_dtype": "float16",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                "version": "gemm", "zero_point": True}},
        "x", parameter_count=14_659_507_200)
    assert weights_load(awq, "auto").bits == 4
    assert weights_bytes_per_gpu(awq, "auto", 1) < 0.35 * 2 * 14_659_507_200
    bnb = ModelArchitecture.from_hf_config({**PHI_4, "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True}}, "x")
    assert bnb.quantization is not None and bnb.quantization.weight_bits == 4
    with pytest.raises(InvalidInput, match="cannot load"):
        weights_load(bnb, "auto")
    with pytest.raises(InvalidInput, match="how many bits"):
        ModelArchitecture.from_hf_config(
            {**PHI_4, "quantization_config": {"quant_method": "mystery"}}, "x")


def test_gpt_oss_mxfp4_experts_and_16_bit_attention() -> None:
    gpt_oss = get_model("openai/gpt-oss-120b")
    assert gpt_oss.quantization is not None and gpt_oss.quantization.experts_only
    # The checkpoint is about 65 GB: MXFP4 experts, bf16 attention/router/embeddings.
    assert 60e9 < weights_bytes_per_gpu(gpt_oss, "auto", 1) < 68e9


def test_vision_towers_are_counted() -> None:
    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "sliding_window": 1024}
    vision = {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
              "model_type": "siglip_vision_model", "num_attention_heads": 16,
              "num_hidden_layers": 27, "patch_size": 14}
    with_tower = ModelArchitecture.from_hf_config(
        {"model_type": "gemma3", "text_config": text, "vision_config": vision,
         "torch_dtype": "bfloat16"}, "google/gemma-3-4b-it")
    alone = ModelArchitecture.from_hf_config(
        {"model_type": "gemma3", "text_config": text, "torch_dtype": "bfloat16"}, "x")
    # SigLIP-400M and its projector.
    assert 0.38e9 < with_tower.parameter_count - alone.parameter_count < 0.45e9
    # Gemma 3 4B: 4.3B parameters in all (model card).
    assert with_tower.parameter_count == pytest.approx(4.3e9, rel=0.03)


def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps([{"model_type": "llama"}]))
    result = CliRunner().invoke(cli, ["plan", "--model", str(path), "--gpu", "H100"])
    assert result.exit_code == 1
    assert ("Traceback" not in result.output and result.exception is None) or isinstance(
        result.exception, SystemExit)
    assert "not an object" in result.output and len(result.output.strip().splitlines()) == 1
