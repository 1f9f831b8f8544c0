"""Small floating-point formats as vLLM's KV caches store them: fp8 e4m3fn, fp8 e5m2, fp4 e2m1.

Round to nearest, ties to even, as every conversion on vLLM's cache-write paths does
(``__nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...)`` in its CUDA kernels, Triton's
``cvt.rn.satfinite`` store in ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py``
(line 144-153), FlashInfer's ``__nv_fp8_e4m3(float)`` for NVFP4 block scales).
"Satfinite": a magnitude beyond the largest finite value is stored as that value, not as
NaN/inf. torch's own ``.to(torch.float8_e4m3fn)`` rounds the same way (the tests compare
every code and 100,000 values bit for bit); its overflow behaviour has varied between torch
versions, so the tests clamp to ±448 before asking torch where it matters.

Pure numpy, exact: scaling by powers of two and ``np.rint`` (ties to even) in float64 never
round twice for inputs that are float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Floats = NDArray[np.float64]


@dataclass(frozen=True)
class Minifloat:
    """A sign-exponent-mantissa format without infinities in its finite range."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_finite: float

    @property
    def min_normal(self) -> float:
        return float(2.0 ** (1 - self.bias))

    def round(self, x: NDArray[np.floating]) -> Floats:
        """The representable value nearest to each x (ties to even), saturated at
        ±max_finite; NaN stays NaN. The sign of zero is kept (-0.0 stays -0.0)."""
        x64 = np.asarray(x, dtype=np.float64)
        mag = np.abs(x64)
        with np.errstate(divide="ignore", invalid="ignore"):
            _, exp2 = np.frexp(mag)  # mag = m * 2**exp2, m in [0.5, 1)
        # The binade's exponent, never below the normal range's (subnormals share its step).
        binade = np.maximum(exp2.astype(np.int64) - 1, 1 - self.bias)
        step = np.ldexp(1.0, binade - self.mantissa_bits)
        rounded = np.rint(mag / step) * step
        rounded = np.minimum(rounded, self.max_finite)
        out = np.copysign(rounded, x64)
        return np.where(np.isnan(x64), np.nan, out)

    def encode(self, x: NDArray[np.floating]) -> NDArray[np.uint8]:
        """The format's bit pattern (as torch's ``.view(torch.uint8)`` shows it) of
        ``round(x)``; NaN is the all-ones pattern."""
        value = self.round(x)
        mag = np.abs(value)
        sign = np.signbit(value).astype(np.uint16) << (self.exponent_bits + self.mantissa_bits)
        normal = mag >= self.min_normal
        with np.errstate(divide="ignore", invalid="ignore"):
            _, exp2 = np.frexp(np.where(normal, mag, 1.0))
        exponent = np.where(normal, exp2.astype(np.int64) - 1 + self.bias, 0)
        unit = np.ldexp(1.0, np.where(normal, exp2.astype(np.int64) - 1, 1 - self.bias)
                        - self.mantissa_bits)
        mantissa = np.rint(mag / unit).astype(np.int64)
        mantissa = np.where(normal, mantissa - (1 << self.mantissa_bits), mantissa)
        bits = sign | (exponent.astype(np.uint16) << self.mantissa_bits) | mantissa.astype(
            np.uint16)
        nan_bits = (1 << (1 + self.exponent_bits + self.mantissa_bits)) - 1
        bits = np.where(np.isnan(value), nan_bits, bits)
        return bits.astype(np.uint8)

    def decode(self, bits: NDArray[np.integer]) -> Floats:
        """Values of bit patterns (NaN for the format's NaN patterns)."""
        b = np.asarray(bits).astype(np.int64)
        width = self.exponent_bits + self.mantissa_bits
        sign = np.where((b >> width) & 1, -1.0, 1.0)
        exponent = (b >> self.mantissa_bits) & ((1 << self.exponent_bits) - 1)
        mantissa = b & ((1 << self.mantissa_bits) - 1)
        normal = exponent > 0
        frac = np.where(normal, 1.0 + mantissa / (1 << self.mantissa_bits),
                        mantissa / (1 << self.mantissa_bits))
        value = sign * frac * np.ldexp(1.0, np.where(normal, exponent, 1) - self.bias)
        return np.where(self.is_nan_bits(b), np.nan, value)

    def is_nan_bits(self, bits: NDArray[np.int64]) -> NDArray[np.bool_]:
        width = self.exponent_bits + self.mantissa_bits
        low = bits & ((1 << width) - 1)
        if self.name == "e4m3fn":  # only S.1111.111 is NaN: e4m3fn trades inf for range
            return np.asarray(low == (1 << width) - 1)
        if self.name == "e5m2":  # IEEE-like: exponent all ones is inf or NaN
            exp_all_ones = ((1 << self.exponent_bits) - 1) << self.mantissa_bits
            return np.asarray(((low & exp_all_ones) == exp_all_ones) & ((low & 3) != 0))
        return np.zeros(np.shape(bits), dtype=bool)


# torch.finfo(torch.float8_e4m3fn).max == 448; vLLM's FP8_MAX on CUDA (quant_utils.get_fp8_min_max).
E4M3 = Minifloat("e4m3fn", exponent_bits=4, mantissa_bits=3, bias=7, max_finite=448.0)
# torch.finfo(torch.float8_e5m2).max == 57344.
E5M2 = Minifloat("e5m2", exponent_bits=5, mantissa_bits=2, bias=15, max_finite=57344.0)
# NVFP4's element type: values 0, 0.5, 1, 1.5, 2, 3, 4, 6 (no NaN, no inf).
E2M1 = Minifloat("e2m1", exponent_bits=2, mantissa_bits=1, bias=1, max_finite=6.0)
