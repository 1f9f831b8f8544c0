"""The KV layouts against vLLM 0.33.0's own cache-write kernels (its Triton source run under
the interpreter), torch's own float8 types, and cases computed by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import vllm_kernels

from kvtune.quality import hadamard, layouts
from kvtune.quality.minifloat import E2M1, E4M3, E5M2, Minifloat

pytestmark = pytest.mark.vllm_source

ALL_CODES = np.arange(256, dtype=np.uint8)


def _kv(seed: int, tokens: int = 9, heads: int = 2, dim: int = 128, outlier: float = 0.0
        ) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(tokens, heads, dim, generator=gen) * 3.0
    key[:, :, 7] += outlier
    key[0, 0] = 0.0  # an all-zero head: the 1e-6 scale floor
    value = torch.randn(tokens, heads, dim, generator=gen) * 0.05
    return key.to(torch.bfloat16), value.to(torch.bfloat16)


PER_TENSOR_SCALES = [(1.0, 1.0), (0.37, 0.011)]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """vLLM's kernels on every case of this module, in one interpreter child process."""
    cases: dict[str, vllm_kernels.Case] = {}
    k, v = _kv(1, outlier=600.0)  # beyond 448 at scale 1.0: saturation
    for ks, vs in PER_TENSOR_SCALES:
        cases[f"per_tensor-{ks}"] = ("per_tensor_fp8_prestore", {
            "key": _np(k), "value": _np(v), "k_scale": ks, "v_scale": vs})
    k, v = _kv(2, outlier=40.0)
    cases["int8"] = ("per_token_head", {"key": _np(k), "value": _np(v), "kind": "int8"})
    k, v = _kv(3, outlier=40.0)
    cases["fp8_pth"] = ("per_token_head", {"key": _np(k), "value": _np(v), "kind": "fp8"})
    k, v = _kv(4, outlier=25.0)
    cases["int4"] = ("int4", {"key": _np(k), "value": _np(v)})
    results = vllm_kernels.run_cases(cases, Path(tmp_path_factory.mktemp("vllm-kernels")))
    results["inputs"] = {name: args for name, (_, args) in cases.items()}
    return results


# --- fp8 / fp4 formats vs torch -------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "torch_dtype"), [(E4M3, torch.float8_e4m3fn),
                                                  (E5M2, torch.float8_e5m2)])
def test_every_fp8_code_decodes_as_torch_does(fmt: Minifloat, torch_dtype: torch.dtype) -> None:
    expected = torch.from_numpy(ALL_CODES).view(torch_dtype).float().numpy().astype(np.float64)
    got = fmt.decode(ALL_CODES)
    finite = np.isfinite(expected)
    assert np.array_equal(got[finite], expected[finite])
    assert np.array_equal(np.isnan(got), np.isnan(expected))


@pytest.mark.parametrize(("fmt", "torch_dtype"), [(E4M3, torch.float8_e4m3fn),
                                                  (E5M2, torch.float8_e5m2)])
def test_fp8_encoding_matches_torch_bit_for_bit(fmt: Minifloat, torch_dtype: torch.dtype
                                                ) -> None:
    rng = np.random.default_rng(7)
    # Magnitudes from far below the subnormals to the top of the range, plus every exact
    # tie between neighbouring codes (where round-to-nearest-even decides).
    x = (rng.standard_normal(100_000) * np.exp(rng.uniform(-25, 12, 100_000))).astype(
        np.float32)
    codes = fmt.decode(ALL_CODES)
    finite = np.sort(np.unique(codes[np.isfinite(codes)]))
    ties = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)
    x = np.clip(np.concatenate([x, ties, -ties, [0.0, -0.0]]).astype(np.float32),
                -fmt.max_finite, fmt.max_finite)
    expected = torch.from_numpy(x).to(torch_dtype).view(torch.uint8).numpy()
    assert np.array_equal(fmt.encode(x), expected)


def test_fp8_e4m3_hand_cases() -> None:
    x = np.array([1.0625, 1.1875, 0.001, 0.0009765625, 500.0, 464.0, -1000.0, 2.0 ** -10],
                 np.float32)
    # 1.0625: tie between 1.0 and 1.125 -> even (1.0, 0x38); 1.1875 -> 1.25 (0x3A);
    # 0.001 = 0.512 x 2^-9 -> the smallest subnormal (0x01); 2^-10: a tie with 0 -> 0;
    # beyond 448: saturated to 448 (0x7E), as the GPU's satfinite store (and torch 2.14's
    # own conversion) does.
    assert E4M3.encode(x).tolist() == [0x38, 0x3A, 0x01, 0x00, 0x7E, 0x7E, 0xFE, 0x00]
    assert torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).tolist() == \
        E4M3.encode(x).tolist()


