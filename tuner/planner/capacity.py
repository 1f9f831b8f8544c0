"""Capacity at SLO (docs/planner.md, "Capacity"): the search's one objective. Pure.

A candidate's capacity is the highest arrival rate of the pool's own traffic (the same
requests, the gaps divided by a *rate scale*) at which the SLO's attainment target holds in
steady state (``GoodputScorer``: 95 % of the requests after the warm-up meet both targets;
refused and unfinished requests are misses). It is per replica, in requests per second:
the observed rate x the largest scale that meets the target.

``climb`` measures it for a group of candidates at once, on one *ladder* of scales shared by
all: every candidate at the observed rate (scale 1, the constraint the search also reports),
then only the ones still meeting the target go on up (doubling until none does, then a
geometric bisection to within a tolerance); when none meets it at the observed rate, all of
them go down (halving) until one does. Attainment falls as the rate rises, so the candidate
with the highest capacity is never dropped from the group: the ladder finds the best capacity
to the tolerance in a few probes of a few candidates, not a bisection per candidate. Where
each candidate stands (``standing``) is read back from the scores taken, so the ladder of a
later stage (offload, block size) reuses every score of an earlier one on the same stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.request import PlanRequest

# The lowest rate scale the ladder goes down to: requests a thousand times further apart
# than observed, each served alone. Below it a candidate's capacity is 0.
TRICKLE_SCALE = 1e-3
# The highest it goes up to (a replica sustaining a thousand times its share is not short).
CEILING_SCALE = 1024.0
# Probes per ladder at most (doubling from 1 to the ceiling, then bisecting to 1 %: < 20).
_MAX_PROBES = 40


@dataclass(frozen=True, slots=True)
class GoodputScore:
    """What a scorer predicts for one plan on a prefix of the traffic at one rate."""

    slo_attainment: float  # in steady state: the fraction of requests meeting both targets
    # Whether as many requests finish as arrive in the steady-state window (a replica
    # absorbing a short burst in its queue does not sustain the rate).
    keeps_up: bool
    throughput_requests_per_second: float
    ttft_p95_seconds: float
    tpot_p95_seconds: float
    requests: int  # how many requests were replayed
    preemptions: int = 0
    prefix_hit_rate: float = 0.0  # of prompt tokens, found in the GPU's prefix cache
    cpu_hit_rate: float = 0.0  # of prompt tokens, loaded from the CPU tier
    prompt_tokens_per_request: float = 0.0  # looked up in the prefix cache, per request replayed
    output_tokens_per_second: float = 0.0  # output tokens served per second (the cost base)
    starts: bool = True  # False: vLLM would not start it (no figures)


class GoodputScorer(Protocol):
    """Predicts a plan's SLO attainment on the pool's traffic (``tuner/simulator``
    implements it on a trace or on traffic made from the profile)."""

    @property
    def rate_per_second(self) -> float:
        """The observed arrival rate of the traffic."""
        ...

    @property
    def max_requests(self) -> int:
        """How many requests the traffic holds."""
        ...

    def score(self, request: PlanRequest, plan: KVPlan, num_requests: int,
              rate_scale: float = 1.0) -> GoodputScore:
        """Replay the first ``num_requests`` requests with arrivals ``rate_scale`` times as
        fast (the same requests, the gaps divided)."""
        ...


# (plan, requests, rate scale) -> the score; the search's book, which caches every score.
ScoreFn = Callable[[KVPlan, int, float], GoodputScore]


@dataclass(frozen=True, slots=True)
class Standing:
    """Where one candidate stands on the ladders its scores came from (one stream length)."""

    at_observed: GoodputScore  # at scale 1: the constraint, and the figures reported
    lower_scale: float  # the highest scale at which it met the target (0: none tried)
    upper_scale: float  # the lowest scale above that at which it missed (inf: none tried)
    # Attainment at ``upper_scale`` (at the lowest scale tried when it met none): how close
    # it came where it dropped out, to order candidates that dropped out together.
    attainment_at_upper: float

    def meets_observed(self, target: float) -> bool:
        return meets(self.at_observed, target)


def meets(score: GoodputScore, target: float) -> bool:
    """The SLO holds at that rate: the attainment target met, and the replica keeps up."""
    return score.keeps_up and score.slo_attainment >= target


def standing(scores: Mapping[float, GoodputScore], target: float) -> Standing:
    """A candidate's standing from its scores by rate scale (scale 1 among them)."""
    passed = [s for s, x in scores.items() if meets(x, target)]
    lower = max(passed, default=0.0)
    above = [s for s in scores if s > lower and not meets(scores[s], target)]
    upper = min(above, default=math.inf)
    at_upper = (scores[upper].slo_attainment if math.isfinite(upper)
                else scores[min(scores)].slo_attainment if not passed else 1.0)
    return Standing(at_observed=scores[1.0], lower_scale=lower, upper_scale=upper,
                    attainment_at_upper=at_upper)


