"""K with outlier channels, as real LLMs' keys have (a few channels an order of magnitude
above the rest): 4-bit per-token-head KV is flagged while fp8 passes."""

from __future__ import annotations

import numpy as np

from kvtune.quality import layouts
from kvtune.quality.metrics import causal_attention, relative_error
from kvtune.quality.report import ATTENTION_ERROR_FLAG


def _attention_errors(outlier: float) -> dict[str, float]:
    rng = np.random.default_rng(1)
    tokens, kv_heads, dim = 256, 2, 128
    key = rng.standard_normal((tokens, kv_heads, dim)).astype(np.float32)
    # Four channels carry a large offset of a fixed sign in every token (15x the others).
    signs = np.sign(rng.standard_normal(4)).astype(np.float32)
    key[:, :, [3, 17, 64, 100]] += outlier * signs
    value = (rng.standard_normal((tokens, kv_heads, dim)) * 0.5).astype(np.float32)
    query = rng.standard_normal((tokens, 2 * kv_heads, dim)).astype(np.float32)
    key = layouts.as_activation_dtype(key, "bfloat16")
    value = layouts.as_activation_dtype(value, "bfloat16")
    exact = causal_attention(query, key, value)
    errors = {}
    for dtype in ("fp8", "int8_per_token_head", "int4_per_token_head"):
        lay = layouts.layout(dtype)
        q = layouts.quantize_query(query, 1.0) if lay.quantizes_query else query
        got = causal_attention(q, lay.roundtrip(key, 1.0, "bfloat16"),
                               lay.roundtrip(value, 1.0, "bfloat16"))
        errors[dtype] = relative_error(got, exact)
    return errors


def test_outlier_channels_flag_int4_but_not_fp8() -> None:
    errors = _attention_errors(outlier=15.0)
    assert errors["fp8"] < ATTENTION_ERROR_FLAG, errors
    assert errors["int8_per_token_head"] < ATTENTION_ERROR_FLAG, errors
    assert errors["int4_per_token_head"] > ATTENTION_ERROR_FLAG, errors


def test_outliers_hurt_int4_more_than_fp8() -> None:
    calm, spiky = _attention_errors(outlier=0.0), _attention_errors(outlier=15.0)
    # A float format keeps each element's own exponent; a 16-level grid spans the outlier.
    assert spiky["int4_per_token_head"] - calm["int4_per_token_head"] > \
        2 * (spiky["fp8"] - calm["fp8"]) > 0


def test_more_bits_less_error() -> None:
    errors = _attention_errors(outlier=0.0)
    assert 0 < errors["int8_per_token_head"] < errors["fp8"] < errors["int4_per_token_head"] < 1
