"""Every Prometheus reply is checked before a number of it is used. Pure: parsed JSON in.

An instant query answers a ``vector``: a list of ``{"metric": {label: value}, "value":
[time, "number"]}``. A reply of another shape (a matrix, a scalar, a string), a value that
is not a finite number, a histogram without its ``+Inf`` bucket, with only that bucket, with
an ``le`` that is not a number, twice the same ``le``, or with cumulative counts that go
down (beyond what ``increase()``'s extrapolation can dent) is not data kvtune plans on:
``PrometheusDataInvalid`` says what is wrong; the caller keeps the last plan and sets
``ProfileStale`` with that reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvtune.operator.prometheus import histograms
from kvtune.operator.prometheus.prom_http import PrometheusUnavailable

# increase() extrapolates each bucket's series to the window's edges on its own, and stops a
# counter's extrapolation where it would reach zero (Prometheus promql/functions.go,
# extrapolatedRate). Buckets that began counting inside the window (a new pod, a replay) are
# stretched less than those that did not, so cumulative counts dent: 1,218 then 1,143 (6 %)
# was seen on a 30 s window. Extrapolation adds at most 1.1 sample intervals per edge, so
# with two samples in the window one bucket's increase is at least 2.1/3.2 (about two thirds)
# of a lower one's; Prometheus's own histogram_quantile mends such dents (ensureMonotonic),
# as histograms.monotone does here. A bucket below this share of a lower one's count (plus
# one request) is not a dent: the histogram is refused.
DENT_FLOOR_SHARE = 0.5


class PrometheusDataInvalid(PrometheusUnavailable):
    """Prometheus answered, but with data kvtune does not trust; the message says why."""

    reason = "PrometheusDataInvalid"


@dataclass(frozen=True)
class Sample:
    metric: dict[str, str]
    value: float  # NaN when Prometheus said so (no data in the window)


def vector(data: Any, name: str) -> list[Sample]:
    """The samples of an instant query's ``data``."""
    if not isinstance(data, dict):
        raise PrometheusDataInvalid(f"query {name}: the reply has no data object")
    kind = data.get("resultType")
    if kind != "vector":
        shown = kind if isinstance(kind, str) and kind.isalpha() and len(kind) < 16 else "?"
        raise PrometheusDataInvalid(f"query {name}: a {shown} reply where an instant vector "
                                    f"was asked for")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusDataInvalid(f"query {name}: the reply's result is not a list")
    samples = []
    for item in result:
        if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
            raise PrometheusDataInvalid(f"query {name}: a sample without labels")
        value = item.get("value")
        if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str):
            raise PrometheusDataInvalid(f"query {name}: a sample without a [time, value] pair")
        try:
            number = float(value[1])
        except ValueError as exc:
            raise PrometheusDataInvalid(f"query {name}: a value that is not a number") from exc
        if math.isinf(number):
            raise PrometheusDataInvalid(f"query {name}: an infinite value")
        metric = {str(k): str(v) for k, v in item["metric"].items()}
        samples.append(Sample(metric, number))
    return samples


def scalar(samples: list[Sample], name: str) -> float | None:
    """The one number of an aggregated query (None: no data); counts are never negative."""
    if not samples:
        return None
    if len(samples) > 1:
        raise PrometheusDataInvalid(f"query {name}: {len(samples)} series where one "
                                    f"aggregate was asked for")
    v = samples[0].value
    if math.isnan(v):
        return None
    if v < 0:
        raise PrometheusDataInvalid(f"query {name}: a negative value ({v:.3g})")
    return v


def buckets(samples: list[Sample], name: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets ``(le, count)``, sorted; [] when there is no data."""
    if not samples:
        return []
    out: list[tuple[float, float]] = []
    for s in samples:
        le = s.metric.get("le")
        if le is None:
            raise PrometheusDataInvalid(f"query {name}: a bucket without its le label")
        try:
            bound = histograms.parse_le(le)
        except ValueError as exc:
            raise PrometheusDataInvalid(f"query {name}: a bucket le that is not a number"
                                        ) from exc
        if math.isnan(bound):
            raise PrometheusDataInvalid(f"query {name}: a bucket le that is not a number")
        count = 0.0 if math.isnan(s.value) else s.value
        if count < 0:
            raise PrometheusDataInvalid(f"query {name}: a negative bucket count")
        out.append((bound, count))
    out.sort()
    bounds = [b for b, _ in out]
    if len(set(bounds)) != len(bounds):
        raise PrometheusDataInvalid(f"query {name}: the same le twice")
    if bounds[-1] != math.inf:
        raise PrometheusDataInvalid(f"query {name}: the histogram has no +Inf bucket")
    if len(out) == 1:
        raise PrometheusDataInvalid(f"query {name}: the histogram has only its +Inf bucket: "
                                    f"no length can be read from it")
    peak = 0.0
    for bound, count in out:
        if count < DENT_FLOOR_SHARE * peak - 1.0:
            raise PrometheusDataInvalid(
                f"query {name}: cumulative bucket counts go down (le={bound:g}: {count:.0f} "
                f"after {peak:.0f}); the histogram is not one kvtune can trust")
        peak = max(peak, count)
    return out
