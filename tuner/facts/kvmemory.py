"""KV-cache bytes as vLLM lays its pages out (``vllm/v1/kv_cache_interface.py`` and the
backends' ``customize_spec``), per GPU (one tensor-parallel rank).

Per layer and per token, for one stored K/V state:

- dense (``auto``/``bfloat16``/``float16``/``fp8*``)::

      2 (K and V) * heads_per_rank * head_dim * element_bytes

- per-token-head (``int8/fp8/int4_per_token_head``, TRITON_ATTN): each head's K and V
  carry one fp32 scale each; int4 packs two values per byte::

      heads_per_rank * ((head_dim + head_dim) * element_bytes + 2 * 4)

- NVFP4 (``nvfp4``, ``nvfp4_4over6``, FLASHINFER on Blackwell): K and V are separate head
  slots of ``head_dim/2`` bytes of fp4 data plus ``head_dim/16`` bytes of fp8 scales::

      2 * heads_per_rank * (head_dim // 2 + head_dim // 16)

- MLA (DeepSeek V2/V3): one latent of ``kv_lora_rank + qk_rope_head_dim`` (512 + 64 = 576)
  elements, no separate V, replicated on every TP rank (``num_kv_heads=1``,
  ``max_tp_shards=1``); ``fp8_ds_mla`` is a fixed 656-byte row.

``heads_per_rank = max(1, num_kv_heads // tensor_parallel)``: vLLM replicates KV heads when
TP exceeds them.

``auto`` is the model's 16-bit dtype, except on a checkpoint that declares a KV-cache scheme
(llm-compressor's ``kv_cache_scheme``, ModelOpt's ``kv_cache_quant_algo``): vLLM 0.33 then
serves auto at that scheme (fp8), and it is sized so (``resolve_auto``).

Worked example, Llama 3.3 70B (80 layers, 8 KV heads, head_dim 128):

- bf16, TP 1: 80 * 2 * 8 * 128 * 2 = 327,680 bytes per token (the article's "0.32 MB").
- fp8, TP 1: 163,840. int8_per_token_head: 80 * 8 * (256 * 1 + 8) = 168,960 (+3.1%
  scales). int4_per_token_head: 80 * 8 * (128 + 8) = 87,040. nvfp4: 80 * 2 * 8 * (64 + 8)
  = 92,160.
- bf16, TP 2: 4 heads per rank, 163,840 bytes per token per GPU.

A page (block) holds ``block_size`` tokens of every layer; vLLM's num_gpu_blocks is the KV
budget divided by the page bytes summed over layers. Hybrid models (Gemma 2/3, Llama 4) are
split into groups of equal layer count that share one block pool (``kv_cache_groups``): a
block then holds one group's layers, and a request takes blocks in every group, capped by
the window in sliding-window and chunked groups. Gemma 3 27B (10 full + 52 sliding layers,
window 1024): 7 groups of 10 layers (8 padding), a 32K-token request at 8,192 batched tokens
takes 2,048 + 6 x 1,089 blocks of 10 x 16 x 8,192 bytes = 11.2 GB at bf16, against 16.6 GB
if every layer kept every token.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.mamba import aligned_block_size, state_bytes
from kvtune.tuner.facts.models import AttentionKind, LayerGroup, ModelArchitecture

_ELEMENT_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
_FP32_SCALE_BYTES = 4
# Fixed per-token rows of the sparse-MLA layouts (vllm/model_executor/layers/attention/
# mla_attention.py: {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}).
_DS_MLA_ROW_BYTES: dict[str, int] = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
_DENSE_8BIT = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
_PER_TOKEN_HEAD = ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
_NVFP4 = ("nvfp4", "nvfp4_4over6")


def _kv_heads_per_rank(model: ModelArchitecture, tensor_parallel: int) -> int:
    if model.is_mla:
        return 1  # one latent, replicated on every rank
    return max(1, model.num_kv_heads // tensor_parallel)


def _head_size(model: ModelArchitecture) -> int:
    return model.mla.latent_dim if model.mla is not None else model.head_dim


def resolve_auto(model: ModelArchitecture, kv_cache_dtype: str) -> str:
    """``kv_cache_dtype`` as vLLM 0.33 stores it on this checkpoint: ``auto`` becomes the KV
    scheme the checkpoint declares (``ModelArchitecture.auto_kv_cache_dtype``), if any."""
    if kv_cache_dtype == "auto" and model.auto_kv_cache_dtype is not None:
        return model.auto_kv_cache_dtype
    return kv_cache_dtype


def layer_kv_bytes_per_token(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    *,
    model_dtype: str = "bfloat16",
) -> int:
    """Bytes one token occupies in one attention layer on one GPU."""
    if tensor_parallel < 1:
        raise InvalidInput("tensor_parallel", tensor_parallel, "must be 1 or more")
    kv_cache_dtype = resolve_auto(model, kv_cache_dtype)
    heads = _kv_heads_per_rank(model, tensor_parallel)
    head = _head_size(model)
    # K and V sides; MLA stores one latent and no separate V.
    sides = 1 if model.is_mla else 2
    if kv_cache_dtype in ("auto", "bfloat16", "float16"):
        elem = _ELEMENT_BYTES.get(model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype)
        if elem is None:
            raise InvalidInput("model_dtype", model_dtype, "expected bfloat16, float16 or float32")
        return sides * heads * head * elem
    if kv_cache_dtype in _DENSE_8BIT:
        return sides * heads * head
    if kv_cache_dtype in _PER_TOKEN_HEAD:
        data = head // 2 if kv_cache_dtype == "int4_per_token_head" else head
        return heads * (sides * data + 2 * _FP32_SCALE_BYTES)
    if kv_cache_dtype in _NVFP4:
        if model.is_mla:
            raise InvalidInput(
                "kv_cache_dtype", kv_cache_dtype,
                f"{model.hf_id} uses MLA; NVFP4 KV serves standard attention only "
                "(nvfp4_ds_mla is sparse-MLA only)",
            )
        return 2 * heads * (head // 2 + head // 16)
    if kv_cache_dtype in _DS_MLA_ROW_BYTES:
        if not model.is_mla:
            raise InvalidInput(
                "kv_cache_dtype", kv_cache_dtype,
                f"{model.hf_id} does not use MLA; {kv_cache_dtype} is for sparse MLA models",
            )
        return _DS_MLA_ROW_BYTES[kv_cache_dtype]
    raise InvalidInput(
        "kv_cache_dtype", kv_cache_dtype,
        "kvtune cannot size this dtype's pages (its layout is not modeled); pick auto, fp8, "
        "int8_per_token_head, fp8_per_token_head, int4_per_token_head or nvfp4",
    )


def kv_bytes_per_token(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    *,
    model_dtype: str = "bfloat16",
) -> int:
    """Bytes one token occupies across all attention layers on one GPU (as if every layer
    kept it; sliding-window and chunked layers keep fewer, see ``request_kv_bytes``). Mamba
    layers keep no per-token KV (their per-sequence state: ``mamba_state_bytes``)."""
    return model.attention_layers * layer_kv_bytes_per_token(
        model, kv_cache_dtype, tensor_parallel, model_dtype=model_dtype
    )


def page_size_bytes(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    block_size: int,
    *,
    model_dtype: str = "bfloat16",
) -> int:
    """Bytes of one block (``block_size`` tokens) across all layers on one GPU."""
    if block_size < 1:
        raise InvalidInput("block_size", block_size, "must be a positive number of tokens")
    return block_size * kv_bytes_per_token(
        model, kv_cache_dtype, tensor_parallel, model_dtype=model_dtype
    )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# vLLM keeps two batches in flight with async scheduling (VllmConfig.max_concurrent_batches),
# and sliding-window/chunked layers free blocks on the processed-token basis, so a request
# transiently holds the window plus two batches' tokens.
MAX_CONCURRENT_BATCHES = 2


@dataclass(frozen=True, slots=True)
class GroupBlocks:
    """Blocks one request holds in the layers of one attention kind."""

    kind: AttentionKind
    num_layers: int
    blocks: int


def blocks_per_request(
    model: ModelArchitecture,
    context_tokens: int,
    block_size: int,
    max_num_batched_tokens: int,
    max_model_len: int,
) -> tuple[GroupBlocks, ...]:
    """Blocks a request of ``context_tokens`` holds, per layer group.

    Full and MLA layers hold every token: ``cdiv(context, block_size)``. Sliding-window
    layers hold at most ``cdiv(min(window - 1 + in_flight, max_model_len), block_size) + 1``
    (``SlidingWindowSpec.max_admission_blocks_per_request``: +1 because the window need not
    start at a block boundary); chunked layers at most
    ``cdiv(min(chunk + in_flight, max_model_len), block_size)``, with
    ``in_flight = 2 * max_num_batched_tokens``.
    """
    in_flight = MAX_CONCURRENT_BATCHES * max_num_batched_tokens
    ctx = min(context_tokens, max_model_len)
    out: list[GroupBlocks] = []
    for group in model.layer_groups:
        full = cdiv(ctx, block_size)
        if group.kind == "sliding_window" and group.window_tokens is not None:
            cap = cdiv(min(group.window_tokens - 1 + in_flight, max_model_len), block_size) + 1
            blocks = min(full, cap)
        elif group.kind == "chunked" and group.window_tokens is not None:
            cap = cdiv(min(group.window_tokens + in_flight, max_model_len), block_size)
            blocks = min(full, cap)
        elif group.kind == "mamba":
            # One state block per sequence (``MambaSpec.max_memory_usage_bytes`` with
            # mamba_cache_mode "none" and no speculative tokens).
            blocks = 1
        else:
            blocks = full
        out.append(GroupBlocks(group.kind, group.num_layers, blocks))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CacheGroup:
    """vLLM's KV-cache groups of one attention kind (``_get_kv_cache_groups_uniform_page_size``):
    ``count`` groups of ``layers_per_group`` layers; all groups draw block ids from one pool,
    and a block is ``layers_per_group`` layers' pages. ``padding_layers`` are allocated but
    unused (Gemma 3: 52 sliding layers in 6 groups of 10)."""

    kind: AttentionKind
    window_tokens: int | None
    layers_per_group: int
    count: int
    padding_layers: int


def kv_cache_groups(model: ModelArchitecture) -> tuple[CacheGroup, ...]:
    """How vLLM groups a model's attention layers. One kind: one group of every layer. Several
    kinds: the group size is the smallest kind's layer count (the "1" of an n:1 pattern), or
    the largest when the counts are within 1.5x of each other; every kind is split into
    groups of that size, the last padded."""
    return _groups_of(model.layer_groups)


@lru_cache(maxsize=256)
def _groups_of(groups: tuple[LayerGroup, ...]) -> tuple[CacheGroup, ...]:
    if len(groups) == 1:
        g = groups[0]
        return (CacheGroup(g.kind, g.window_tokens, g.num_layers, 1, 0),)
    counts = [g.num_layers for g in groups]
    size = min(counts)
    if max(counts) < size * 1.5:
        size = max(counts)
    out = []
    for g in groups:
        count = cdiv(g.num_layers, size)
        out.append(CacheGroup(g.kind, g.window_tokens, size, count, count * size - g.num_layers))
    return tuple(out)


def block_bytes(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    block_size: int,
    *,
    model_dtype: str = "bfloat16",
) -> int:
    """Bytes of one block of vLLM's shared pool on one GPU: ``block_size`` tokens of one
    group's layers (``_get_kv_cache_bytes_per_block``). Equals ``page_size_bytes`` for
    models with one attention kind."""
    if block_size < 1:
        raise InvalidInput("block_size", block_size, "must be a positive number of tokens")
    per_layer = layer_kv_bytes_per_token(
        model, kv_cache_dtype, tensor_parallel, model_dtype=model_dtype)
    block_size = hybrid_block_size(
        model, kv_cache_dtype, tensor_parallel, block_size, model_dtype=model_dtype)
    return kv_cache_groups(model)[0].layers_per_group * block_size * per_layer


def mamba_state_bytes(
    model: ModelArchitecture, tensor_parallel: int, *, model_dtype: str = "bfloat16"
) -> int:
    """One sequence's state in one Mamba layer on one GPU, unpadded (0 without Mamba)."""
    if model.mamba is None:
        return 0
    return state_bytes(model.mamba, tensor_parallel, model_dtype)


