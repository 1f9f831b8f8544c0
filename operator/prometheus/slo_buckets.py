"""SLO thresholds as histogram bucket bounds, so every judge reads the exact threshold. Pure.

vLLM's default latency buckets put most targets between two bounds (a 2 s TTFT target lies
between 1.0 and 2.5): a share "within the SLO" is then only known at the bound below it,
1 s, which judges the pool against a target half as long. vLLM 0.33 takes its bucket bounds
from ``--custom-histogram-buckets`` (``ObservabilityConfig.custom_histogram_buckets``: a JSON
mapping of bucket family to strictly increasing, positive, finite bounds; a listed family's
bounds replace its defaults for every histogram of that family). kvtune renders, for each
family an SLO target reads, vLLM's default bounds plus the targets:

- ``time_to_first_token``: ``vllm:time_to_first_token_seconds`` (the TTFT target);
- ``inter_token_latency``: ``vllm:request_time_per_output_token_seconds`` (the per-request
  TPOT the target reads) and ``vllm:inter_token_latency_seconds``.

``vllm:e2e_request_latency_seconds`` (``request_latency``) has no target in the spec and
keeps its defaults. Every added bound is one more series per histogram and label set: at
most two here.

The alerts, the canary analysis and the observed attainment read the SLO at ``le`` equal to
the threshold where the pods render these buckets (``SLOBound.exact``), and at the bound at
or below it otherwise, saying so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from kvtune.operator.prometheus import vllm_metrics as vm

FLAG = "--custom-histogram-buckets"
TTFT_FAMILY = "time_to_first_token"
TPOT_FAMILY = "inter_token_latency"
_DEFAULTS: dict[str, tuple[float, ...]] = {
    TTFT_FAMILY: vm.TIME_TO_FIRST_TOKEN_BUCKETS,
    TPOT_FAMILY: vm.INTER_TOKEN_LATENCY_BUCKETS,
}
# Two bounds closer than this are the same bound (a duration parsed from "80ms" is 0.08).
_SAME = 1e-12


def with_threshold(defaults: Sequence[float], threshold_seconds: float | None
                   ) -> tuple[float, ...]:
    """vLLM's default bounds plus the threshold, strictly increasing (vLLM refuses ties)."""
    bounds = sorted(float(b) for b in defaults)
    if threshold_seconds is not None and not any(
            abs(b - threshold_seconds) <= _SAME for b in bounds):
        bounds = sorted([*bounds, float(threshold_seconds)])
    return tuple(bounds)


def custom_buckets(ttft_seconds: float | None, tpot_seconds: float | None
                   ) -> dict[str, list[float]]:
    """The ``--custom-histogram-buckets`` mapping: only the families a target reads."""
    out: dict[str, list[float]] = {}
    for family, threshold in ((TTFT_FAMILY, ttft_seconds), (TPOT_FAMILY, tpot_seconds)):
        if threshold is not None:
            out[family] = list(with_threshold(_DEFAULTS[family], threshold))
    return out


def vllm_flag(ttft_seconds: float | None, tpot_seconds: float | None) -> list[str]:
    """``["--custom-histogram-buckets=<json>"]``, or nothing without an SLO target."""
    buckets = custom_buckets(ttft_seconds, tpot_seconds)
    if not buckets:
        return []
    return [f"{FLAG}={json.dumps(buckets, separators=(',', ':'), sort_keys=True)}"]


@dataclass(frozen=True, slots=True)
class SLOBound:
    """Where a target is read: ``bound`` is the ``le`` of the bucket counted as within it."""

    threshold_seconds: float
    bound_seconds: float
    exact: bool

    def describe(self, what: str) -> str:
        if self.exact:
            return f"{what} SLO {self.threshold_seconds:g}s read at its own bucket bound"
        return (f"{what} SLO {self.threshold_seconds:g}s judged at the lower bucket bound "
                f"{self.bound_seconds:g}s (stricter): the pods do not render kvtune's SLO "
                f"buckets ({FLAG})")


def lower_bound(threshold_seconds: float, bounds: Sequence[float]) -> float:
    """The largest bound <= the threshold (stricter); the smallest bound below them all."""
    below = [b for b in bounds if b <= threshold_seconds + _SAME]
    return below[-1] if below else min(bounds)


def slo_bound(threshold_seconds: float, family: str, rendered: bool) -> SLOBound:
    """The bound a target is read at: itself where the pods render the SLO buckets."""
    if rendered:
        return SLOBound(threshold_seconds, threshold_seconds, True)
    defaults = _DEFAULTS[family]
    bound = lower_bound(threshold_seconds, defaults)
    return SLOBound(threshold_seconds, bound, abs(bound - threshold_seconds) <= _SAME)


def in_bounds(threshold_seconds: float, bounds: Sequence[float]) -> SLOBound:
    """The bound a target is read at among the bounds a histogram actually has (observed
    data says for itself whether the pods rendered the threshold)."""
    bound = lower_bound(threshold_seconds, bounds)
    return SLOBound(threshold_seconds, bound, abs(bound - threshold_seconds) <= _SAME)


def rendered_for(slo_set: bool, user_pod_template: bool) -> bool:
    """Whether the pods carry the SLO buckets: kvtune renders the flag whenever the spec sets a
    target; its own pod template always passes the arguments, while a user's template may
    drop them, so there the bound at or below the target is used (never laxer)."""
    return slo_set and not user_pod_template


__all__ = ["FLAG", "TPOT_FAMILY", "TTFT_FAMILY", "SLOBound", "custom_buckets", "in_bounds",
           "lower_bound", "rendered_for", "slo_bound", "vllm_flag", "with_threshold"]
