"""How vLLM 0.33.0 stores K and V for each quantized ``--kv-cache-dtype``, in numpy.

Every function takes one side (K or V) of the cache as float32 ``[tokens, kv_heads, head_size]``
— the values the model computed, already rounded to its activation dtype — and returns what
vLLM's cache-write kernel stores (codes and scales), or what the attention kernel reads back
(``roundtrip``). Sources, in the pinned wheel (``~/.cache/kvtune/vllm-src-0.33.0``):

- ``fp8`` / ``fp8_e4m3`` / ``fp8_e5m2`` (per tensor): ``x / k_scale`` stored as fp8 with
  saturation (``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py`` lines 123-142; the
  CUDA ``reshape_and_cache_flash`` does the same, compiled). ``k_scale``/``v_scale`` come from
  the checkpoint or are 1.0 (``vllm/model_executor/layers/quantization/kv_cache.py`` lines
  117-169; ``layers/attention/attention.py`` ``set_default_quant_scales``, line 133). Backends
  that take a quantized query (FlashAttention 3 on Hopper, FlashInfer) also store Q in fp8
  with ``q_scale`` (``attention.py`` lines 470-526; ``kv_cache.py`` line 147: k_scale when the
  checkpoint has no q_scale).
- ``int8_per_token_head`` / ``fp8_per_token_head``: one fp32 scale per (token, head) =
  ``max(absmax / QMAX, 1e-6)``, codes ``x * (1 / scale)``, for int8 rounded half away from
  zero and clamped to [-128, 127], for fp8 clamped to ±448 and stored as e4m3
  (``triton_reshape_and_cache_flash.py`` lines 168-283).
- ``int4_per_token_head``: the randomized Hadamard transform first (``quality.hadamard``),
  then asymmetric 4-bit codes with a zero point hidden in the scale's low 4 mantissa bits,
  two codes per byte (``vllm/v1/attention/ops/int4_per_token_head.py`` lines 64-256 and
  1006-1023); the reader masks those bits off (lines 550-555 of the same file).
- ``nvfp4`` (Blackwell): blocks of 16 along the head, an e4m3 block scale
  ``amax / (6 * global)`` with the global scale k_scale/v_scale, e2m1 codes of
  ``x / (block_scale * global)``, two per byte — FlashInfer 0.7.2's
  ``nvfp4_append_quantize_block`` (``include/flashinfer/page.cuh`` lines 287-346), which vLLM
  calls from ``vllm/v1/attention/backends/flashinfer.py`` line 2824.

Arithmetic is IEEE float32, operation by operation as the kernels are written. Where Triton
contracts a multiply and an add into one FMA on a GPU (its default), a code can differ by one
step in rare ties; the tests pin this sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvtune.quality.hadamard import largest_power_of_2_divisor, single_rht
from kvtune.quality.minifloat import E2M1, E4M3, E5M2, Minifloat

F32 = NDArray[np.float32]
_F = np.float32


def as_activation_dtype(x: NDArray[np.floating], activation_dtype: str) -> F32:
    """Round float32 values to the model's activation dtype and back (what a ``.to(dtype)``
    does): bfloat16 by rounding the float32 bit pattern to its top 16 bits, ties to even."""
    x32 = np.asarray(x, dtype=np.float32)
    if activation_dtype == "float32":
        return x32
    if activation_dtype == "float16":
        return x32.astype(np.float16).astype(np.float32)
    if activation_dtype == "bfloat16":
        bits = x32.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = rounded.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x32), x32, out)
    raise ValueError(f"activation dtype {activation_dtype!r}: use bfloat16, float16 or float32")


# --- per-tensor fp8 ---------------------------------------------------------------------------


def fp8_per_tensor_codes(x: F32, scale: float | F32, fmt: Minifloat = E4M3) -> NDArray[np.uint8]:
    """The fp8 bytes vLLM stores: ``x / scale`` (fp32), saturated, rounded to ``fmt``.
    ``scale`` is a scalar or one value per KV head (compressed-tensors' ``attn_head``)."""
    s = np.asarray(scale, dtype=np.float32)
    if s.ndim == 1:
        s = s[None, :, None]
    return fmt.encode((np.asarray(x, np.float32) / s).astype(np.float32))


def fp8_per_tensor_roundtrip(x: F32, scale: float | F32, fmt: Minifloat = E4M3) -> F32:
    s = np.asarray(scale, dtype=np.float32)
    if s.ndim == 1:
        s = s[None, :, None]
    return (fmt.decode(fp8_per_tensor_codes(x, scale, fmt)).astype(np.float32) * s).astype(
        np.float32)


# --- per-token-head int8 / fp8 -----------------------------------------------------------------

_MIN_SCALE = _F(1e-6)  # tl.maximum(absmax / QUANT_MAX, 1e-6)


@dataclass(frozen=True)
class PerTokenHead:
    codes: NDArray[np.int8] | NDArray[np.uint8]  # [tokens, heads, head_size]
    scales: F32  # [tokens, heads], fp32


def per_token_head_store(x: F32, kind: str) -> PerTokenHead:
    """``_reshape_cache_per_token_head`` for one side: ``kind`` is ``int8`` or ``fp8``."""
    x32 = np.asarray(x, dtype=np.float32)
    qmax, qmin = (_F(127.0), _F(-128.0)) if kind == "int8" else (_F(448.0), _F(-448.0))
    absmax = np.max(np.abs(x32), axis=-1)
    scale = np.maximum(absmax / qmax, _MIN_SCALE).astype(np.float32)
    inv = (_F(1.0) / scale).astype(np.float32)
    q = (x32 * inv[..., None]).astype(np.float32)
    if kind == "int8":
        # Round half away from zero, then the int8 store truncates toward zero.
        q = np.where(q >= 0, q + _F(0.5), q - _F(0.5)).astype(np.float32)
        q = np.clip(q, qmin, qmax)
        return PerTokenHead(np.trunc(q).astype(np.int8), scale)
    q = np.clip(q, qmin, qmax)
    return PerTokenHead(E4M3.encode(q), scale)


def per_token_head_roundtrip(x: F32, kind: str) -> F32:
    """What the Triton attention kernel computes with: code × the (token, head) scale."""
    stored = per_token_head_store(x, kind)
    values = (stored.codes.astype(np.float32) if kind == "int8"
              else E4M3.decode(stored.codes).astype(np.float32))
    return (values * stored.scales[..., None]).astype(np.float32)


# --- int4 per-token-head -----------------------------------------------------------------------


@dataclass(frozen=True)
class Int4PerTokenHead:
    packed: NDArray[np.uint8]  # [tokens, heads, head_size / 2]: even dim low nibble, odd high
    scales: F32  # [tokens, heads]: fp32 scale, zero point in its low 4 mantissa bits


def _round_half_away_to_int(t: F32) -> F32:
    """``tl.where(t >= 0, (t + 0.5).to(int32), (t - 0.5).to(int32))`` as float32."""
    return np.where(t >= 0, np.trunc((t + _F(0.5)).astype(np.float32)),
                    np.trunc((t - _F(0.5)).astype(np.float32))).astype(np.float32)


def int4_rotate(x: F32, activation_dtype: str) -> F32:
    """``single_rht(key.float()).to(key.dtype)``: rotated, then rounded to the model dtype."""
    return as_activation_dtype(single_rht(np.asarray(x, np.float32)), activation_dtype)


def int4_store(x: F32, activation_dtype: str = "bfloat16") -> Int4PerTokenHead:
    """``reshape_and_cache_int4``: rotate, then ``_reshape_cache_int4_kernel`` per (token,
    head)."""
    r = int4_rotate(x, activation_dtype)
    lo, hi = np.min(r, axis=-1), np.max(r, axis=-1)
    scale = np.maximum(((hi - lo).astype(np.float32) / _F(15.0)).astype(np.float32),
                       _MIN_SCALE).astype(np.float32)
    zp = np.clip(_round_half_away_to_int((-lo / scale).astype(np.float32)), 0.0, 15.0)
    inv = (_F(1.0) / scale).astype(np.float32)
    s = ((r * inv[..., None]).astype(np.float32) + zp[..., None]).astype(np.float32)
    q = np.clip(_round_half_away_to_int(s), 0.0, 15.0).astype(np.uint8)
    packed = (q[..., 0::2] & 0xF) | ((q[..., 1::2] & 0xF) << 4)
    bits = scale.view(np.uint32)
    scale_packed = ((bits & np.uint32(0xFFFFFFF0)) | (zp.astype(np.uint32) & 0xF)).view(
        np.float32)
    return Int4PerTokenHead(packed.astype(np.uint8), scale_packed)


def int4_dequantize_rotated(stored: Int4PerTokenHead) -> F32:
    """The rotated values the int4 attention kernel works with: ``(code - zp) × scale`` with
    the zero point's bits masked off the scale (``ks_bits & -16``)."""
    bits = stored.scales.view(np.uint32)
    zp = (bits & 0xF).astype(np.float32)
    scale = (bits & np.uint32(0xFFFFFFF0)).view(np.float32)
    codes = np.empty((*stored.packed.shape[:-1], stored.packed.shape[-1] * 2), np.float32)
    codes[..., 0::2] = stored.packed & 0xF
    codes[..., 1::2] = stored.packed >> 4
    return ((codes - zp[..., None]) * scale[..., None]).astype(np.float32)


def int4_roundtrip(x: F32, activation_dtype: str = "bfloat16") -> F32:
    """K or V as attention effectively sees them: vLLM rotates Q the same way and divides
    the scores by b, and rotates the output back (``D₁ ⊙ H(·) / b``); that equals attention
    over these un-rotated values."""
    rotated = int4_dequantize_rotated(int4_store(x, activation_dtype))
    b = largest_power_of_2_divisor(rotated.shape[-1])
    return (single_rht(rotated, inverse=True) / _F(b)).astype(np.float32)


# --- nvfp4 -------------------------------------------------------------------------------------

NVFP4_BLOCK = 16


@dataclass(frozen=True)
class NVFP4:
    packed: NDArray[np.uint8]  # [tokens, heads, head_size / 2]: even low nibble, odd high
    block_scales: NDArray[np.uint8]  # [tokens, heads, head_size / 16]: e4m3 bytes


def nvfp4_store(x: F32, global_scale: float = 1.0) -> NVFP4:
    """FlashInfer's ``nvfp4_append_quantize_block`` (non-precise variant) per 16 values."""
    x32 = np.asarray(x, dtype=np.float32)
    blocks = x32.reshape(*x32.shape[:-1], -1, NVFP4_BLOCK)
    g = _F(global_scale)
    amax = np.max(np.abs(blocks), axis=-1)
    sf = np.where(amax > 0, (amax / (_F(6.0) * g)).astype(np.float32), _F(0.0))
    sf_bits = E4M3.encode(sf.astype(np.float32))
    sf_rounded = E4M3.decode(sf_bits).astype(np.float32)
    with np.errstate(divide="ignore"):  # the zero-scale lanes are masked out
        out_scale = np.where((amax > 0) & (sf_rounded > 0),
                             (_F(1.0) / (sf_rounded * g).astype(np.float32)), _F(0.0))
    scaled = (blocks * out_scale[..., None].astype(np.float32)).astype(np.float32)
    codes = E2M1.encode(scaled).reshape(x32.shape)
    packed = (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)
    return NVFP4(packed.astype(np.uint8), sf_bits)


def nvfp4_roundtrip(x: F32, global_scale: float = 1.0) -> F32:
    stored = nvfp4_store(x, global_scale)
    codes = np.empty((*stored.packed.shape[:-1], stored.packed.shape[-1] * 2), np.uint8)
    codes[..., 0::2] = stored.packed & 0xF
    codes[..., 1::2] = stored.packed >> 4
    values = E2M1.decode(codes).astype(np.float32)
    blocks = values.reshape(*values.shape[:-1], -1, NVFP4_BLOCK)
    sf = E4M3.decode(stored.block_scales).astype(np.float32) * _F(global_scale)
    return (blocks * sf[..., None]).reshape(values.shape).astype(np.float32)


# --- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVLayout:
    """One ``--kv-cache-dtype`` value: how it stores a side, and whether Q is stored in fp8
    too (per-tensor fp8 on the backends that take a quantized query)."""

    dtype: str
    bits: int
    scales: str  # where the scales come from, in words
    roundtrip: Callable[[F32, float | F32, str], F32]  # (x, static scale, activation dtype)
    quantizes_query: bool = False
    needs_static_scale: bool = False
    gpu_note: str = ""


def _fp8(fmt: Minifloat) -> Callable[[F32, float | F32, str], F32]:
    return lambda x, scale, _dtype: fp8_per_tensor_roundtrip(x, scale, fmt)


LAYOUTS: dict[str, KVLayout] = {
    layout.dtype: layout
    for layout in (
        KVLayout("fp8", 8, "per tensor: the checkpoint's k_scale/v_scale, else 1.0",
                 _fp8(E4M3), quantizes_query=True, needs_static_scale=True),
        KVLayout("fp8_e4m3", 8, "per tensor: the checkpoint's k_scale/v_scale, else 1.0",
                 _fp8(E4M3), quantizes_query=True, needs_static_scale=True),
        KVLayout("fp8_e5m2", 8, "per tensor: 1.0 (vLLM refuses e5m2 with fp8 checkpoints)",
                 _fp8(E5M2), needs_static_scale=True,
                 gpu_note="not on FlashAttention (vLLM 0.33.0: no e5m2 there)"),
        KVLayout("fp8_per_token_head", 8, "dynamic, one fp32 scale per token and head",
                 lambda x, _s, _d: per_token_head_roundtrip(x, "fp8"),
                 gpu_note="TRITON_ATTN only"),
        KVLayout("int8_per_token_head", 8, "dynamic, one fp32 scale per token and head",
                 lambda x, _s, _d: per_token_head_roundtrip(x, "int8"),
                 gpu_note="TRITON_ATTN only"),
        KVLayout("int4_per_token_head", 4,
                 "dynamic, Hadamard-rotated, asymmetric: fp32 scale + zero point per token "
                 "and head", lambda x, _s, d: int4_roundtrip(x, d),
                 gpu_note="TRITON_ATTN only"),
        KVLayout("nvfp4", 4, "e4m3 scale per 16 values, global k_scale/v_scale (else 1.0)",
                 lambda x, s, _d: nvfp4_roundtrip(x, float(np.max(s))),
                 quantizes_query=True, needs_static_scale=True,
                 gpu_note="Blackwell only (FlashInfer)"),
    )
}

DEFAULT_DTYPES = ("fp8", "fp8_per_token_head", "int8_per_token_head", "int4_per_token_head")


def layout(dtype: str) -> KVLayout:
    try:
        return LAYOUTS[dtype]
    except KeyError:
        raise ValueError(
            f"--dtypes: {dtype!r} is not a KV dtype kvtune can measure; use one of "
            f"{', '.join(LAYOUTS)}") from None


def quantize_query(q: F32, q_scale: float) -> F32:
    """Q as FlashAttention 3 / FlashInfer read it with per-tensor fp8 KV: ``QuantFP8``
    static per-tensor, e4m3 with saturation."""
    return fp8_per_tensor_roundtrip(q, q_scale, E4M3)