def hybrid_block_size(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    block_size: int,
    *,
    model_dtype: str = "bfloat16",
) -> int:
    """The attention block size vLLM 0.33 runs with: ``block_size`` itself, or on a hybrid
    Mamba model the smallest kernel-aligned size whose one-layer page holds a Mamba state
    (``Platform._align_hybrid_block_size``; the Mamba page is padded up to that page)."""
    if model.mamba is None:
        return block_size
    per_layer = layer_kv_bytes_per_token(
        model, kv_cache_dtype, tensor_parallel, model_dtype=model_dtype)
    return aligned_block_size(
        block_size, mamba_state_bytes(model, tensor_parallel, model_dtype=model_dtype),
        per_layer)


def num_gpu_blocks(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    block_size: int,
    kv_budget_bytes: int,
    *,
    model_dtype: str = "bfloat16",
) -> int:
    """vLLM's num_gpu_blocks for a KV budget: the budget over one block of the shared pool
    (``get_kv_cache_config_from_groups``)."""
    return max(0, kv_budget_bytes) // block_bytes(
        model, kv_cache_dtype, tensor_parallel, block_size, model_dtype=model_dtype)


def kv_cache_tokens(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    block_size: int,
    kv_budget_bytes: int,
    max_num_seqs: int,
    *,
    model_dtype: str = "bfloat16",
) -> int:
    """Tokens of attention KV the pool holds when ``max_num_seqs`` sequences run: the
    Mamba groups take one block per sequence each, the null block is never handed out, and
    every attention group takes a block per ``block_size`` tokens of a sequence."""
    blocks = num_gpu_blocks(model, kv_cache_dtype, tensor_parallel, block_size,
                            kv_budget_bytes, model_dtype=model_dtype)
    groups = kv_cache_groups(model)
    mamba_groups = sum(g.count for g in groups if g.kind == "mamba")
    attention_groups = sum(g.count for g in groups if g.kind != "mamba")
    left = max(0, blocks - 1 - max_num_seqs * mamba_groups)
    size = hybrid_block_size(model, kv_cache_dtype, tensor_parallel, block_size,
                             model_dtype=model_dtype)
    return left // max(1, attention_groups) * size


