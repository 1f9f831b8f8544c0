"""The SLO attainment a pool really gets, beside the capacity search's prediction. Pure.

The retune timer's profiling window already reads vLLM's TTFT and per-request TPOT
histograms (``profiling.queries``: ``ttft_buckets``, ``tpot_buckets``); nothing more is
asked of Prometheus. From them:

- **shown**: the share of requests within each target, read at the target's own bucket where
  the histograms have it as a bound (the pods render kvtune's SLO buckets, ``slo_buckets``),
  else at the bucket at or below it (as the canary analysis and the alert rules read it:
  stricter, never laxer), and the message says which;
- **judged**: the search predicts the share meeting *both* targets; the histograms give each
  target alone, so the most the pool can have attained is the smaller of the two shares, read
  at the bucket at or *above* each target (never stricter than the prediction). The
  observation is worse than the prediction only when even that bound falls short of it by
  more than the noise of two binomial shares (``canary_analysis.binomial_noise``: the
  window's requests against the simulated ones, one-sided 99 %) and more than ``MIN_DROP``,
  after at least ``min_requests`` finished requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtune.operator.prometheus import histograms, slo_buckets
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.operator.rollout.canary_analysis import binomial_noise

# Below the prediction by less than two points is not worth a condition (the canary
# analysis's ``min_drop``).
MIN_DROP = 0.02

BELOW_PREDICTION = "ObservedBelowPrediction"
AS_PREDICTED = "ObservedAsPredicted"
INSUFFICIENT_SAMPLE = "InsufficientSample"
NO_PREDICTION = "NoPrediction"

Buckets = Sequence[tuple[float, float]]


def share_within(buckets: Buckets, bound: float) -> float | None:
    """The share of the histogram's observations at or below ``bound`` (a bucket bound);
    None when it is empty."""
    if not buckets:
        return None
    total = histograms.total_count(buckets)
    if total <= 0:
        return None
    at = max((c for b, c in buckets if b <= bound + 1e-12), default=0.0)
    return min(1.0, max(0.0, at / total))


def bound_above(threshold: float, bounds: tuple[float, ...]) -> float:
    """The smallest bucket bound at or above ``threshold`` (+Inf above them all)."""
    above = [b for b in bounds if b >= threshold - 1e-12]
    return above[0] if above else float("inf")


@dataclass(frozen=True, slots=True)
class Observation:
    requests: int
    window_seconds: float
    ttft_within_slo: float | None  # at the bucket at or below the target
    tpot_within_slo: float | None
    ttft_bound_seconds: float | None
    tpot_bound_seconds: float | None
    # The targets, so a bound below its target is named as one.
    ttft_slo_seconds: float | None
    tpot_slo_seconds: float | None
    # The most the pool can have attained on both targets (the smaller share, each read at
    # the bucket at or above its target); None without a target or data.
    attainment_upper_bound: float | None


def _bounds(buckets: Buckets, defaults: tuple[float, ...]) -> tuple[float, ...]:
    """The finite bounds the histogram has (the pods' own: kvtune's SLO buckets or vLLM's
    defaults); vLLM's defaults when there is no data to say."""
    finite = sorted({b for b, _ in buckets if b != float("inf")})
    return tuple(finite) if finite else defaults


def observe(ttft_buckets: Buckets, tpot_buckets: Buckets, requests: int,
            window_seconds: float, ttft_slo_seconds: float | None,
            tpot_slo_seconds: float | None) -> Observation:
    ttft_bounds = _bounds(ttft_buckets, vm.TIME_TO_FIRST_TOKEN_BUCKETS)
    tpot_bounds = _bounds(tpot_buckets, vm.INTER_TOKEN_LATENCY_BUCKETS)
    ttft_b = None if ttft_slo_seconds is None else slo_buckets.lower_bound(
        ttft_slo_seconds, ttft_bounds)
    tpot_b = None if tpot_slo_seconds is None else slo_buckets.lower_bound(
        tpot_slo_seconds, tpot_bounds)
    uppers: list[float | None] = []
    if ttft_slo_seconds is not None:
        uppers.append(share_within(ttft_buckets, bound_above(ttft_slo_seconds, ttft_bounds)))
    if tpot_slo_seconds is not None:
        uppers.append(share_within(tpot_buckets, bound_above(tpot_slo_seconds, tpot_bounds)))
    upper = None if not uppers or any(u is None for u in uppers) \
        else min(u for u in uppers if u is not None)
    return Observation(
        requests=requests, window_seconds=window_seconds,
        ttft_within_slo=None if ttft_b is None else share_within(ttft_buckets, ttft_b),
        tpot_within_slo=None if tpot_b is None else share_within(tpot_buckets, tpot_b),
        ttft_bound_seconds=ttft_b, tpot_bound_seconds=tpot_b,
        ttft_slo_seconds=ttft_slo_seconds, tpot_slo_seconds=tpot_slo_seconds,
        attainment_upper_bound=upper)


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: str  # BELOW_PREDICTION, AS_PREDICTED, INSUFFICIENT_SAMPLE, NO_PREDICTION
    message: str

    @property
    def below(self) -> bool:
        return self.verdict == BELOW_PREDICTION


def _at(bound: float, slo: float | None) -> str:
    if slo is not None and bound < slo - 1e-12:
        return (f"(judged at the lower {bound:g} s bucket bound, not the {slo:g} s target: "
                f"the pods do not render kvtune's SLO buckets)")
    return f"(at the {bound:g} s bucket)"


def _shares(o: Observation) -> str:
    parts = []
    if o.ttft_within_slo is not None and o.ttft_bound_seconds is not None:
        parts.append(f"TTFT within SLO {o.ttft_within_slo:.1%} "
                     f"{_at(o.ttft_bound_seconds, o.ttft_slo_seconds)}")
    if o.tpot_within_slo is not None and o.tpot_bound_seconds is not None:
        parts.append(f"TPOT within SLO {o.tpot_within_slo:.1%} "
                     f"{_at(o.tpot_bound_seconds, o.tpot_slo_seconds)}")
    return ", ".join(parts) or "no SLO target or no latency data"


def judge(o: Observation, predicted: float | None, predicted_requests: int,
          min_requests: int) -> Judgement:
    """Is the observed attainment worse than the predicted one beyond noise?"""
    seen = f"observed over {o.requests} requests in {o.window_seconds:.0f}s: {_shares(o)}"
    if predicted is None:
        return Judgement(NO_PREDICTION, f"{seen}; no prediction (the plan was not chosen by "
                                        f"the capacity search)")
    if o.requests < min_requests or o.attainment_upper_bound is None:
        return Judgement(INSUFFICIENT_SAMPLE, f"{seen}; predicted {predicted:.1%} meet both "
                                              f"targets; too few requests to compare (need "
                                              f"{min_requests})")
    upper = o.attainment_upper_bound
    margin = max(MIN_DROP, binomial_noise(predicted, predicted_requests, upper, o.requests))
    head = (f"{seen}; at most {upper:.1%} met both targets against the {predicted:.1%} "
            f"the capacity search predicted")
    if predicted - upper > margin:
        return Judgement(BELOW_PREDICTION, f"{head}: {predicted - upper:.1%} short, beyond "
                                           f"the noise margin {margin:.1%}")
    return Judgement(AS_PREDICTED, f"{head} (within the noise margin {margin:.1%})")


__all__ = ["AS_PREDICTED", "BELOW_PREDICTION", "INSUFFICIENT_SAMPLE", "NO_PREDICTION",
           "Judgement", "Observation", "bound_above", "judge", "observe", "share_within"]
