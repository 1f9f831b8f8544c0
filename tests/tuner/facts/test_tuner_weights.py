"""Weight memory per GPU."""

from __future__ import annotations

import pytest

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.weights import weights_bytes_per_gpu

LLAMA_70B = get_model("meta-llama/Llama-3.3-70B-Instruct")


def test_bf16_is_two_bytes_per_parameter_split_across_tp() -> None:
    assert weights_bytes_per_gpu(LLAMA_70B, "bf16", 1) == 2 * LLAMA_70B.parameter_count
    assert weights_bytes_per_gpu(LLAMA_70B, "bf16", 4) == -(-2 * LLAMA_70B.parameter_count // 4)


def test_fp8_keeps_embeddings_16_bit() -> None:
    fp8 = weights_bytes_per_gpu(LLAMA_70B, "fp8", 1)
    embed = 2 * 128_256 * 8_192
    body = LLAMA_70B.parameter_count - embed
    assert fp8 > body + 2 * embed  # scales on top of one byte per weight
    assert fp8 < body * 1.01 + 2 * embed
    # The article's "~70 GB" for FP8 Llama 3.3 70B.
    assert 70e9 < fp8 < 74e9


def test_int4_with_group_scales() -> None:
    int4 = weights_bytes_per_gpu(LLAMA_70B, "awq", 1)
    assert 38e9 < int4 < 42e9


def test_checkpoint_quantization_is_auto() -> None:
    v3 = get_model("deepseek-ai/DeepSeek-V3")
    auto = weights_bytes_per_gpu(v3, "auto", 8)
    assert auto == weights_bytes_per_gpu(v3, "fp8", 8)
    # A pre-quantized checkpoint is not widened by asking for bf16.
    assert weights_bytes_per_gpu(v3, "bf16", 8) == auto
    assert 80e9 < auto < 90e9  # about 671 GB / 8


def test_bad_dtype() -> None:
    with pytest.raises(InvalidInput, match="weights_dtype"):
        weights_bytes_per_gpu(LLAMA_70B, "fp6", 1)
    with pytest.raises(InvalidInput, match="tensor_parallel"):
        weights_bytes_per_gpu(LLAMA_70B, "bf16", 0)