def request_blocks(
    model: ModelArchitecture,
    context_tokens: int,
    block_size: int,
    max_num_batched_tokens: int,
    max_model_len: int,
) -> int:
    """Blocks one request takes from vLLM's shared pool: each group's block table, summed
    (``get_max_concurrency_for_kv_cache_config``)."""
    per_kind = {
        g.kind: g.blocks
        for g in blocks_per_request(
            model, context_tokens, block_size, max_num_batched_tokens, max_model_len)
    }
    return sum(g.count * per_kind[g.kind] for g in kv_cache_groups(model))


def request_kv_bytes(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    block_size: int,
    context_tokens: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    *,
    model_dtype: str = "bfloat16",
) -> int:
    """Bytes one request of ``context_tokens`` holds on one GPU, in whole blocks of vLLM's
    pool, with the sliding-window and chunked caps (and vLLM's group padding)."""
    size = hybrid_block_size(model, kv_cache_dtype, tensor_parallel, block_size,
                             model_dtype=model_dtype)
    return request_blocks(
        model, context_tokens, size, max_num_batched_tokens, max_model_len
    ) * block_bytes(model, kv_cache_dtype, tensor_parallel, size, model_dtype=model_dtype)


def effective_kv_bytes_per_token(
    model: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel: int,
    block_size: int,
    context_tokens: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    *,
    model_dtype: str = "bfloat16",
) -> float:
    """Average bytes per context token for a request of this length (below
    ``kv_bytes_per_token`` for models with sliding-window or chunked layers)."""
    if context_tokens <= 0:
        return float(kv_bytes_per_token(model, kv_cache_dtype, tensor_parallel,
                                        model_dtype=model_dtype))
    return request_kv_bytes(
        model, kv_cache_dtype, tensor_parallel, block_size, context_tokens,
        max_num_batched_tokens, max_model_len, model_dtype=model_dtype,
    ) / context_tokens