def test_e2m1_rounds_as_flashinfer_thresholds() -> None:
    # nvfp4_append_quantize_e2m1 (flashinfer include/flashinfer/page.cuh): <=0.25 -> 0,
    # <0.75 -> 0.5, <=1.25 -> 1, <1.75 -> 1.5, <=2.5 -> 2, <3.5 -> 3, <=5 -> 4, else 6.
    x = np.array([0.25, 0.2501, 0.7499, 0.75, 1.25, 1.2501, 1.75, 2.5, 2.5001, 3.5, 5.0,
                  5.0001, 9.0, -0.75], np.float32)
    assert E2M1.round(x).tolist() == [0.0, 0.5, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0,
                                      4.0, 6.0, 6.0, -1.0]


# --- per-tensor fp8 ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("k_scale", "v_scale"), PER_TENSOR_SCALES)
def test_per_tensor_fp8_matches_vllm_kernel_and_torch(
    kernels: dict[str, Any], k_scale: float, v_scale: float,
) -> None:
    args = kernels["inputs"][f"per_tensor-{k_scale}"]
    k_pre, v_pre = kernels[f"per_tensor-{k_scale}"]
    assert np.array_equal(layouts.fp8_per_tensor_codes(args["key"], k_scale),
                          vllm_kernels.torch_fp8_store(k_pre))
    assert np.array_equal(layouts.fp8_per_tensor_codes(args["value"], v_scale),
                          vllm_kernels.torch_fp8_store(v_pre))


def test_per_tensor_fp8_with_scale_one_loses_small_values() -> None:
    # vLLM's default scale 1.0: V values below half the smallest subnormal (2^-10) vanish.
    v = np.full((1, 1, 16), 0.0009, np.float32)
    assert not layouts.fp8_per_tensor_roundtrip(v, 1.0).any()
    assert layouts.fp8_per_tensor_roundtrip(v, 0.0009 / 448.0 * 256).all()


# --- per-token-head ---------------------------------------------------------------------------


def test_int8_per_token_head_matches_vllm_kernel(kernels: dict[str, Any]) -> None:
    args = kernels["inputs"]["int8"]
    k_codes, k_scales, v_codes, v_scales = kernels["int8"]
    for x, codes, scales in ((args["key"], k_codes, k_scales),
                             (args["value"], v_codes, v_scales)):
        stored = layouts.per_token_head_store(x, "int8")
        assert np.array_equal(stored.codes, codes)
        assert np.array_equal(stored.scales.view(np.uint32), scales.view(np.uint32))


def test_fp8_per_token_head_matches_vllm_kernel_and_torch(kernels: dict[str, Any]) -> None:
    args = kernels["inputs"]["fp8_pth"]
    k_pre, k_scales, v_pre, v_scales = kernels["fp8_pth"]
    for x, pre, scales in ((args["key"], k_pre, k_scales), (args["value"], v_pre, v_scales)):
        stored = layouts.per_token_head_store(x, "fp8")
        assert np.array_equal(stored.scales.view(np.uint32), scales.view(np.uint32))
        assert np.array_equal(stored.codes, vllm_kernels.torch_fp8_store(pre))


def test_int8_per_token_head_hand_case() -> None:
    # absmax 2.54 -> scale 0.02; codes x / 0.02 rounded half away from zero.
    x = np.array([[[2.54, -1.27, 0.01, -0.01, 0.0, 0.03]]], np.float32)
    stored = layouts.per_token_head_store(x, "int8")
    assert stored.scales[0, 0] == np.float32(2.54) / np.float32(127)
    assert stored.codes[0, 0].tolist() == [127, -64, 1, -1, 0, 2]
    zero = layouts.per_token_head_store(np.zeros((1, 1, 4), np.float32), "int8")
    assert zero.scales[0, 0] == np.float32(1e-6) and not zero.codes.any()


# --- int4 per-token-head ----------------------------------------------------------------------


