"""Quantiles from Prometheus histogram buckets, with their uncertainty. Pure.

vLLM's token histograms have 1-2-5 buckets (…, 1000, 2000, 5000, 10000, …): a quantile is
only known to lie inside one bucket, whose upper bound can be 2.5x its lower one.
``histogram_quantile`` interpolates linearly inside the bucket, which for the right-skewed
length distributions of LLM traffic puts the estimate too high (a bucket's mass sits near its
lower end). kvtune interpolates log-linearly (geometrically) instead — uniform in log(tokens),
the natural scale for a 1-2-5 ladder — and always reports the bucket bounds as the interval
the true quantile lies in, plus what ``histogram_quantile`` would have said.

Values above the largest finite bound (the +Inf bucket) are only known to be at most
``cap`` (vLLM's max_model_len) when the caller knows it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict


class QuantileEstimate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    q: float
    estimate: float  # log-linear within the bucket
    lower: float  # the bucket holding the quantile: the true value is in [lower, upper]
    upper: float  # math.inf when it lies in the +Inf bucket and no cap is known
    histogram_quantile: float  # Prometheus' linear interpolation, for comparison


def _clean(buckets: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted (bound, cumulative count), monotone (rate() over resets can dent it)."""
    out: list[tuple[float, float]] = []
    running = 0.0
    for bound, count in sorted(buckets, key=lambda b: b[0]):
        running = max(running, count)
        out.append((bound, running))
    if not out or not math.isinf(out[-1][0]):
        raise ValueError("buckets must include the +Inf bucket (le=\"+Inf\")")
    return out


def total_count(buckets: Sequence[tuple[float, float]]) -> float:
    return _clean(buckets)[-1][1]


def prometheus_histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """What PromQL's ``histogram_quantile`` returns (classic buckets), for comparison."""
    b = _clean(buckets)
    total = b[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    for i, (bound, count) in enumerate(b):
        if count >= rank:
            if math.isinf(bound):
                return b[i - 1][0] if i > 0 else math.nan
            lo_bound, lo_count = (0.0, 0.0) if i == 0 else b[i - 1]
            if i == 0 and bound <= 0:
                return bound
            return lo_bound + (bound - lo_bound) * (rank - lo_count) / max(count - lo_count, 1e-12)
    return b[-2][0]


def estimate_quantile(
    q: float, buckets: Sequence[tuple[float, float]], cap: float | None = None
) -> QuantileEstimate:
    """The q-quantile of the observations counted in ``buckets`` ((le, cumulative count)
    pairs, +Inf included). Raises ValueError on an empty histogram."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q={q}: must be in (0, 1)")
    b = _clean(buckets)
    total = b[-1][1]
    if total <= 0:
        raise ValueError("the histogram is empty: no observations in the window")
    rank = q * total
    i = next(i for i, (_, count) in enumerate(b) if count >= rank)
    bound, count = b[i]
    lo_bound, lo_count = (0.0, 0.0) if i == 0 else b[i - 1]
    frac = (rank - lo_count) / max(count - lo_count, 1e-12)
    if math.isinf(bound):
        upper = cap if cap is not None and cap > lo_bound else math.inf
        if math.isinf(upper):
            estimate = lo_bound  # nothing better is known than "at least this"
        else:
            estimate = lo_bound * (upper / lo_bound) ** frac if lo_bound > 0 else upper * frac
    elif lo_bound <= 0:
        upper = bound
        estimate = bound * frac  # the first bucket: linear from 0
    else:
        upper = bound
        estimate = lo_bound * (bound / lo_bound) ** frac
    return QuantileEstimate(
        q=q, estimate=estimate, lower=lo_bound, upper=upper,
        histogram_quantile=prometheus_histogram_quantile(q, buckets),
    )


def highest_nonempty_bound(buckets: Sequence[tuple[float, float]],
                           cap: float | None = None) -> float:
    """The upper bound of the highest bucket with observations: the largest value seen is
    at most this (``cap`` or +Inf for the +Inf bucket)."""
    b = _clean(buckets)
    prev = 0.0
    highest = 0.0
    for bound, count in b:
        if count > prev:
            highest = bound
        prev = count
    if math.isinf(highest) and cap is not None:
        return cap
    return highest


def parse_le(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)
