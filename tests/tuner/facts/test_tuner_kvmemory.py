"""KV bytes per token, pages and per-request blocks, as vLLM lays them out."""

from __future__ import annotations

import pytest

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.kvmemory import (
    block_bytes,
    blocks_per_request,
    kv_bytes_per_token,
    kv_cache_groups,
    page_size_bytes,
    request_blocks,
    request_kv_bytes,
)

LLAMA_70B = get_model("meta-llama/Llama-3.3-70B-Instruct")


@pytest.mark.parametrize(
    ("dtype", "tp", "expected"),
    [
        ("auto", 1, 327_680),  # 80 layers x 8 heads x 128 x 2 (K,V) x 2 bytes
        ("bfloat16", 1, 327_680),
        ("fp8", 1, 163_840),
        ("fp8_e5m2", 1, 163_840),
        ("int8_per_token_head", 1, 80 * 8 * (256 + 8)),  # + two fp32 scales per head
        ("fp8_per_token_head", 1, 80 * 8 * (256 + 8)),
        ("int4_per_token_head", 1, 80 * 8 * (128 + 8)),
        ("nvfp4", 1, 80 * 2 * 8 * (64 + 8)),  # fp4 data + one fp8 scale per 16 values
        ("auto", 2, 163_840),
        ("auto", 8, 40_960),
        # TP beyond the KV heads replicates them: still one head per GPU.
        ("auto", 16, 40_960),
    ],
)
def test_llama_70b_bytes_per_token(dtype: str, tp: int, expected: int) -> None:
    assert kv_bytes_per_token(LLAMA_70B, dtype, tp) == expected


def test_mla_latent_is_replicated_across_tp() -> None:
    v3 = get_model("deepseek-ai/DeepSeek-V3")
    assert kv_bytes_per_token(v3, "auto", 1) == 61 * 576 * 2
    assert kv_bytes_per_token(v3, "auto", 8) == 61 * 576 * 2
    assert kv_bytes_per_token(v3, "fp8", 8) == 61 * 576
    assert kv_bytes_per_token(v3, "fp8_ds_mla", 8) == 61 * 656
    assert kv_bytes_per_token(v3, "int8_per_token_head", 1) == 61 * (576 + 8)
    with pytest.raises(InvalidInput, match="MLA"):
        kv_bytes_per_token(v3, "nvfp4", 1)
    with pytest.raises(InvalidInput, match="sparse MLA"):
        kv_bytes_per_token(LLAMA_70B, "fp8_ds_mla", 1)


def test_unmodeled_dtype_is_refused_with_the_alternatives() -> None:
    with pytest.raises(InvalidInput, match="int8_per_token_head"):
        kv_bytes_per_token(LLAMA_70B, "turboquant_k8v4", 1)


def test_page_size() -> None:
    assert page_size_bytes(LLAMA_70B, "auto", 1, 16) == 16 * 327_680
    with pytest.raises(InvalidInput, match="block_size"):
        page_size_bytes(LLAMA_70B, "auto", 1, 0)


def test_full_attention_blocks() -> None:
    (group,) = blocks_per_request(LLAMA_70B, 4097, 16, 8192, 32768)
    assert (group.kind, group.blocks) == ("full", 257)
    # Capped by max_model_len.
    (group,) = blocks_per_request(LLAMA_70B, 100_000, 16, 8192, 32768)
    assert group.blocks == 2048


def test_sliding_window_caps_blocks() -> None:
    gemma3 = get_model("google/gemma-3-27b-it")
    groups = {g.kind: g for g in blocks_per_request(gemma3, 100_000, 16, 2048, 131072)}
    assert groups["full"].blocks == 6250
    # cdiv(min(1024 - 1 + 2 * 2048, 131072), 16) + 1 = 320 + 1
    assert groups["sliding_window"].blocks == 321
    short = {g.kind: g for g in blocks_per_request(gemma3, 500, 16, 2048, 131072)}
    assert short["sliding_window"].blocks == short["full"].blocks == 32


def test_chunked_attention_caps_blocks() -> None:
    scout = get_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    groups = {g.kind: g for g in blocks_per_request(scout, 1_000_000, 16, 8192, 1_000_000)}
    # cdiv(min(8192 + 2 * 8192, 1e6), 16) = 1536
    assert groups["chunked"].blocks == 1536
    assert groups["full"].blocks == 62500


def test_request_bytes_hybrid_below_all_layers_full() -> None:
    gemma3 = get_model("google/gemma-3-27b-it")
    ctx = 32_768
    hybrid = request_kv_bytes(gemma3, "auto", 1, 16, ctx, 8192, 131072)
    # 16 KV heads x 128 x 2 x 2 bytes = 8,192 bytes per token per layer. vLLM groups the
    # 10 full layers as one group and the 52 sliding layers as 6 groups of 10 (8 padding
    # layers); a block is 10 layers x 16 tokens. The full group holds 2,048 blocks, each
    # sliding group cdiv(1023 + 2 x 8192, 16) + 1 = 1,089.
    assert hybrid == 10 * 16 * 8192 * (2048 + 6 * 1089)
    assert hybrid < ctx * kv_bytes_per_token(gemma3, "auto", 1) * 0.7
    llama = request_kv_bytes(LLAMA_70B, "auto", 1, 16, ctx, 8192, 131072)
    assert llama == ctx * 327_680


@pytest.mark.parametrize(
    ("model_id", "groups"),
    [
        ("meta-llama/Llama-3.3-70B-Instruct", [("full", 80, 1, 0)]),
        ("google/gemma-3-27b-it", [("full", 10, 1, 0), ("sliding_window", 10, 6, 8)]),
        ("google/gemma-2-27b-it", [("full", 23, 1, 0), ("sliding_window", 23, 1, 0)]),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", [("full", 12, 1, 0), ("chunked", 12, 3, 0)]),
    ],
)
def test_vllm_cache_groups(model_id: str, groups: list[tuple[str, int, int, int]]) -> None:
    model = get_model(model_id)
    got = [(g.kind, g.layers_per_group, g.count, g.padding_layers) for g in kv_cache_groups(model)]
    assert got == groups
    first = kv_cache_groups(model)[0]
    assert block_bytes(model, "auto", 1, 16) == first.layers_per_group * 16 * (
        kv_bytes_per_token(model, "auto", 1) // model.num_hidden_layers)
    if len(groups) == 1:
        assert block_bytes(model, "auto", 1, 16) == page_size_bytes(model, "auto", 1, 16)
        assert request_blocks(model, 1000, 16, 8192, 4096) == 63
