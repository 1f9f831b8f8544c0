"""The randomized Hadamard transform vLLM 0.33.0 applies to K and V before INT4 quantization.

From ``vllm/v1/attention/ops/int4_per_token_head.py``: ``single_rht`` (line 1146) is
``H × (D₁ ⊙ x)`` with H the unnormalized Walsh-Hadamard matrix (H Hᵀ = b·I) applied
block-diagonally over b = the largest power-of-two divisor of the head size, and D₁ a fixed
±1 sign vector (``_get_rht_signs``, line 1133: ``torch.bernoulli`` on a CPU generator seeded
with 0x9E3779B9). The inverse is ``D₁ ⊙ (H × y) / b``; vLLM divides the attention output by b
after it (``unified_attention_int4``, line 1100).

The butterfly below is vLLM's CPU path ("Tier 3", line 1115) in float32, add for add (vLLM
calls it on ``key.float()``); on a GPU vLLM uses its hadacore kernel in bf16, which rounds
differently in the last bits — before a 4-bit quantization, as its own comment says, that
loss does not matter.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.typing import NDArray

RHT_SEED = 0x9E3779B9  # _get_rht_signs(d, round_idx=0): 0x9E3779B9 + 0 * 0x517CC1B7


def largest_power_of_2_divisor(n: int) -> int:
    """``vllm.utils.math_utils.largest_power_of_2_divisor``: n & -n."""
    return n & -n


@functools.cache
def rht_signs(d: int) -> tuple[float, ...]:
    """The ±1 signs vLLM draws for a row of length d (needs torch: they come from torch's
    generator, so only torch can reproduce them; cached per d)."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(RHT_SEED)
    signs = 2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=gen) - 1.0
    return tuple(float(s) for s in signs.tolist())


def walsh_hadamard(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """Unnormalized Walsh-Hadamard transform over the last axis (a power of two): vLLM's
    ``fast_hadamard_transform`` butterfly."""
    d = x.shape[-1]
    assert d & (d - 1) == 0, f"needs a power-of-two length, got {d}"
    h = 1
    while h < d:
        v = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        x = np.stack([v[..., 0, :] + v[..., 1, :], v[..., 0, :] - v[..., 1, :]],
                     axis=-2).reshape(x.shape)
        h <<= 1
    return x


def single_rht(x: NDArray[np.floating], inverse: bool = False) -> NDArray[np.float32]:
    """vLLM's ``single_rht`` in float32: forward ``H(D₁ ⊙ x)``, inverse ``D₁ ⊙ H(x)``
    (without the division by b, as in vLLM)."""
    x64 = np.asarray(x, dtype=np.float32)
    d = x64.shape[-1]
    block = largest_power_of_2_divisor(d)
    if block < d:
        lead = x64.shape[:-1]
        return single_rht(x64.reshape(*lead, d // block, block), inverse).reshape(*lead, d)
    signs = np.asarray(rht_signs(d), dtype=np.float32)
    if inverse:
        return walsh_hadamard(x64) * signs
    return walsh_hadamard(x64 * signs)
