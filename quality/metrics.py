"""The error figures of a KV dtype, in numpy: attention output error, next-token KL, top-1.

Kept apart from the torch code so the synthetic tests and the model measurement compute the
figures with the same lines.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F = NDArray[np.floating]


def causal_attention(q: F, k: F, v: F, *, scale: float | None = None) -> NDArray[np.float64]:
    """Softmax attention of ``q [tokens, q_heads, dim]`` over ``k, v [tokens, kv_heads, dim]``
    (grouped-query: q head h reads kv head h // (q_heads / kv_heads)), causal, in float64."""
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    tokens, q_heads, dim = q64.shape
    group = q_heads // k64.shape[1]
    k64 = np.repeat(k64, group, axis=1)
    v64 = np.repeat(v64, group, axis=1)
    s = np.einsum("thd,shd->hts", q64, k64) * (scale if scale is not None else dim ** -0.5)
    s = np.where(np.tril(np.ones((tokens, tokens), bool))[None], s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    out: NDArray[np.float64] = np.einsum("hts,shd->thd", p, v64)
    return out


def relative_error(approx: F, exact: F) -> float:
    """‖approx − exact‖ / ‖exact‖ over all elements (0 when both are zero)."""
    a, e = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    denom = float(np.linalg.norm(e))
    diff = float(np.linalg.norm(a - e))
    return diff / denom if denom > 0 else diff


def log_softmax(logits: F) -> NDArray[np.float64]:
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    out: NDArray[np.float64] = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return out


def next_token_kl(reference_logits: F, quantized_logits: F) -> NDArray[np.float64]:
    """KL(reference ‖ quantized) in nats at each position: how much the next-token
    distribution moved away from the 16-bit one."""
    lp, lq = log_softmax(reference_logits), log_softmax(quantized_logits)
    kl: NDArray[np.float64] = np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0)
    return kl


def top1_agreement(reference_logits: F, quantized_logits: F) -> float:
    """Share of positions whose most likely next token is the same as with 16-bit KV."""
    a = np.argmax(np.asarray(reference_logits), axis=-1)
    b = np.argmax(np.asarray(quantized_logits), axis=-1)
    return float(np.mean(a == b)) if a.size else 1.0
