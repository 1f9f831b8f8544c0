"""The torch fast path of the KV round trips equals the numpy reference (``layouts``, itself
tested against vLLM's kernels) bit for bit, on random heads with outliers, zero heads and
tiny values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtune.quality import layouts, layouts_torch


def _heads(seed: int, dim: int = 128) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((24, 4, dim)).astype(np.float32) * np.float32(10 ** rng.uniform(-3, 1))
    x[:, :, 5] *= 40.0  # an outlier channel
    x[0, 0] = 0.0  # a zero head: the 1e-6 scale floor
    x[1, 1] *= 1e-4  # tiny values: subnormal fp8 codes, tiny nvfp4 block scales
    return layouts.as_activation_dtype(x, "bfloat16")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dtype", [d for d in layouts.LAYOUTS])
def test_torch_path_equals_numpy_reference(seed: int, dtype: str) -> None:
    x = _heads(seed, dim=96 if dtype == "int4_per_token_head" and seed == 2 else 128)
    scale = 1.0 if seed == 0 else 0.37
    expected = layouts.layout(dtype).roundtrip(x, scale, "bfloat16")
    got = layouts_torch.roundtrip(dtype, torch.from_numpy(x), scale, "bfloat16").numpy()
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), (
        dtype, int((got != expected).sum()))


def test_per_head_scales() -> None:
    x = _heads(7)
    scales = np.array([0.5, 1.0, 2.0, 0.01], np.float32)
    expected = layouts.fp8_per_tensor_roundtrip(x, scales)
    got = layouts_torch.fp8_per_tensor(torch.from_numpy(x), torch.from_numpy(scales)).numpy()
    assert np.array_equal(got, expected)
