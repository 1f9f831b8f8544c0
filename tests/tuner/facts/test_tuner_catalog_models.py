"""The models platform teams run in 2026 (issue 14 item 5): their real config.json facts in
the catalog, each with the KV bytes per token worked out by hand from the config and the
weight bytes vLLM loads (checkpoint sizes from the model pages)."""

from __future__ import annotations

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token
from kvtune.tuner.facts.weights import weights_bytes_per_gpu

# (model, KV bytes per token at bf16 on one GPU = layers x 2 (K, V) x KV heads x head dim x 2 B
#  (MLA: layers x 576 x 2 B), weights bytes at the checkpoint's own dtype: (low, high)).
CASES = [
    ("meta-llama/Llama-3.1-405B-Instruct", 126 * 2 * 8 * 128 * 2, (811e9, 812e9)),
    # FP8 MLPs in layers 1-124, bf16 attention, first/last MLPs and embeddings: ~487 GB.
    ("meta-llama/Llama-3.1-405B-Instruct-FP8", 126 * 2 * 8 * 128 * 2, (480e9, 495e9)),
    # MXFP4 experts, bf16 attention: the checkpoints are ~65 GB and ~13.8 GB.
    ("openai/gpt-oss-120b", 36 * 2 * 8 * 64 * 2, (60e9, 68e9)),
    ("openai/gpt-oss-20b", 24 * 2 * 8 * 64 * 2, (12.5e9, 15e9)),
    # All experts resident: 46.7B and 140.6B parameters at bf16.
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 32 * 2 * 8 * 128 * 2, (93e9, 94e9)),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", 56 * 2 * 8 * 128 * 2, (280e9, 283e9)),
    ("Qwen/Qwen3-30B-A3B", 48 * 2 * 4 * 128 * 2, (60e9, 62e9)),
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct", 62 * 2 * 8 * 128 * 2, (955e9, 965e9)),
    # MLA latent 512 + 64, FP8 block-quantized weights: ~1.03 TB.
    ("moonshotai/Kimi-K2-Instruct", 61 * 576 * 2, (1.0e12, 1.06e12)),
    ("zai-org/GLM-4.5", 92 * 2 * 8 * 128 * 2, (700e9, 715e9)),
    ("microsoft/phi-4", 40 * 2 * 10 * 128 * 2, (29e9, 30e9)),
    ("google/gemma-3-4b-it", 34 * 2 * 4 * 256 * 2, (8.4e9, 8.8e9)),
    ("google/gemma-3-12b-it", 48 * 2 * 8 * 256 * 2, (24e9, 24.8e9)),
    ("mistralai/Mistral-Large-Instruct-2411", 88 * 2 * 8 * 128 * 2, (244e9, 247e9)),
]


@pytest.mark.parametrize(("model_id", "kv_bytes", "weights"), CASES, ids=[c[0] for c in CASES])
def test_kv_bytes_and_weights(model_id: str, kv_bytes: int, weights: tuple[float, float]) -> None:
    model = get_model(model_id)
    assert model.source == f"https://huggingface.co/{model_id}/blob/main/config.json"
    assert kv_bytes_per_token(model, "auto", 1) == kv_bytes
    low, high = weights
    assert low < weights_bytes_per_gpu(model, "auto", 1) < high


def test_attention_layouts() -> None:
    groups = {(g.kind, g.num_layers, g.window_tokens)
              for g in get_model("openai/gpt-oss-120b").layer_groups}
    assert groups == {("sliding_window", 18, 128), ("full", 18, None)}
    gemma = {(g.kind, g.num_layers, g.window_tokens)
             for g in get_model("google/gemma-3-12b-it").layer_groups}
    assert gemma == {("sliding_window", 40, 1024), ("full", 8, None)}
    kimi = get_model("moonshotai/Kimi-K2-Instruct")
    assert kimi.is_mla and kimi.moe is not None and kimi.moe.num_experts == 384
    glm = get_model("zai-org/GLM-4.5")
    assert glm.moe is not None and glm.moe.num_dense_layers == 3 and glm.moe.num_shared_experts == 1
    # Per-GPU KV: 8 KV heads split at TP 8, replicated (one each) at TP 16 in vLLM.
    assert kv_bytes_per_token(get_model("meta-llama/Llama-3.1-405B-Instruct"), "auto", 8) == (
        126 * 2 * 1 * 128 * 2)


@pytest.mark.parametrize(("gpu", "backend"), [
    ("A100-80GB", "TRITON_ATTN"), ("L4", "TRITON_ATTN"), ("H100", "FLASH_ATTN"),
    ("B200", "FLASHINFER")])
def test_gpt_oss_attention_sinks_pick_a_backend_that_serves_them(gpu: str, backend: str) -> None:
    # vLLM's supports_sink(): FlashAttention only as FA3/FA4 (SM 9.x/10.x), FlashInfer only
    # through its TRT-LLM kernels (SM 10.x), Triton always. On Ampere/Ada gpt-oss runs on
    # Triton, whose dtypes and block sizes the plan must then respect.
    from kvtune.tuner.facts.gpus import get_gpu_class
    from kvtune.tuner.planner.planning import PlanRequest, plan_pool
    from kvtune.tuner.planner.presets import preset_profile

    model = get_model("openai/gpt-oss-20b")
    assert model.attention_sinks
    assert not get_model("meta-llama/Llama-3.1-8B-Instruct").attention_sinks
    pool = plan_pool(PlanRequest(model=model, gpu=get_gpu_class(gpu),
                                 profile=preset_profile("chat")))
    (reason,) = [r for r in pool.reasons if r.knob == "attention-backend"]
    assert reason.choice == f"auto ({backend})"
