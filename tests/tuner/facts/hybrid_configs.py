"""Synthetic ``config.json`` files shaped like six published hybrid checkpoints. They were
written from memory of the published configs (this machine cannot download them): the
fields that size the cache (layers, heads, head dims, Mamba / linear-attention shapes, layer
pattern) are believed right; the rest (vocabulary, MLP widths) only has to parse."""

from __future__ import annotations

from typing import Any

# ibm-granite/granite-4.0-h-small: 40 layers, attention at 5, 15, 25, 35; Mamba-2.
GRANITE_4_H_SMALL: dict[str, Any] = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
    "num_hidden_layers": 40, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 1536, "num_local_experts": 72,
    "num_experts_per_tok": 10, "shared_intermediate_size": 1536, "vocab_size": 100352,
    "max_position_embeddings": 131072, "position_embedding_type": "nope",
    "layer_types": ["attention" if i % 10 == 5 else "mamba" for i in range(40)],
    "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 128, "mamba_d_head": 64,
    "mamba_d_state": 128, "mamba_d_conv": 4, "torch_dtype": "bfloat16",
}
# nvidia/Nemotron-H-8B-Base-8K: 52 layers of Mamba (M), MLP (-) and 4 attention (*).
NEMOTRON_H_8B: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "num_hidden_layers": 52, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 21504,
    "vocab_size": 131072, "max_position_embeddings": 8192,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128,
    "conv_kernel": 4, "expand": 2, "torch_dtype": "bfloat16",
}
# ai21labs/Jamba-v0.1: 32 layers, attention every 8th from 4; Mamba-1.
JAMBA_V01: dict[str, Any] = {
    "architectures": ["JambaForCausalLM"], "model_type": "jamba",
    "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "num_experts": 16,
    "num_experts_per_tok": 2, "expert_layer_period": 2, "expert_layer_offset": 1,
    "attn_layer_period": 8, "attn_layer_offset": 4, "vocab_size": 65536,
    "max_position_embeddings": 262144, "mamba_d_state": 16, "mamba_d_conv": 4,
    "mamba_expand": 2, "mamba_dt_rank": 256, "torch_dtype": "bfloat16",
}
# tiiuae/Falcon-H1-7B-Instruct: attention and Mamba-2 side by side in all 44 layers.
FALCON_H1_7B: dict[str, Any] = {
    "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1",
    "num_hidden_layers": 44, "hidden_size": 3072, "num_attention_heads": 12,
    "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 12288,
    "vocab_size": 130049, "max_position_embeddings": 262144, "mamba_d_ssm": 6144,
    "mamba_n_heads": 24, "mamba_d_head": 256, "mamba_n_groups": 1, "mamba_d_state": 256,
    "mamba_d_conv": 4, "mamba_expand": 2, "torch_dtype": "bfloat16",
}
# Qwen/Qwen3-Next-80B-A3B-Instruct: 48 layers, full attention every 4th, gated delta net.
QWEN3_NEXT_80B: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120,
    "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1,
    "vocab_size": 151936, "max_position_embeddings": 262144, "full_attention_interval": 4,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "torch_dtype": "bfloat16",
}
# google/gemma-3-12b-it: 48 layers, 5 sliding (window 1,024) then 1 global.
GEMMA_3_12B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text", "num_hidden_layers": 48, "hidden_size": 3840,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
        "intermediate_size": 15360, "sliding_window": 1024, "sliding_window_pattern": 6,
        "vocab_size": 262208, "max_position_embeddings": 131072,
    },
    "torch_dtype": "bfloat16",
}
HYBRID_CONFIGS: dict[str, dict[str, Any]] = {
    "granite-4.0-h-small": GRANITE_4_H_SMALL, "nemotron-h-8b": NEMOTRON_H_8B,
    "jamba-v0.1": JAMBA_V01, "falcon-h1-7b": FALCON_H1_7B,
    "qwen3-next-80b-a3b": QWEN3_NEXT_80B, "gemma-3-12b": GEMMA_3_12B,
}
