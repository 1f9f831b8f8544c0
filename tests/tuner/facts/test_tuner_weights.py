"""Weight memory per GPU."""

from __future__ import annotations

from typing import Any

import pytest

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.facts.weights import rope_cache_bytes, weights_bytes_per_gpu
from kvtune.tuner.planner.budget import non_kv_bytes

LLAMA_70B = get_model("meta-llama/Llama-3.3-70B-Instruct")
# An AWQ checkpoint of Llama 3.x 70B: the language model's shapes plus AutoAWQ's
# quantization_config (bits 4, group 128, GEMM kernels).
AWQ_70B: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_hidden_layers": 80,
    "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "float16",
    "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "awq",
                            "version": "gemm", "zero_point": True},
}


def get_model_from(config: dict[str, Any]) -> ModelArchitecture:
    return ModelArchitecture.from_hf_config(config, "test/awq-70b",
                                            parameter_count=LLAMA_70B.parameter_count)


def test_bf16_is_two_bytes_per_parameter_split_across_tp() -> None:
    assert weights_bytes_per_gpu(LLAMA_70B, "bf16", 1) == 2 * LLAMA_70B.parameter_count
    assert weights_bytes_per_gpu(LLAMA_70B, "bf16", 4) == -(-2 * LLAMA_70B.parameter_count // 4)
    # Every GPU also holds the whole rotary table (vLLM counts it in "Model loading took").
    assert rope_cache_bytes(LLAMA_70B) == 131_072 * 128 * 2


def test_llama_4_scout_weights_match_vllms_logged_load_at_tp4() -> None:
    # vLLM 0.19 on H100, TP 4 (llm-d-planner accuracy campaign, in vllm_startup_logs.json):
    # "Model loading took 53.12 GiB memory". Parameters alone are 50.59 GiB per GPU; the rest
    # is the rotary cos/sin table of its 10,485,760 positions (2.5 GiB, on every GPU), which
    # the memory budget adds to the weights.
    scout = get_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert rope_cache_bytes(scout) == 10_485_760 * 128 * 2
    parts = non_kv_bytes(scout, weights_bytes_per_gpu(scout, "auto", 4), 4, 8192, 1024,
                         vllm_version="0.19.0")
    assert abs(parts.weights_bytes / 2**30 - 53.12) < 0.05


def test_fp8_keeps_embeddings_16_bit() -> None:
    fp8 = weights_bytes_per_gpu(LLAMA_70B, "fp8", 1)
    embed = 2 * 128_256 * 8_192
    body = LLAMA_70B.parameter_count - embed
    assert fp8 > body + 2 * embed  # scales on top of one byte per weight
    assert fp8 < body * 1.01 + 2 * embed
    # The article's "~70 GB" for FP8 Llama 3.3 70B.
    assert 70e9 < fp8 < 74e9


def test_int4_with_group_scales_needs_an_int4_checkpoint() -> None:
    # Llama 3.3 70B is a bf16 checkpoint: vLLM 0.33 has no load-time int4.
    with pytest.raises(InvalidInput, match="need a checkpoint quantized that way"):
        weights_bytes_per_gpu(LLAMA_70B, "awq", 1)
    awq = get_model_from(AWQ_70B)
    int4 = weights_bytes_per_gpu(awq, "awq", 1)
    assert int4 == weights_bytes_per_gpu(awq, "auto", 1)
    assert 38e9 < int4 < 42e9


def test_checkpoint_quantization_is_auto() -> None:
    v3 = get_model("deepseek-ai/DeepSeek-V3")
    auto = weights_bytes_per_gpu(v3, "auto", 8)
    assert auto == weights_bytes_per_gpu(v3, "fp8", 8)
    # A pre-quantized checkpoint cannot be widened: asking for bf16 is refused, not planned.
    with pytest.raises(InvalidInput, match="can neither widen nor requantize"):
        weights_bytes_per_gpu(v3, "bf16", 8)
    assert 80e9 < auto < 90e9  # about 671 GB / 8
    # MLA's rotary table covers only the rope part of each head: 163,840 x 64 x 2 B.
    assert rope_cache_bytes(v3) == 163_840 * 64 * 2


def test_bad_dtype() -> None:
    with pytest.raises(InvalidInput, match="weights_dtype"):
        weights_bytes_per_gpu(LLAMA_70B, "fp6", 1)
    with pytest.raises(InvalidInput, match="tensor_parallel"):
        weights_bytes_per_gpu(LLAMA_70B, "bf16", 0)
