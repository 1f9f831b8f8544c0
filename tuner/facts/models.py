"""Model architectures: the facts of a Hugging Face ``config.json`` that decide KV-cache and
weight memory.

``ModelArchitecture.from_hf_config`` reads the file itself (so a user can point kvtune at any
model), including the nested ``text_config`` of multimodal checkpoints (Llama 4, Gemma 3) and
the top-level ``quantization_config`` of pre-quantized checkpoints (DeepSeek-V3's FP8).

Attention layouts are reduced to *layer groups*: consecutive or interleaved layers that keep
the same KV per token and the same retention rule, as vLLM's hybrid KV-cache manager groups
them (``vllm/v1/kv_cache_interface.py``: ``FullAttentionSpec``, ``SlidingWindowSpec``,
``ChunkedLocalAttentionSpec``, ``MLAAttentionSpec``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.kv_scheme import declared_kv_scheme, modelopt_export
from kvtune.tuner.facts.mamba import MambaFacts, layer_kinds, mamba_facts

AttentionKind = Literal["full", "sliding_window", "chunked", "mla", "mamba"]

ModelDType = Literal["bfloat16", "float16", "float32"]


class LayerGroup(BaseModel):
    """Layers that share one attention kind (and window). ``window_tokens`` is the sliding
    window for ``sliding_window`` and the chunk size for ``chunked``; None otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: AttentionKind
    num_layers: int = Field(gt=0)
    window_tokens: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _window_iff_local(self) -> LayerGroup:
        local = self.kind in ("sliding_window", "chunked")
        if local != (self.window_tokens is not None):
            raise ValueError(
                f"window_tokens={self.window_tokens} does not match kind={self.kind!r}: "
                "sliding_window/chunked layers need a window, full/mla layers have none"
            )
        return self


class MLAFacts(BaseModel):
    """Multi-head latent attention (DeepSeek V2/V3): one compressed latent per token per
    layer of ``kv_lora_rank + qk_rope_head_dim`` elements, shared by all heads and
    replicated on every tensor-parallel rank."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)
    q_lora_rank: int | None = Field(default=None, gt=0)

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


class MoEFacts(BaseModel):
    """Mixture-of-experts facts that matter for the parameter count (all experts are
    resident in memory; only ``experts_per_token`` are read per token)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_experts: int = Field(gt=0)
    experts_per_token: int = Field(gt=0)
    expert_intermediate_size: int = Field(gt=0)
    num_shared_experts: int = Field(default=0, ge=0)
    # Width of each shared expert when it differs from the routed experts' (Qwen2-MoE's
    # shared_expert_intermediate_size); None: the routed experts' width.
    shared_expert_intermediate_size: int | None = Field(default=None, gt=0)
    # Layers with a dense MLP instead of experts (DeepSeek's first_k_dense_replace,
    # Llama 4's interleave step).
    num_dense_layers: int = Field(default=0, ge=0)
    # Intermediate size of those dense MLPs (and of Llama 4's shared expert).
    dense_intermediate_size: int | None = Field(default=None, gt=0)


