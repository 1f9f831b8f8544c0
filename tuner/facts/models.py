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

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvtune.tuner.facts.mamba import MambaFacts

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
        # The parser (``hf_config``) builds this class and the others of this module, so it
        # imports this module: imported here, at call time, to keep the import one way.
        from kvtune.tuner.facts.hf_config import parse_hf_config

        return parse_hf_config(config, hf_id, parameter_count, source, quantization_file)


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