@pytest.mark.parametrize("dim", [128, 96])  # 96: the block-diagonal transform (b = 32)
def test_hadamard_rotation_is_vllms(dim: int) -> None:
    x = torch.randn(5, 2, dim, generator=torch.Generator().manual_seed(dim))
    for inverse in (False, True):
        assert np.array_equal(hadamard.single_rht(x.numpy(), inverse),
                              vllm_kernels.single_rht(x, inverse).numpy())


def test_int4_per_token_head_matches_vllm_kernel(kernels: dict[str, Any]) -> None:
    args = kernels["inputs"]["int4"]
    k_packed, k_scales, v_packed, v_scales = kernels["int4"]
    for x, packed, scales in ((args["key"], k_packed, k_scales),
                              (args["value"], v_packed, v_scales)):
        stored = layouts.int4_store(x, "bfloat16")
        assert np.array_equal(stored.packed, packed)
        assert np.array_equal(stored.scales.view(np.uint32), scales.view(np.uint32))


def test_int4_roundtrip_undoes_the_rotation() -> None:
    # x = e_0 + e_1 rotates to s0 + s1·(±1): two levels, {0, 2} or {0, -2}, so the range is
    # 2, the scale 2/15 and the zero point 0 or 15; both levels are then exactly on the grid,
    # and only the zero point's 4 bits masked off the scale (vLLM's reader) remain as error.
    x = np.zeros((1, 1, 16), np.float32)
    x[0, 0, :2] = 1.0
    stored = layouts.int4_store(x, "float32")
    zero_point = int(stored.scales.view(np.uint32)[0, 0] & 0xF)
    assert zero_point in (0, 15)
    assert np.allclose(layouts.int4_roundtrip(x, "float32"), x, atol=1e-5)


# --- nvfp4 ------------------------------------------------------------------------------------


def test_nvfp4_hand_cases() -> None:
    # Block amax 6 with global scale 1: block scale 1.0 (0x38), values on the e2m1 grid
    # come back exactly.
    grid = np.array([6, -4, 3, 2, 1.5, 1, 0.5, 0, -6, 4, -3, -2, -1.5, -1, -0.5, 0],
                    np.float32)[None, None, :]
    stored = layouts.nvfp4_store(grid)
    assert stored.block_scales.tolist() == [[[0x38]]]
    assert stored.packed[0, 0, 0] == (0x7 | (0xE << 4))  # 6 -> 0x7, -4 -> 0x8|0x6
    assert np.array_equal(layouts.nvfp4_roundtrip(grid), grid)
    # Small values with the default global scale 1.0: amax 0.012 -> block scale 0.002,
    # an e4m3 subnormal rounded to 2^-9 (0x01); everything is then a multiple of 2^-10.
    small = np.full((1, 1, 16), 0.012, np.float32)
    small[0, 0, 1] = 0.001
    stored = layouts.nvfp4_store(small)
    assert stored.block_scales.tolist() == [[[0x01]]]
    assert layouts.nvfp4_roundtrip(small)[0, 0, :2].tolist() == [6 * 2.0 ** -9, 2.0 ** -10]


# --- properties over random heads --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_roundtrip_error_bounds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = layouts.as_activation_dtype(
        rng.standard_normal((16, 4, 64)).astype(np.float32) * np.float32(10 ** rng.uniform(-3, 2)),
        "bfloat16")
    # int8 per token and head: at most half a step (the scale) off, plus fp32 rounding.
    stored = layouts.per_token_head_store(x, "int8")
    err = np.abs(layouts.per_token_head_roundtrip(x, "int8") - x)
    assert np.all(err <= stored.scales[..., None] * 0.5001)
    # fp8 per token and head: e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for values
    # in the normal range of the scaled head.
    scaled_ok = np.abs(x) / layouts.per_token_head_store(x, "fp8").scales[..., None] >= 2 ** -6
    rel = np.abs(layouts.per_token_head_roundtrip(x, "fp8") - x) / np.maximum(np.abs(x), 1e-30)
    assert np.all(rel[scaled_ok] <= 2 ** -4 * 1.0001)
    # int4: the rotated values are within half a 4-bit step (range/15) plus the masked bits.
    rotated = layouts.int4_rotate(x, "bfloat16")
    back = layouts.int4_dequantize_rotated(layouts.int4_store(x, "bfloat16"))
    step = (rotated.max(axis=-1) - rotated.min(axis=-1)) / 15
    assert np.all(np.abs(back - rotated) <= step[..., None] * 0.51 + 1e-6)
