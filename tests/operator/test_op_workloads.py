"""Declared quantiles refine a preset; the result never decreases."""

from __future__ import annotations

import pytest

from kvtune.operator.api import DeclaredTokens
from kvtune.operator.api.workloads import merge_quantiles
from kvtune.tuner.workload import TokenQuantiles

PRESET = TokenQuantiles(p50=1000, p90=3000, p95=4000, p99=8000, max=16000)


@pytest.mark.parametrize(("declared", "expected"), [
    (None, (1000, 3000, 4000, 8000, 16000)),
    ({"p50": 2000, "p99": 16000, "max": 32768}, (2000, 3000, 4000, 16000, 32768)),
    ({"p50": 20000}, (20000, 20000, 20000, 20000, 20000)),  # the tail lifts with p50
    ({"p50": 100, "p99": 500}, (100, 500, 500, 500, 16000)),  # capped below p99 only
    ({"p50": 100, "p95": 200, "p99": 300, "max": 400}, (100, 200, 200, 300, 400)),
])
def test_merge(declared: dict[str, int] | None, expected: tuple[int, ...]) -> None:
    got = merge_quantiles(PRESET, DeclaredTokens(**declared) if declared else None)
    assert (got.p50, got.p90, got.p95, got.p99, got.max) == expected
