"""Parsing a Hugging Face ``config.json`` into ``models.ModelArchitecture``: the text model's
facts (multimodal checkpoints nest them), the attention layout as layer groups, MLA,
mixture-of-experts and Mamba facts, the checkpoint's quantization (``hf_quantization``), and
a parameter count estimated from the shapes where the caller knows none."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.hf_quantization import quantization_facts
from kvtune.tuner.facts.mamba import layer_kinds, mamba_facts
from kvtune.tuner.facts.models import (
    AttentionKind,
    LayerGroup,
    MLAFacts,
    ModelArchitecture,
    ModelDType,
    MoEFacts,
)

# Defaults of transformers' config classes for the fields kvtune reads, where real
# checkpoints leave them out of config.json (transformers fills them in, and vLLM loads the
# model through that class). Gemma 3's 4B config.json, for one, names only hidden_size,
# intermediate_size, num_hidden_layers and sliding_window in its text_config.
# Source: transformers/models/gemma3/configuration_gemma3.py (Gemma3TextConfig.__init__).
_CONFIG_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "max_position_embeddings": 131_072, "sliding_window": 4096,
        "sliding_window_pattern": 6, "tie_word_embeddings": True,
    },
}


def _merged_text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal checkpoints keep the language model's facts under ``text_config``; the
    top level still carries ``quantization_config``, ``torch_dtype`` and sometimes
    ``tie_word_embeddings``."""
    merged = dict(config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        merged.update(text)
        for key in ("quantization_config", "tie_word_embeddings", "torch_dtype"):
            if key in config and key not in text:
                merged[key] = config[key]
    for key, value in _CONFIG_CLASS_DEFAULTS.get(str(merged.get("model_type")), {}).items():
        merged.setdefault(key, value)
    return merged


def _vision_parameter_count(config: Mapping[str, Any], text_hidden: int) -> int:
    """Parameters of a ViT-style vision tower (SigLIP in Gemma 3, Llama 4's, Qwen-VL's) and
    its projector into the language model, from ``vision_config``: per layer the attention
    projections (4 h^2) and the MLP (2 h x intermediate), the patch and position embeddings,
    and one h x text-hidden projection. An estimate (within a few percent of SigLIP-400M)."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    hidden = _optional_int(vision, "hidden_size") or _optional_int(vision, "embed_dim")
    layers = _optional_int(vision, "num_hidden_layers") or _optional_int(vision, "depth")
    if hidden is None or layers is None:
        raise InvalidInput(
            "config.json:vision_config", sorted(vision)[:6],
            "a vision tower without hidden_size/num_hidden_layers; kvtune cannot count "
            "its weights: pass the model's own config.json",
        )
    inter = _optional_int(vision, "intermediate_size") or 4 * hidden
    patch = _optional_int(vision, "patch_size") or 14
    channels = _optional_int(vision, "num_channels") or 3
    image = _optional_int(vision, "image_size")
    positions = (image // patch) ** 2 if image else 0
    per_layer = 4 * hidden * hidden + 2 * hidden * inter + 4 * hidden
    return (layers * per_layer + channels * patch * patch * hidden + positions * hidden
            + hidden * text_hidden)


def _required_int(cfg: Mapping[str, Any], key: str, hf_id: str) -> int:
    value = cfg.get(key)
    if value is None:
        raise InvalidInput(
            f"config.json:{key}", None,
            f"{hf_id}: the field is missing; kvtune needs it to size the KV cache. "
            "Pass the model's own config.json (from its Hugging Face repository).",
        )
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(
            f"config.json:{key}", value, f"{hf_id}: expected a positive integer"
        )
    return value


def _optional_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _layer_groups(
    cfg: Mapping[str, Any], num_layers: int, model_type: str, is_mla: bool
) -> tuple[LayerGroup, ...]:
    if is_mla:
        return (LayerGroup(kind="mla", num_layers=num_layers),)
    window = _optional_int(cfg, "sliding_window")
    chunk = _optional_int(cfg, "attention_chunk_size")
    layer_types = cfg.get("layer_types")
    kinds: list[AttentionKind]
    hybrid = layer_kinds(cfg, num_layers, model_type)
    if hybrid is not None:
        # Mamba / linear-attention layers keep one state per sequence (kvtune.facts.mamba);
        # Falcon-H1 has attention and Mamba in every layer.
        found_kinds, parallel = hybrid
        mamba_layers = num_layers if parallel else found_kinds.count("mamba")
        attention = [k for k in found_kinds if k not in ("mamba", "none")]
        return (*_groups_from_kinds(attention, window, chunk),
                LayerGroup(kind="mamba", num_layers=mamba_layers))
    if isinstance(layer_types, list) and len(layer_types) == num_layers:
        # Newer transformers configs spell every layer out.
        mapping: dict[str, AttentionKind] = {
            "full_attention": "full",
            "sliding_attention": "sliding_window",
            "chunked_attention": "chunked",
        }
        kinds = []
        for index, layer_type in enumerate(layer_types):
            found = mapping.get(str(layer_type))
            if found is None:
                # Counting an unknown layer as full attention would size its cache wrongly
                # (a linear-attention or Mamba layer keeps a fixed state, not per-token KV).
                raise InvalidInput(
                    f"config.json:layer_types[{index}]", layer_type,
                    f"kvtune sizes {', '.join(sorted(mapping))} layers; this layer type's "
                    "cache is not modelled: plan a pure-attention model or pin "
                    "kv_cache_memory_bytes",
                )
            kinds.append(found)
    elif model_type.startswith("llama4") and chunk is not None:
        # Llama 4: layers that use RoPE attend within chunks; every 4th layer (NoPE) is
        # global. ``no_rope_layers[i] == 1`` means layer i uses RoPE (transformers'
        # Llama4TextConfig); an empty list is derived from the interval.
        flags = cfg.get("no_rope_layers")
        if not isinstance(flags, list) or len(flags) != num_layers:
            interval = _optional_int(cfg, "no_rope_layer_interval") or 4
            flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
        kinds = ["chunked" if f else "full" for f in flags]
    elif model_type.startswith("gemma2") and window is not None:
        # Gemma 2 alternates: even layers slide, odd layers are global.
        kinds = ["sliding_window" if i % 2 == 0 else "full" for i in range(num_layers)]
    elif model_type.startswith("gemma3") and window is not None:
        # Gemma 3: 5 local layers then 1 global (``sliding_window_pattern``: 6).
        pattern = _optional_int(cfg, "sliding_window_pattern") or 6
        kinds = [
            "full" if (i + 1) % pattern == 0 else "sliding_window" for i in range(num_layers)
        ]
    elif window is not None and cfg.get("use_sliding_window", True) is not False:
        # Mistral-7B-v0.1 style: every layer windowed. Qwen2 configs carry a window but
        # set use_sliding_window: false, and vLLM then ignores it.
        kinds = ["sliding_window"] * num_layers
    else:
        kinds = ["full"] * num_layers
    return _groups_from_kinds(kinds, window, chunk)


def _groups_from_kinds(kinds: list[AttentionKind] | list[str], window: int | None,
                       chunk: int | None) -> tuple[LayerGroup, ...]:
    groups: list[LayerGroup] = []
    for kind in ("full", "sliding_window", "chunked"):
        count = kinds.count(kind)
        if count == 0:
            continue
        win = window if kind == "sliding_window" else chunk if kind == "chunked" else None
        if kind != "full" and win is None:
            raise InvalidInput(
                "config.json:sliding_window" if kind == "sliding_window"
                else "config.json:attention_chunk_size",
                None, f"layer_types names {kind} layers but the window size is missing",
            )
        groups.append(LayerGroup(kind=kind, num_layers=count, window_tokens=win))
    return tuple(groups)

def _moe(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> MoEFacts | None:
    """Mixture-of-experts facts in every layout of the catalog's families:

    - DeepSeek V2/V3, Kimi K2, GLM-4.5 (glm4_moe): ``n_routed_experts``,
      ``moe_intermediate_size``, ``n_shared_experts`` of the same width, dense MLPs in the
      first ``first_k_dense_replace`` layers;
    - Qwen2-MoE / Qwen3-MoE: ``num_experts``, ``moe_intermediate_size``, Qwen2's one shared
      expert of ``shared_expert_intermediate_size``, dense layers in ``mlp_only_layers`` and
      where ``(i + 1) % decoder_sparse_step != 0``;
    - Mixtral and gpt-oss: ``num_local_experts`` experts of ``intermediate_size`` in every
      layer (gpt-oss also spells ``experts_per_token``);
    - Llama 4: ``num_local_experts`` of ``intermediate_size`` every
      ``interleave_moe_layer_step`` layers, one shared expert, dense layers of
      ``intermediate_size_mlp``.
    """
    experts = (
        _optional_int(cfg, "n_routed_experts")
        or _optional_int(cfg, "num_experts")
        or _optional_int(cfg, "num_local_experts")
    )
    if experts is None or experts <= 1:
        return None
    per_token = (_optional_int(cfg, "num_experts_per_tok")
                 or _optional_int(cfg, "experts_per_token") or 1)
    expert_inter = _optional_int(cfg, "moe_intermediate_size")
    dense_inter: int | None = _optional_int(cfg, "intermediate_size")
    shared = _optional_int(cfg, "n_shared_experts") or 0
    shared_inter: int | None = None
    dense_layers = _optional_int(cfg, "first_k_dense_replace") or 0
    if model_type.startswith("llama4"):
        # Llama 4: experts use intermediate_size; dense layers and the shared expert use
        # intermediate_size_mlp; MoE every ``interleave_moe_layer_step`` layers.
        expert_inter = _optional_int(cfg, "intermediate_size")
        step = _optional_int(cfg, "interleave_moe_layer_step") or 1
        dense_layers = num_layers - num_layers // step
        shared = 1
        dense_inter = _optional_int(cfg, "intermediate_size_mlp") or expert_inter
    elif model_type.startswith(("qwen2_moe", "qwen3_moe")):
        step = _optional_int(cfg, "decoder_sparse_step") or 1
        mlp_only = cfg.get("mlp_only_layers")
        only = {i for i in mlp_only if isinstance(i, int)} if isinstance(mlp_only, list) else set()
        dense_layers = sum(
            1 for i in range(num_layers) if i in only or (i + 1) % step != 0)
        shared_inter = _optional_int(cfg, "shared_expert_intermediate_size")
        shared = 1 if shared_inter else 0
    elif expert_inter is None and (cfg.get("num_local_experts") is not None
                                   or model_type == "jamba"):
        # Mixtral, gpt-oss: every expert is a full-width MLP of intermediate_size.
        expert_inter = _optional_int(cfg, "intermediate_size")
    if expert_inter is None:
        raise InvalidInput(
            "config.json:moe_intermediate_size", None,
            f"a mixture-of-experts config ({experts} experts) without the experts' width; "
            "add moe_intermediate_size",
        )
    return MoEFacts(
        num_experts=experts,
        experts_per_token=per_token,
        expert_intermediate_size=expert_inter,
        num_shared_experts=shared,
        shared_expert_intermediate_size=shared_inter,
        num_dense_layers=dense_layers,
        dense_intermediate_size=dense_inter,
    )


def estimate_parameter_count(
    *,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    vocab_size: int,
    tie_word_embeddings: bool,
    mla: MLAFacts | None,
    moe: MoEFacts | None,
) -> int:
    """Parameters from the shapes: embeddings, attention projections, gated MLPs (3 matrices
    each: gate, up, down) or experts, norms. Biases are ignored (< 0.1%)."""
    embed = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    if mla is not None:
        q_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank:
            q = hidden_size * mla.q_lora_rank + mla.q_lora_rank * num_heads * q_head
        else:
            q = hidden_size * num_heads * q_head
        kv = hidden_size * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank * (
            num_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        )
        attn = q + kv + num_heads * mla.v_head_dim * hidden_size
    else:
        attn = hidden_size * head_dim * (2 * num_heads + 2 * num_kv_heads)
    norms = 2 * hidden_size
    if moe is None:
        mlp_total = num_layers * 3 * hidden_size * intermediate_size
    else:
        moe_layers = num_layers - moe.num_dense_layers
        dense_inter = moe.dense_intermediate_size or intermediate_size
        expert = 3 * hidden_size * moe.expert_intermediate_size
        # Shared experts have the routed experts' width (DeepSeek's moe_intermediate_size,
        # Llama 4's intermediate_size) unless the config gives their own (Qwen2-MoE); only
        # dense layers use the wider MLP.
        shared_inter = moe.shared_expert_intermediate_size or moe.expert_intermediate_size
        per_moe_layer = (
            moe.num_experts * expert
            + moe.num_shared_experts * 3 * hidden_size * shared_inter
            + hidden_size * moe.num_experts  # router
        )
        mlp_total = moe_layers * per_moe_layer + moe.num_dense_layers * (
            3 * hidden_size * dense_inter
        )
    return embed + num_layers * (attn + norms) + mlp_total + hidden_size

def parse_hf_config(
    config: Mapping[str, Any], hf_id: str, parameter_count: int | None, source: str,
    quantization_file: tuple[str, Mapping[str, Any]] | None = None,
) -> ModelArchitecture:
    """``ModelArchitecture.from_hf_config``'s parsing (its doc)."""
    if not isinstance(config, Mapping):
        raise InvalidInput(
            "config.json", type(config).__name__,
            "expected a JSON object (a model's config.json from its Hugging Face repository)")
    cfg = _merged_text_config(config)
    model_type = str(cfg.get("model_type", "unknown"))
    num_layers = _required_int(cfg, "num_hidden_layers", hf_id)
    num_heads = _required_int(cfg, "num_attention_heads", hf_id)
    hidden = _required_int(cfg, "hidden_size", hf_id)
    vocab = _required_int(cfg, "vocab_size", hf_id)
    max_pos = _required_int(cfg, "max_position_embeddings", hf_id)
    kv_heads, head_dim = _kv_heads_and_head_dim(cfg, hf_id, num_heads, hidden)
    mla = _mla_facts(cfg, hf_id)
    moe = _moe(cfg, model_type, num_layers)
    mamba = (mamba_facts(cfg, model_type, hf_id)
             if layer_kinds(cfg, num_layers, model_type) is not None else None)
    intermediate = _optional_int(cfg, "intermediate_size") or (
        moe.expert_intermediate_size if moe else None
    )
    if intermediate is None:
        raise InvalidInput(
            "config.json:intermediate_size", None, f"{hf_id}: the MLP width is missing"
        )
    tie = bool(cfg.get("tie_word_embeddings", False))
    vision = _vision_parameter_count(config, hidden)
    estimated = parameter_count is None
    if parameter_count is None:
        parameter_count = estimate_parameter_count(
            num_layers=num_layers, hidden_size=hidden, num_heads=num_heads,
            num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate,
            vocab_size=vocab, tie_word_embeddings=tie, mla=mla, moe=moe,
        ) + vision
    try:
        return ModelArchitecture(
            hf_id=hf_id,
            model_type=model_type,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            intermediate_size=intermediate,
            vocab_size=vocab,
            max_position_embeddings=max_pos,
            parameter_count=parameter_count,
            parameter_count_estimated=estimated,
            tie_word_embeddings=tie,
            torch_dtype=_torch_dtype(cfg),
            layer_groups=_layer_groups(cfg, num_layers, model_type, mla is not None),
            mla=mla,
            mamba=mamba,
            moe=moe,
            quantization=quantization_facts(
                cfg, num_layers, quantization_file,
                top_level=isinstance(config.get("quantization_config"), Mapping)),
            vision_parameter_count=vision,
            # vLLM's GptOssForCausalLM always builds sinks (config.json has no flag for them).
            attention_sinks=model_type == "gpt_oss",
            source=source,
        )
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidInput("config.json", hf_id, str(exc)) from exc


def _kv_heads_and_head_dim(cfg: Mapping[str, Any], hf_id: str, num_heads: int,
                           hidden: int) -> tuple[int, int]:
    """The KV heads and the head dimension, checked as vLLM's attention layers assume them."""
    # Absent or null means multi-head attention (transformers' default); anything else must
    # be a positive divisor of the attention heads, as vLLM's attention layers assume.
    kv_heads = (num_heads if cfg.get("num_key_value_heads") is None
                else _required_int(cfg, "num_key_value_heads", hf_id))
    if num_heads % kv_heads:
        raise InvalidInput(
            "config.json:num_key_value_heads", kv_heads,
            f"{hf_id}: num_attention_heads={num_heads} is not a multiple of it; grouped-query "
            "attention needs whole groups",
        )
    head_dim = _optional_int(cfg, "head_dim")
    if head_dim is None:
        if hidden % num_heads:
            raise InvalidInput(
                "config.json:head_dim", None,
                f"{hf_id}: missing, and hidden_size={hidden} is not a multiple of "
                f"num_attention_heads={num_heads}; add head_dim to the config",
            )
        head_dim = hidden // num_heads
    return kv_heads, head_dim


def _mla_facts(cfg: Mapping[str, Any], hf_id: str) -> MLAFacts | None:
    """Multi-head latent attention's shapes (DeepSeek's ``kv_lora_rank``); None without it."""
    if cfg.get("kv_lora_rank") is None:
        return None
    return MLAFacts(
        kv_lora_rank=_required_int(cfg, "kv_lora_rank", hf_id),
        qk_rope_head_dim=_required_int(cfg, "qk_rope_head_dim", hf_id),
        qk_nope_head_dim=_required_int(cfg, "qk_nope_head_dim", hf_id),
        v_head_dim=_required_int(cfg, "v_head_dim", hf_id),
        q_lora_rank=_optional_int(cfg, "q_lora_rank"),
    )


def _torch_dtype(cfg: Mapping[str, Any]) -> ModelDType:
    """The checkpoint's dtype (``torch_dtype``, newer exports ``dtype``; bfloat16 if none)."""
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return (
        "float16" if dtype_name in ("float16", "half")
        else "float32" if dtype_name in ("float32", "float") else "bfloat16"
    )
