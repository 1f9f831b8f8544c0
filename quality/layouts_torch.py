"""The same KV round trips as ``quality.layouts``, in torch on the model's device.

``layouts`` (numpy) is the reference, tested bit for bit against vLLM's own kernels; these are
the fast path the measurement uses (a GPU keeps K and V where they are: the numpy path costs
seconds per layer for an 8B model's 2,048-token prompt), tested bit for bit against the numpy
reference (``tests/quality/test_quality_layouts_torch.py``). Same float32 operations in the
same order; fp8 rounding through torch's own float8 types after clamping (saturation).
"""

from __future__ import annotations

from typing import Any

from kvtune.quality.hadamard import largest_power_of_2_divisor, rht_signs

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
_MIN_SCALE = 1e-6


def _f32(value: float, like: Any) -> Any:
    import torch

    return torch.tensor(value, dtype=torch.float32, device=like.device)


def as_activation_dtype(x: Any, activation_dtype: str) -> Any:
    import torch

    if activation_dtype == "float32":
        return x.float()
    return x.to(getattr(torch, activation_dtype)).float()


def fp8_per_tensor(x: Any, scale: Any, e5m2: bool = False) -> Any:
    """``x / scale`` saturated and rounded to fp8, times ``scale`` (scale: a number or one
    per KV head for ``[tokens, heads, dim]``)."""
    import torch

    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if s.ndim == 1:
        s = s[None, :, None]
    top = E5M2_MAX if e5m2 else E4M3_MAX
    dtype = torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn
    return (x.float() / s).clamp(-top, top).to(dtype).float() * s


def per_token_head(x: Any, kind: str) -> Any:
    """``_reshape_cache_per_token_head`` then code × scale."""
    import torch

    x = x.float()
    qmax, qmin = (127.0, -128.0) if kind == "int8" else (E4M3_MAX, -E4M3_MAX)
    scale = torch.clamp_min(x.abs().amax(dim=-1) / _f32(qmax, x), _MIN_SCALE)
    inv = _f32(1.0, x) / scale
    q = x * inv[..., None]
    if kind == "int8":
        # The int8 store truncates toward zero (and has no -0).
        q = torch.where(q >= 0, q + 0.5, q - 0.5).clamp(qmin, qmax).to(torch.int8).float()
    else:
        q = q.clamp(qmin, qmax).to(torch.float8_e4m3fn).float()
    return q * scale[..., None]


def single_rht(x: Any, inverse: bool = False) -> Any:
    """vLLM's ``single_rht`` (its CPU butterfly) in float32."""
    import torch

    x = x.float()
    d = x.shape[-1]
    block = largest_power_of_2_divisor(d)
    if block < d:
        lead = x.shape[:-1]
        return single_rht(x.reshape(*lead, d // block, block), inverse).reshape(*lead, d)
    signs = torch.tensor(rht_signs(d), dtype=torch.float32, device=x.device)
    y = x if inverse else x * signs
    h = 1
    while h < d:
        v = y.reshape(*y.shape[:-1], d // (2 * h), 2, h)
        y = torch.stack([v[..., 0, :] + v[..., 1, :], v[..., 0, :] - v[..., 1, :]],
                        dim=-2).reshape(y.shape)
        h <<= 1
    return y * signs if inverse else y


def _round_half_away(t: Any) -> Any:
    import torch

    return torch.where(t >= 0, (t + 0.5).trunc(), (t - 0.5).trunc())


def int4_per_token_head(x: Any, activation_dtype: str) -> Any:
    """Rotate, store as ``_reshape_cache_int4_kernel`` does, read back with the masked scale,
    rotate back (``D₁ ⊙ H(·) / b``)."""
    import torch

    r = as_activation_dtype(single_rht(x), activation_dtype)
    lo, hi = r.amin(dim=-1), r.amax(dim=-1)
    scale = torch.clamp_min((hi - lo) / _f32(15.0, r), _MIN_SCALE)
    zp = _round_half_away(-lo / scale).clamp(0.0, 15.0)
    inv = _f32(1.0, r) / scale
    codes = _round_half_away(r * inv[..., None] + zp[..., None]).clamp(0.0, 15.0)
    masked = (scale.view(torch.int32) & -16).view(torch.float32)
    back = (codes - zp[..., None]) * masked[..., None]
    b = largest_power_of_2_divisor(x.shape[-1])
    return single_rht(back, inverse=True) / _f32(float(b), back)


def _e2m1(v: Any) -> Any:
    """FlashInfer's ``nvfp4_append_quantize_e2m1`` thresholds, as values."""
    import torch

    mag = v.abs()
    out = torch.full_like(mag, 6.0)
    for bound, value, inclusive in ((5.0, 4.0, True), (3.5, 3.0, False), (2.5, 2.0, True),
                                    (1.75, 1.5, False), (1.25, 1.0, True), (0.75, 0.5, False)):
        out = torch.where(mag <= bound if inclusive else mag < bound, value, out)
    out = torch.where(~(mag > 0.25), 0.0, out)
    return torch.where(torch.signbit(v), -out, out)


def nvfp4(x: Any, global_scale: float = 1.0) -> Any:
    import torch

    x = x.float()
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    g = _f32(global_scale, x)
    amax = blocks.abs().amax(dim=-1)
    sf = torch.where(amax > 0, amax / (_f32(6.0, x) * g), _f32(0.0, x))
    sf = sf.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float()
    out_scale = torch.where((amax > 0) & (sf > 0), _f32(1.0, x) / (sf * g), _f32(0.0, x))
    values = _e2m1(blocks * out_scale[..., None])
    return (values * (sf * g)[..., None]).reshape(x.shape)


def roundtrip(dtype: str, x: Any, scale: Any, activation_dtype: str) -> Any:
    """What attention reads back for one side ``[tokens, heads, dim]`` (float32)."""
    if dtype in ("fp8", "fp8_e4m3"):
        return fp8_per_tensor(x, scale)
    if dtype == "fp8_e5m2":
        return fp8_per_tensor(x, scale, e5m2=True)
    if dtype == "fp8_per_token_head":
        return per_token_head(x, "fp8")
    if dtype == "int8_per_token_head":
        return per_token_head(x, "int8")
    if dtype == "int4_per_token_head":
        return int4_per_token_head(x, activation_dtype)
    if dtype == "nvfp4":
        import torch

        return nvfp4(x, float(torch.as_tensor(scale).max()))
    raise ValueError(f"no torch layout for {dtype!r}")