class CheckpointQuantization(BaseModel):
    """A checkpoint's own ``quantization_config``: its weights are stored this way."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str  # "fp8", "awq", "gptq", "compressed-tensors", "mxfp4", ...
    weight_bits: int = Field(gt=0, le=16)
    # Only the MoE experts are stored quantized (gpt-oss's MXFP4 leaves attention, router,
    # embeddings and lm_head in 16 bits: ``modules_to_not_convert``).
    experts_only: bool = False
    # Layers whose attention / dense MLP the checkpoint left in 16 bits (its
    # modules_to_not_convert: Meta's FP8 Llama 3.1 405B keeps all attention and the first and
    # last layers' MLPs in bf16).
    unquantized_attention_layers: int = Field(default=0, ge=0)
    unquantized_mlp_layers: int = Field(default=0, ge=0)
    # fp8 block-wise scales (DeepSeek-V3: [128, 128]); group size for int4 methods.
    weight_block_size: tuple[int, ...] | None = None
    group_size: int | None = None
    # The file the settings came from when config.json has none: AutoGPTQ's
    # ``quantize_config.json``, AutoAWQ's ``quant_config.json``. vLLM 0.33 reads such a file
    # only when ``--quantization`` names the method (weight_utils.get_quant_config), so the
    # plan must render it. None: config.json's quantization_config (vLLM detects it), or
    # ModelOpt's ``hf_quant_config.json``, which vLLM reads on its own
    # (transformers_utils/config.py).
    config_file: str | None = None
    # GPTQ settings vLLM 0.33 refuses (auto_gptq.py): activation reordering with grouped
    # scales (desc_act with group_size != -1), asymmetric weights.
    group_activation_order: bool = False
    symmetric: bool = True
    # Settings vLLM's config class requires and the file lacks (AutoGPTQConfig.from_config:
    # bits, group_size, desc_act, sym; AutoAWQConfig: w_bit/bits, q_group_size/group_size,
    # zero_point): vLLM raises "Cannot find any of [...]" at start.
    missing_settings: tuple[str, ...] = ()
    # What vLLM 0.33 serves ``--kv-cache-dtype auto`` at on this checkpoint when it declares
    # a KV-cache scheme (llm-compressor's kv_cache_scheme, ModelOpt's kv_cache_quant_algo):
    # ``fp8`` / ``fp8_e4m3`` / ``nvfp4``; None: the model's 16-bit dtype (``kv_cache_scheme``).
    kv_cache_dtype: str | None = None
    # That declaration in words (``kv_scheme.DeclaredKVScheme.words``, e.g. "compressed-tensors
    # float8 tensor"): the KV-quality gate quotes it as the checkpoint's evidence of
    # calibrated k/v scales.
    kv_cache_scheme: str | None = None


class ModelArchitecture(BaseModel):
    """What kvtune knows of a model. Sizes are element counts; the dtype is applied by
    ``kvmemory`` and ``weights``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hf_id: str
    model_type: str
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    parameter_count: int = Field(gt=0)
    # True when parameter_count was derived from the shapes, not published by the model.
    parameter_count_estimated: bool = False
    tie_word_embeddings: bool = False
    torch_dtype: ModelDType = "bfloat16"
    layer_groups: tuple[LayerGroup, ...]
    mla: MLAFacts | None = None
    mamba: MambaFacts | None = None
    moe: MoEFacts | None = None
    quantization: CheckpointQuantization | None = None
    # Learned attention sinks per head (gpt-oss): no KV of their own, but only some vLLM
    # attention backends serve them (``supports_sink``).
    attention_sinks: bool = False
    # Parameters of a vision tower and its projector (multimodal checkpoints); part of
    # parameter_count, and never quantized by the language model's weight dtype.
    vision_parameter_count: int = Field(default=0, ge=0)
    # Where the facts came from (a URL or a file path).
    source: str = ""

    @model_validator(mode="after")
    def _groups_cover_layers(self) -> ModelArchitecture:
        total = sum(g.num_layers for g in self.layer_groups if g.kind != "mamba")
        mamba = sum(g.num_layers for g in self.layer_groups if g.kind == "mamba")
        if (self.mamba is not None) != (mamba > 0):
            raise ValueError("a model with mamba layers must have mamba facts, and only it")
        # Falcon-H1 runs attention and Mamba side by side in every layer (both kinds cover
        # all layers); the others alternate them (the kinds partition the layers).
        # Nemotron-H also has MLP-only layers, which keep no cache.
        parallel = mamba == total == self.num_hidden_layers
        covered = total if parallel else total + mamba
        if covered != self.num_hidden_layers and not (mamba and covered < self.num_hidden_layers):
            raise ValueError(
                f"layer_groups cover {total} layers but num_hidden_layers="
                f"{self.num_hidden_layers}; the groups must partition the layers"
            )
        if (self.mla is not None) != any(g.kind == "mla" for g in self.layer_groups):
            raise ValueError("an MLA model must have mla facts and mla layer groups, and only it")
        return self

    @property
    def attention_kind(self) -> str:
        """``mla``, ``full``, or ``hybrid`` (full + sliding/chunked layers) or
        ``sliding_window``/``chunked`` when every layer is local."""
        kinds = {g.kind for g in self.layer_groups}
        if len(kinds) == 1:
            return next(iter(kinds))
        return "hybrid"

    @property
    def attention_layers(self) -> int:
        """Layers that keep per-token KV (all but the Mamba / linear-attention ones)."""
        return sum(g.num_layers for g in self.layer_groups if g.kind != "mamba")

    @property
    def is_mla(self) -> bool:
        return self.mla is not None

    @property
    def served_dtype(self) -> Literal["bfloat16", "float16"]:
        """The dtype vLLM serves the checkpoint at with ``--dtype auto``: its own, except that
        float32 checkpoints are downcast to the platform's preferred dtype, bfloat16 on every
        GPU of compute capability 8.0 or newer (vllm/config/model.py ``_resolve_auto_dtype``;
        vllm/platforms/cuda.py ``supported_dtypes``)."""
        return "float16" if self.torch_dtype == "float16" else "bfloat16"

    @property
    def attention_parameters_per_layer(self) -> int:
        """q, k, v and o projections of one layer (non-MLA)."""
        return self.hidden_size * self.head_dim * (
            2 * self.num_attention_heads + 2 * self.num_kv_heads)

    @property
    def dense_mlp_parameters_per_layer(self) -> int:
        """gate, up and down projections of one dense MLP layer."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_parameter_count(self) -> int:
        """Parameters of the routed experts (0 for a dense model)."""
        if self.moe is None:
            return 0
        moe_layers = self.num_hidden_layers - self.moe.num_dense_layers
        return moe_layers * self.moe.num_experts * 3 * self.hidden_size * (
            self.moe.expert_intermediate_size)

    @property
    def active_parameter_count(self) -> int:
        """Parameters read per token (MoE reads only the routed experts)."""
        if self.moe is None:
            return self.parameter_count
        moe = self.moe
        inactive = self.expert_parameter_count * (
            moe.num_experts - moe.experts_per_token) // moe.num_experts
        return max(1, self.parameter_count - inactive)

    @property
    def embedding_parameter_count(self) -> int:
        """Embedding plus lm_head parameters (both stay 16-bit in quantized checkpoints)."""
        per_table = self.vocab_size * self.hidden_size
        return per_table if self.tie_word_embeddings else 2 * per_table

    @property
    def auto_kv_cache_dtype(self) -> str | None:
        """What ``--kv-cache-dtype auto`` means on this checkpoint when not its 16-bit dtype:
        the KV-cache scheme it declares (``CheckpointQuantization.kv_cache_dtype``)."""
        return self.quantization.kv_cache_dtype if self.quantization is not None else None

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        hf_id: str,
        *,
        parameter_count: int | None = None,
        source: str = "",
        quantization_file: tuple[str, Mapping[str, Any]] | None = None,
    ) -> ModelArchitecture:
        """Parse a Hugging Face ``config.json`` (as a dict). ``quantization_file``: (name,
        contents) of a quantization file beside it (``QUANTIZATION_FILES``), read only when
        config.json has no quantization_config, as vLLM does. Raises ``InvalidInput`` naming
        the missing or malformed field."""
        return _parse_hf_config(config, hf_id, parameter_count, source, quantization_file)


# --- parsing -------------------------------------------------------------------------------


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


def _unconverted_layers(q: Mapping[str, Any], num_layers: int) -> tuple[int, int]:
    """(layers whose attention, layers whose dense MLP) a quantized checkpoint left in 16 bits,
    from ``modules_to_not_convert`` / ``ignored_layers`` / ``ignore`` entries such as
    ``model.layers.0.self_attn.q_proj`` or ``model.layers.*.self_attn``."""
    entries: list[str] = []
    for key in ("modules_to_not_convert", "ignored_layers", "ignore"):
        value = q.get(key)
        if isinstance(value, list):
            entries += [str(v) for v in value]
    attention: set[int] = set()
    mlp: set[int] = set()
    for entry in entries:
        match = re.search(r"layers\.(\d+|\*)\.(self_attn|mlp)(\.[a-z_]+)?", entry)
        if match is None or (match.group(3) or "").startswith((".router", ".gate.")):
            continue
        layers = range(num_layers) if match.group(1) == "*" else [int(match.group(1))]
        (attention if match.group(2) == "self_attn" else mlp).update(
            i for i in layers if i < num_layers)
    return len(attention), len(mlp)


# Quantization files vLLM 0.33 reads beside config.json when it has no quantization_config:
# file -> the method whose settings it holds and whether vLLM reads it unasked.
# - hf_quant_config.json: ModelOpt <= 0.29; read on its own (transformers_utils/config.py).
# - quantize_config.json: AutoGPTQ; read by AutoGPTQConfig.get_config_filenames, i.e. only
#   with --quantization gptq (model_loader/weight_utils.py get_quant_config).
# - quant_config.json: AutoAWQ; likewise only with --quantization awq.
QUANTIZATION_FILES: dict[str, tuple[str, bool]] = {
    "hf_quant_config.json": ("modelopt", True),
    "quantize_config.json": ("gptq", False),
    "quant_config.json": ("awq", False),
}
# What vLLM 0.33's config classes read with get_from_keys (required; any one key of a group).
_GPTQ_SETTINGS: tuple[tuple[str, ...], ...] = (("bits",), ("group_size",), ("desc_act",),
                                               ("sym",))
_AWQ_SETTINGS: tuple[tuple[str, ...], ...] = (("w_bit", "bits"), ("q_group_size", "group_size"),
                                              ("zero_point",))
_REQUIRED_SETTINGS: dict[str, tuple[tuple[str, ...], ...]] = {
    "gptq": _GPTQ_SETTINGS, "auto_gptq": _GPTQ_SETTINGS, "gptq_marlin": _GPTQ_SETTINGS,
    "awq": _AWQ_SETTINGS, "auto_awq": _AWQ_SETTINGS, "awq_marlin": _AWQ_SETTINGS,
}
# ModelOpt's quant_algo -> vLLM's method (model_arch_config_convertor.py
# _normalize_quantization_config) and bits per weight.
_MODELOPT_ALGOS: dict[str, tuple[str, int]] = {
    "FP8": ("modelopt", 8), "FP8_PER_CHANNEL_PER_TOKEN": ("modelopt", 8),
    "FP8_PB_WO": ("modelopt", 8), "NVFP4": ("modelopt_fp4", 4),
}


def _modelopt_method(q: Mapping[str, Any]) -> tuple[str, int] | None:
    """(method, bits) of a ModelOpt config (``producer.name: modelopt`` or the legacy
    ``quantization.modelopt_quant_config``), as vLLM normalises it; None: not ModelOpt."""
    if not modelopt_export(q):
        return None
    inner = q.get("quantization")
    algo = inner.get("quant_algo") if isinstance(inner, Mapping) else None
    if algo is None:
        return None
    found = _MODELOPT_ALGOS.get(str(algo).upper())
    if found is None:
        # vLLM raises "Unknown ModelOpt quant algo" (MIXED_PRECISION's layers are per file).
        raise InvalidInput(
            "quantization_config.quantization.quant_algo", algo,
            f"kvtune sizes ModelOpt {', '.join(_MODELOPT_ALGOS)} checkpoints; this one's "
            "weights cannot be sized: pin kv_cache_memory_bytes or use another checkpoint")
    return found


def _kv_cache_dtype(q: Mapping[str, Any], method: str, top_level: bool
                    ) -> tuple[str | None, str | None]:
    """What vLLM 0.33 serves ``--kv-cache-dtype auto`` at on a checkpoint with this
    quantization config (None: the model's 16-bit dtype), and the declared scheme in words
    when vLLM serves it; a scheme vLLM refuses is refused here. The parsing and vLLM's
    rules: ``kv_scheme.declared_kv_scheme``."""
    declared = declared_kv_scheme(q, method, top_level)
    if declared is None:
        return None, None
    if declared.refusal is not None:
        raise declared.refusal
    if declared.auto_dtype is None:
        return None, None
    return declared.auto_dtype, declared.words


def _quantization(cfg: Mapping[str, Any], num_layers: int,
                  quantization_file: tuple[str, Mapping[str, Any]] | None = None,
                  top_level: bool = True) -> CheckpointQuantization | None:
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping):
        # Older llm-compressor exports name it compression_config; vLLM reads that when
        # quantization_config is absent (weight_utils.get_quant_config).
        q = cfg.get("compression_config")
    config_file: str | None = None
    if not isinstance(q, Mapping) and quantization_file is not None:
        name, q = quantization_file
        method_of_file, read_unasked = QUANTIZATION_FILES[name]
        if "quant_method" not in q and _modelopt_method(q) is None:
            # AutoGPTQ/AutoAWQ files name no method: AutoAWQ's keys (w_bit, zero_point) say
            # AWQ in either file name, else the file name says it.
            awq = "w_bit" in q or "zero_point" in q
            q = {**q, "quant_method": "awq" if awq else method_of_file}
        config_file = None if read_unasked else name
        top_level = True
    if not isinstance(q, Mapping):
        return None
    modelopt = _modelopt_method(q)
    method = modelopt[0] if modelopt else str(q.get("quant_method", "unknown")).lower()
    method = method.replace("compressed_tensors", "compressed-tensors")
    bits = modelopt[1] if modelopt else q.get("bits") or q.get("w_bit") or q.get("weight_bits")
    experts_only = False
    if method in ("fp8", "fbgemm_fp8", "modelopt") or (
            isinstance(q.get("fmt"), str) and "e4m3" in str(q.get("fmt"))):
        bits = 8
    if method == "bitsandbytes":
        bits = 4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else bits
    if method == "mxfp4":
        # gpt-oss: the experts in MXFP4 (4-bit values, one 8-bit scale per 32), attention,
        # router, embeddings and lm_head left in 16 bits (its modules_to_not_convert).
        bits, experts_only = 4, True
    if method in ("awq", "gptq", "marlin") and bits is None:
        bits = 4
    if method == "compressed-tensors" and bits is None:
        groups = q.get("config_groups")
        if isinstance(groups, Mapping):
            for group in groups.values():
                w = group.get("weights") if isinstance(group, Mapping) else None
                if isinstance(w, Mapping) and isinstance(w.get("num_bits"), int):
                    bits = w["num_bits"]
                    break
    where = config_file or "config.json:quantization_config"
    if not isinstance(bits, int) or isinstance(bits, bool) or not 0 < bits <= 16:
        # Ignoring it would size a quantized checkpoint as a 16-bit one.
        raise InvalidInput(
            where, method,
            "kvtune cannot tell how many bits this checkpoint stores per weight (no bits, "
            "w_bit, load_in_4bit/8bit or fp8 format); add \"bits\" to its quantization_config",
        )
    required = _REQUIRED_SETTINGS.get(method, ())
    missing = tuple(" or ".join(keys) for keys in required if not any(k in q for k in keys))
    block = q.get("weight_block_size")
    gsize = q.get("group_size") or q.get("q_group_size")
    attention_layers, mlp_layers = _unconverted_layers(q, num_layers)
    kv_cache_dtype, kv_cache_scheme = _kv_cache_dtype(q, method, top_level)
    return CheckpointQuantization(
        method=method,
        weight_bits=bits,
        experts_only=experts_only,
        unquantized_attention_layers=attention_layers,
        unquantized_mlp_layers=mlp_layers,
        weight_block_size=tuple(int(b) for b in block) if isinstance(block, list) else None,
        group_size=int(gsize) if isinstance(gsize, int) and gsize > 0 else None,
        config_file=config_file,
        group_activation_order=bool(q.get("desc_act")) and gsize != -1,
        symmetric=q.get("sym") is not False,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_scheme=kv_cache_scheme,
        missing_settings=missing,
    )


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


def _parse_hf_config(
    config: Mapping[str, Any], hf_id: str, parameter_count: int | None, source: str,
    quantization_file: tuple[str, Mapping[str, Any]] | None = None,
) -> ModelArchitecture:
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
    mla: MLAFacts | None = None
    if cfg.get("kv_lora_rank") is not None:
        mla = MLAFacts(
            kv_lora_rank=_required_int(cfg, "kv_lora_rank", hf_id),
            qk_rope_head_dim=_required_int(cfg, "qk_rope_head_dim", hf_id),
            qk_nope_head_dim=_required_int(cfg, "qk_nope_head_dim", hf_id),
            v_head_dim=_required_int(cfg, "v_head_dim", hf_id),
            q_lora_rank=_optional_int(cfg, "q_lora_rank"),
        )
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
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    torch_dtype: ModelDType = (
        "float16" if dtype_name in ("float16", "half")
        else "float32" if dtype_name in ("float32", "float") else "bfloat16"
    )
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
            torch_dtype=torch_dtype,
            layer_groups=_layer_groups(cfg, num_layers, model_type, mla is not None),
            mla=mla,
            mamba=mamba,
            moe=moe,
            quantization=_quantization(
                cfg, num_layers, quantization_file,
                top_level=isinstance(config.get("quantization_config"), Mapping)),
            vision_parameter_count=vision,
            # vLLM's GptOssForCausalLM always builds sinks (config.json has no flag for them).
            attention_sinks=model_type == "gpt_oss",
            source=source,
        )
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidInput("config.json", hf_id, str(exc)) from exc
