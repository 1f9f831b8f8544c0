"""Hybrid attention/Mamba models as vLLM 0.33 sizes them: which layers keep a per-sequence
recurrent state instead of per-token KV, the state's shapes, and the page-size unification
that makes both kinds share one block pool.

Sources (vLLM 0.33.0):

- which layers are Mamba: ``layer_types`` (GraniteMoeHybrid: ``mamba``/``attention``; Qwen3
  Next: ``linear_attention``/``full_attention``), ``hybrid_override_pattern`` (Nemotron-H: ``M``
  Mamba, ``*`` attention, ``-``/``E`` MLP or MoE with no cache), ``attn_layer_period`` /
  ``attn_layer_offset`` (Jamba), ``full_attention_interval`` (Qwen3-Next), and Falcon-H1's
  parallel attention + Mamba in every layer;
- the state shapes: ``MambaStateShapeCalculator`` (``mamba1_state_shape``,
  ``mamba2_state_shape``, ``gated_delta_net_state_shape``) as each model class calls it;
  dtypes: ``MambaStateDtypeCalculator`` (conv state in the model dtype, SSM state likewise
  unless ``--mamba-ssm-cache-dtype``; Nemotron-H's config class makes it float32);
- the block size: ``Platform._align_hybrid_block_size``: the attention block is raised to the
  smallest multiple of the kernel alignment (FlashAttention: 16, or the user's block size if
  larger) whose page (block x one token's KV in one layer) holds one Mamba state, and the Mamba
  page is padded up to exactly that page (``mamba_page_size_padded``).

Worked example, granite-4.0-h-small at bf16, TP 1: one Mamba-2 state is a conv state of
3 x (8,192 + 2 x 1 x 128) and an SSM state of 128 x 64 x 128, (25,344 + 1,048,576) x 2 =
2,147,840 bytes; one token of one attention layer is 2 x 8 x 128 x 2 = 4,096 bytes, so the
attention block becomes 16 x cdiv(2,147,840, 16 x 4,096) = 528 tokens and every page
2,162,688 bytes (vLLM's own ``_align_hybrid_block_size`` gives the same on CPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.errors import InvalidInput

MambaFamily = Literal["mamba1", "mamba2", "gated_delta_net"]
StateDType = Literal["bfloat16", "float16", "float32"]
_DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
# FlashAttention's kernel block sizes on CUDA before Blackwell: MultipleOf(16)
# (vllm/v1/attention/backends/flash_attn.py get_supported_kernel_block_sizes).
KERNEL_BLOCK_ALIGNMENT = 16


class MambaFacts(BaseModel):
    """The per-sequence state of a hybrid model's Mamba / linear-attention layers: fixed
    bytes per running sequence and layer, whatever its length. Fields follow
    ``MambaStateShapeCalculator``: ``intermediate_size`` is the Mamba inner width,
    ``num_heads``/``head_dim`` the SSM heads (Mamba-2) or the value heads (gated delta net),
    ``n_groups`` the B/C groups (Mamba-2) or the key heads (gated delta net), ``state_size``
    the SSM state (gated delta net: the key head width)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: MambaFamily
    intermediate_size: int = Field(gt=0)
    state_size: int = Field(gt=0)
    conv_kernel: int = Field(gt=1)
    n_groups: int = Field(default=1, gt=0)
    num_heads: int = Field(default=1, gt=0)
    head_dim: int = Field(default=1, gt=0)
    # The SSM state's dtype when --mamba-ssm-cache-dtype is auto: Nemotron-H's config class
    # sets float32 (NemotronHForCausalLMConfig); None: the model dtype.
    ssm_dtype: StateDType | None = None