@dataclass(frozen=True, slots=True)
class Bracket:
    """The best capacity of a group, as rate scales: met at ``lower``, missed by all at
    ``upper`` (inf: never missed below the ceiling; ``lower`` 0: met nowhere down to the
    trickle)."""

    lower: float
    upper: float


def climb(score: ScoreFn, plans: Sequence[KVPlan], n: int, target: float,
          tolerance: float, hints: Sequence[float] = ()) -> Bracket:
    """The ladder (module doc) over ``plans`` on the first ``n`` requests, to within
    ``tolerance`` (``upper / lower <= 1 + tolerance``). ``hints``: scales to try first
    (an earlier ladder's bracket: where the best capacity is expected)."""
    alive = [p for p in plans if meets(score(p, n, 1.0), target)]
    lower, upper = (1.0, math.inf) if alive else (0.0, 1.0)
    pending = list(hints)
    for _ in range(_MAX_PROBES):
        scale = _next_scale(lower, upper, tolerance, pending)
        if scale is None:
            break
        group = alive if lower > 0 else list(plans)
        passed = [p for p in group if meets(score(p, n, scale), target)]
        if passed:
            alive, lower = passed, scale
        else:
            upper = scale
    return Bracket(lower, upper)


def _next_scale(lower: float, upper: float, tolerance: float, pending: list[float]
                ) -> float | None:
    while pending:
        hint = pending.pop(0)
        if lower < hint < upper and TRICKLE_SCALE <= hint <= CEILING_SCALE:
            return hint
    if lower == 0.0:
        down = upper / 2
        return down if down >= TRICKLE_SCALE else None
    if math.isinf(upper):
        up = lower * 2
        return up if up <= CEILING_SCALE else None
    if upper / lower <= 1.0 + tolerance:
        return None
    return math.sqrt(lower * upper)


def settle_ties(score: ScoreFn, plans: Sequence[KVPlan], n: int, target: float,
                best_scale: float, tie: float, standings: Mapping[KVPlan, Standing]) -> bool:
    """Probe, at the edge of the tie band (``best_scale x (1 - tie)``), every candidate the
    ladders left undecided there (met below it, never missed at or below it), so the tie
    rules see every candidate whose capacity is within ``tie`` of the best. True when it
    probed any (the standings are then stale)."""
    edge = best_scale * (1.0 - tie)
    probed = False
    for p in plans:
        st = standings[p]
        if 0 < st.lower_scale < edge < st.upper_scale:
            score(p, n, edge)
            probed = True
    return probed


def replicas_needed(replicas: int, capacity_scale: float) -> int | None:
    """Replicas the whole traffic needs when each sustains ``capacity_scale`` of its share
    (``replicas`` shares): ceil(observed total rate / capacity); None when it sustains none."""
    if capacity_scale <= 0:
        return None
    return max(1, math.ceil(replicas / capacity_scale - 1e-9))


__all__ = [
    "CEILING_SCALE",
    "TRICKLE_SCALE",
    "Bracket",
    "GoodputScore",
    "GoodputScorer",
    "ScoreFn",
    "Standing",
    "climb",
    "meets",
    "replicas_needed",
    "settle_ties",
    "standing",
]
