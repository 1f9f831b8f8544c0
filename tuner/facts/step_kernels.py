"""Measured kernel times per GPU class (``data/step_kernels.json``), for the step-time model.

The facts are derived by ``bench/derive_step_kernels.py`` from NVIDIA's measured-kernel
database for vLLM (``aiconfigurator-core`` 0.12.0, Apache-2.0; vLLM 0.14-0.24 kernels): dense
linear layers' seconds per weight at M tokens, the attention kernels' fixed, per-sequence and
per-byte costs and prefill rate by context, and vLLM's custom all-reduce by message size and
TP size. A GPU class without them (H100-NVL, L4, ...) falls back to ``efficiency.json``'s
roofline fractions (``roofline_kernels`` in the simulator) and ``FALLBACK_ALL_REDUCE_SECONDS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

from kvtune.tuner.facts import data_files

# One all-reduce's time where the class has no measured table: about 8 us on NVLink (the
# measured H100/H200 graphs take 4-9 us up to 1 MiB).
FALLBACK_ALL_REDUCE_SECONDS = 8e-6
# Activations travel in 16 bits (BF16/FP16) between TP ranks.
ACTIVATION_BYTES = 2
# The message sizes of ``all_reduce_seconds``: 2^7 .. 2^29 bytes.
MESSAGE_FIRST_EXPONENT = 7
MESSAGE_POINTS = 23


@dataclass(frozen=True, slots=True)
class GPUKernels:
    """One GPU class's measured facts (``step_kernels.json``, units in the names)."""

    gpu_class: str
    # A GEMM of N x K weights at M = 1, 2, 4, ... tokens takes
    # ``seconds_per_gemm[i] + seconds_per_param[i] x N K``; per weight dtype ("bf16", "fp8").
    linear: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]
    attention_fixed_seconds_per_layer: float
    attention_seconds_per_seq_per_layer: float
    kv_bandwidth_efficiency: float
    # Fraction of the dense BF16 rate of prefill attention at 1, 2, 4, ... context tokens
    # per query token.
    prefill_bf16_efficiency_by_context: tuple[float, ...]
    # TP size -> seconds at 2^7, 2^8, ... bytes.
    all_reduce_seconds: dict[int, tuple[float, ...]]

    def linear_seconds(self, weight_bits: int, gemms: float, params: float
                       ) -> tuple[float, ...]:
        """``gemms`` GEMMs holding ``params`` weights of ``weight_bits`` bits: their seconds
        at M = 1, 2, 4, ... tokens. BF16 and FP8 are measured; other widths (int4; FP8 where
        the class has no FP8 table) are BF16's, with the weight-read part at M = 1 scaled to
        their bytes where that is larger (an assumption, not a measurement)."""
        name = {16: "bf16", 8: "fp8"}.get(weight_bits)
        if name is not None and name in self.linear:
            per_gemm, per_param = self.linear[name]
            return tuple(gemms * c + params * s for c, s in zip(per_gemm, per_param,
                                                                strict=True))
        per_gemm, per_param = self.linear["bf16"]
        floor = gemms * per_gemm[0] + params * per_param[0] * min(16, weight_bits) / 16
        return tuple(max(floor, gemms * c + params * s)
                     for c, s in zip(per_gemm, per_param, strict=True))


@cache
def _table() -> dict[str, Any]:
    table: dict[str, Any] = data_files.read_json("data", "step_kernels.json")
    return table


def source() -> str:
    """Where the facts come from (package, version, license)."""
    t = _table()
    return f"{t['source']}; {t['license']}"


@cache
def gpu_kernels(gpu_class: str) -> GPUKernels | None:
    """The measured facts of ``gpu_class``; None where the database has none."""
    row = _table()["gpu_classes"].get(gpu_class)
    if row is None:
        return None
    attn = row["attention"]
    return GPUKernels(
        gpu_class=gpu_class,
        linear={k: (tuple(v["seconds_per_gemm"]), tuple(v["seconds_per_param"]))
                for k, v in row["linear"].items()},
        attention_fixed_seconds_per_layer=float(attn["fixed_seconds_per_layer"]),
        attention_seconds_per_seq_per_layer=float(attn["seconds_per_seq_per_layer"]),
        kv_bandwidth_efficiency=float(attn["kv_bandwidth_efficiency"]),
        prefill_bf16_efficiency_by_context=tuple(attn["prefill_bf16_efficiency_by_context"]),
        all_reduce_seconds={int(k): tuple(v) for k, v in
                            row.get("all_reduce_seconds", {}).items()},
    )


def all_reduce_table(gpu_class: str, tensor_parallel: int) -> tuple[float, ...]:
    """One all-reduce's seconds at 2^7, 2^8, ... bytes among ``tensor_parallel`` GPUs of the
    class (the nearest measured TP size at or above it); the fallback constant where none."""
    kernels = gpu_kernels(gpu_class)
    if kernels is not None and kernels.all_reduce_seconds:
        sizes = sorted(kernels.all_reduce_seconds)
        tp = next((s for s in sizes if s >= tensor_parallel), sizes[-1])
        return kernels.all_reduce_seconds[tp]
    return (FALLBACK_ALL_REDUCE_SECONDS,) * MESSAGE_POINTS


def interp_pow2(table: tuple[float, ...], x: float, first_exponent: int = 0,
                proportional_beyond: bool = True) -> float:
    """``table[i]`` is the value at ``2 ** (first_exponent + i)``; linear between points,
    the first value below them, beyond the last proportional to ``x`` (times that scale
    with size: GEMMs past M = 32768, messages past 512 MiB) or the last value."""
    mant, exp = math.frexp(x)  # x = mant * 2**exp, 0.5 <= mant < 1
    i = exp - 1 - first_exponent
    if i < 0:
        return table[0]
    last = len(table) - 1
    if i >= last:
        if proportional_beyond:
            return table[last] * x / 2.0 ** (first_exponent + last)
        return table[last]
    lo = table[i]
    return lo + (table[i + 1] - lo) * (2.0 * mant - 1.0)