def _divide(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise InvalidInput(
            "tensor_parallel", tp,
            f"the model's {what} ({value}) is not divisible by it; vLLM shards the Mamba "
            "state evenly: pick a tensor-parallel size that divides it")
    return value // tp


def state_shapes(facts: MambaFacts, tensor_parallel: int) -> tuple[tuple[int, ...], ...]:
    """(conv state, temporal state) shapes on one TP rank, as vLLM's calculator gives them
    (its default "SD" conv layout: (kernel - 1, dim))."""
    tp, f = tensor_parallel, facts
    if f.family == "mamba1":
        inner = _divide(f.intermediate_size, tp, "Mamba intermediate size")
        return (f.conv_kernel - 1, inner), (inner, f.state_size)
    if f.family == "mamba2":
        # Groups not divisible by TP are replicated so each head shard has its groups.
        groups = f.n_groups if f.n_groups % tp == 0 else tp
        conv_dim = f.intermediate_size + 2 * groups * f.state_size
        return ((f.conv_kernel - 1, _divide(conv_dim, tp, "Mamba conv width")),
                (_divide(f.num_heads, tp, "Mamba heads"), f.head_dim, f.state_size))
    # Gated delta net: q and k of n_groups x state_size, v of num_heads x head_dim.
    conv_dim = 2 * f.n_groups * f.state_size + f.num_heads * f.head_dim
    return ((f.conv_kernel - 1, _divide(conv_dim, tp, "linear-attention conv width")),
            (_divide(f.num_heads, tp, "linear-attention value heads"), f.head_dim,
             f.state_size))


def state_bytes(facts: MambaFacts, tensor_parallel: int, model_dtype: str) -> int:
    """Bytes of one sequence's state in one Mamba layer on one GPU (``MambaSpec``'s
    unpadded page)."""
    conv, ssm = state_shapes(facts, tensor_parallel)
    conv_bytes = _DTYPE_BYTES[model_dtype]
    ssm_bytes = _DTYPE_BYTES[facts.ssm_dtype or model_dtype]
    return prod(conv) * conv_bytes + prod(ssm) * ssm_bytes


def aligned_block_size(block_size: int, state_page_bytes: int, token_bytes: int) -> int:
    """``_align_hybrid_block_size``: the attention block (tokens) vLLM uses so that one
    attention page (block x ``token_bytes``, one layer) holds a Mamba state page."""
    if block_size < 1:
        raise InvalidInput("block_size", block_size, "must be a positive number of tokens")
    alignment = max(KERNEL_BLOCK_ALIGNMENT, block_size)
    needed = alignment * -(-state_page_bytes // (alignment * token_bytes))
    needed = KERNEL_BLOCK_ALIGNMENT * -(-needed // KERNEL_BLOCK_ALIGNMENT)
    return max(block_size, needed)


# --- config.json ---------------------------------------------------------------------------


def _int(cfg: Mapping[str, Any], key: str, hf_id: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(
            f"config.json:{key}", value,
            f"{hf_id}: a hybrid Mamba model needs this positive integer to size its state; "
            "pass the model's own config.json")
    return value


def _opt(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_FAMILIES = ("granitemoehybrid", "nemotron_h", "jamba", "falcon_h1")


def mamba_facts(cfg: Mapping[str, Any], model_type: str, hf_id: str) -> MambaFacts:
    """The state facts of a hybrid model's Mamba layers, read as its vLLM model class reads
    them (``get_mamba_state_shape_from_config``)."""
    if model_type not in _FAMILIES and not model_type.startswith("qwen3_next"):
        # Another model's recurrent layers may keep a state of another shape (KDA, short
        # conv, ...): refuse rather than size it as a Mamba-2 state.
        raise InvalidInput(
            "config.json:model_type", model_type,
            f"{hf_id} has Mamba or linear-attention layers, and kvtune models the state of "
            f"{', '.join(_FAMILIES)} and qwen3_next only; this one's cache is not modelled: "
            "pin kv_cache_memory_bytes")
    hidden = _int(cfg, "hidden_size", hf_id)
    if model_type == "jamba":
        return MambaFacts(family="mamba1",
                          intermediate_size=_int(cfg, "mamba_expand", hf_id) * hidden,
                          state_size=_int(cfg, "mamba_d_state", hf_id),
                          conv_kernel=_int(cfg, "mamba_d_conv", hf_id))
    if model_type == "nemotron_h":
        heads, head_dim = _int(cfg, "mamba_num_heads", hf_id), _int(cfg, "mamba_head_dim", hf_id)
        ssm = str(cfg.get("mamba_ssm_cache_dtype") or "float32")
        return MambaFacts(family="mamba2", intermediate_size=heads * head_dim,
                          n_groups=_int(cfg, "n_groups", hf_id), num_heads=heads,
                          head_dim=head_dim, state_size=_int(cfg, "ssm_state_size", hf_id),
                          conv_kernel=_int(cfg, "conv_kernel", hf_id),
                          ssm_dtype=ssm if ssm in _DTYPE_BYTES else "float32")
    if model_type.startswith("qwen3_next"):
        v_heads, v_dim = (_int(cfg, "linear_num_value_heads", hf_id),
                          _int(cfg, "linear_value_head_dim", hf_id))
        return MambaFacts(family="gated_delta_net", intermediate_size=v_heads * v_dim,
                          n_groups=_int(cfg, "linear_num_key_heads", hf_id),
                          num_heads=v_heads, head_dim=v_dim,
                          state_size=_int(cfg, "linear_key_head_dim", hf_id),
                          conv_kernel=_int(cfg, "linear_conv_kernel_dim", hf_id))
    # GraniteMoeHybrid and Falcon-H1 (its mamba_d_ssm overrides expand x hidden).
    inner = _opt(cfg, "mamba_d_ssm") or _int(cfg, "mamba_expand", hf_id) * hidden
    return MambaFacts(family="mamba2", intermediate_size=inner,
                      n_groups=_int(cfg, "mamba_n_groups", hf_id),
                      num_heads=_int(cfg, "mamba_n_heads", hf_id),
                      head_dim=_int(cfg, "mamba_d_head", hf_id),
                      state_size=_int(cfg, "mamba_d_state", hf_id),
                      conv_kernel=_int(cfg, "mamba_d_conv", hf_id))


# Per-layer kinds: an attention kind, "mamba", or "none" (an MLP/MoE-only layer).
_LAYER_TYPE_NAMES: dict[str, str] = {
    "full_attention": "full", "attention": "full", "sliding_attention": "sliding_window",
    "chunked_attention": "chunked", "mamba": "mamba", "linear_attention": "mamba",
}
_PATTERN_CHARS: dict[str, str] = {"M": "mamba", "*": "full", "-": "none", "E": "none"}


def layer_kinds(cfg: Mapping[str, Any], num_layers: int, model_type: str
                ) -> tuple[list[str], bool] | None:
    """Per-layer kinds of a hybrid Mamba model and whether attention and Mamba run side by
    side in every layer (Falcon-H1); None when the config has no Mamba layers."""
    found = _layer_kinds(cfg, num_layers, model_type)
    if found is not None and len(found[0]) != num_layers:
        field = ("hybrid_override_pattern" if isinstance(cfg.get("hybrid_override_pattern"), str)
                 else "layer_types")
        raise InvalidInput(
            f"config.json:{field}", len(found[0]),
            f"names that many layers but num_hidden_layers is {num_layers}; pass the "
            "model's own config.json")
    return found


def _layer_kinds(cfg: Mapping[str, Any], num_layers: int, model_type: str
                 ) -> tuple[list[str], bool] | None:
    if model_type == "falcon_h1":
        return ["full"] * num_layers, True
    types = cfg.get("layer_types")
    if isinstance(types, list) and any(t in ("mamba", "linear_attention") for t in types):
        kinds = []
        for index, name in enumerate(types):
            kind = _LAYER_TYPE_NAMES.get(str(name))
            if kind is None:
                raise InvalidInput(
                    f"config.json:layer_types[{index}]", name,
                    f"kvtune sizes {', '.join(sorted(_LAYER_TYPE_NAMES))} layers; this "
                    "layer type's cache is not modelled: pin kv_cache_memory_bytes")
            kinds.append(kind)
        return kinds, False
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        bad = sorted(set(pattern) - set(_PATTERN_CHARS))
        if bad:
            raise InvalidInput("config.json:hybrid_override_pattern", bad[0],
                               "expected M (Mamba), * (attention), - (MLP) or E (MoE)")
        return [_PATTERN_CHARS[c] for c in pattern], False
    period, offset = _opt(cfg, "attn_layer_period"), _opt(cfg, "attn_layer_offset")
    if model_type == "jamba" and period is not None and offset is not None:
        return ["full" if i % period == offset else "mamba" for i in range(num_layers)], False
    interval = _opt(cfg, "full_attention_interval")
    if model_type.startswith("qwen3_next") and interval:
        return ["full" if (i + 1) % interval == 0 else "mamba"
                for i in range(num_layers)], False
    return None
