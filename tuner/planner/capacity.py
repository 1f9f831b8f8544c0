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
    # False: no score at (or met above) the observed rate; ``at_observed`` is then the score
    # at the lowest rate taken, a miss, and the candidate counts as missing the target.
    observed: bool = True

    def meets_observed(self, target: float) -> bool:
        return self.observed and meets(self.at_observed, target)


def meets(score: GoodputScore, target: float) -> bool:
    """The SLO holds at that rate: the attainment target met, and the replica keeps up."""
    return score.keeps_up and score.slo_attainment >= target


def observed_score(scores: Mapping[float, GoodputScore], target: float
                   ) -> GoodputScore | None:
    """The figures that stand for the observed rate: its own score, else the score at the
    lowest rate at or above it that met the target (attainment falls as the rate rises, so
    the SLO holds at the observed rate too; ``knockout`` skips that replay on a short rung);
    None when neither was taken."""
    got = scores.get(1.0)
    if got is not None:
        return got
    above = [s for s in scores if s >= 1.0 and meets(scores[s], target)]
    return scores[min(above)] if above else None


def standing(scores: Mapping[float, GoodputScore], target: float) -> Standing:
    """A candidate's standing from its scores by rate scale (``observed_score`` among them)."""
    at_observed = observed_score(scores, target)
    observed = at_observed is not None
    if at_observed is None:
        if not scores:
            raise ValueError("a standing needs a score")
        # Off the last rung a candidate that missed the best's rate is not replayed at the
        # observed one (``knockout``): it ranks below every observed one, by how close it came.
        at_observed = scores[min(scores)]
    passed = [s for s, x in scores.items() if meets(x, target)]
    lower = max(passed, default=0.0)
    above = [s for s in scores if s > lower and not meets(scores[s], target)]
    upper = min(above, default=math.inf)
    at_upper = (scores[upper].slo_attainment if math.isfinite(upper)
                else scores[min(scores)].slo_attainment if not passed else 1.0)
    return Standing(at_observed=at_observed, lower_scale=lower, upper_scale=upper,
                    attainment_at_upper=at_upper, observed=observed)


@dataclass(frozen=True, slots=True)
class Bracket:
    """The best capacity of a group, as rate scales: met at ``lower``, missed by all at
    ``upper`` (inf: never missed below the ceiling; ``lower`` 0: met nowhere down to the
    trickle)."""

    lower: float
    upper: float


def climb(score: ScoreFn, plans: Sequence[KVPlan], n: int, target: float,
          tolerance: float, hints: Sequence[float] = (), start: float | None = None
          ) -> Bracket:
    """The ladder (module doc) over ``plans`` on the first ``n`` requests, to within
    ``tolerance`` (``upper / lower <= 1 + tolerance``). ``hints``: scales to try first
    (an earlier ladder's bracket: where the best capacity is expected); with hints, a
    ladder that passes them all climbs in small steps that double (1 + 2 tolerance, then
    its square, ...) instead of doubling the rate: the hints put it near its edge already.
    ``start``: a scale every plan met already (the ladder climbs from there, in small
    steps, without scoring the observed rate)."""
    if start is not None:
        alive, lower, upper = list(plans), start, math.inf
    else:
        alive = [p for p in plans if meets(score(p, n, 1.0), target)]
        lower, upper = (1.0, math.inf) if alive else (0.0, 1.0)
    pending = list(hints)
    step = (1.0 + 2.0 * tolerance) if hints or start is not None else 2.0
    for _ in range(_MAX_PROBES):
        scale = _next_scale(lower, upper, tolerance, pending, step)
        if scale is None:
            break
        group = alive if lower > 0 else list(plans)
        passed = [p for p in group if meets(score(p, n, scale), target)]
        if passed:
            if math.isinf(upper) and scale > lower and not pending:
                step = min(2.0, step * step)
            alive, lower = passed, scale
        else:
            upper = scale
    return Bracket(lower, upper)


def _next_scale(lower: float, upper: float, tolerance: float, pending: list[float],
                step: float = 2.0) -> float | None:
    while pending:
        hint = pending.pop(0)
        if lower < hint < upper and TRICKLE_SCALE <= hint <= CEILING_SCALE:
            return hint
    if lower == 0.0:
        down = upper / 2
        return down if down >= TRICKLE_SCALE else None
    if math.isinf(upper):
        up = lower * step
        return up if up <= CEILING_SCALE else None
    if upper / lower <= 1.0 + tolerance:
        return None
    return math.sqrt(lower * upper)


def knockout(score: ScoreFn, plans: Sequence[KVPlan], n: int, target: float,
             tolerance: float, band: float, hints: Sequence[float] = (),
             final: bool = True, screen: bool = True) -> Bracket:
    """The best capacity among ``plans``, one candidate at a time (branch and bound), the
    most promising first (``plans``' order).

    The first climbs its own ladder (``climb``, from ``hints``: where the best capacity is
    expected; on the ``final`` rung, with ``screen``, the candidate that did best at the
    first hint goes first). Each later one is probed at the edge of the band below the best
    so far (its lower scale x (1 - ``band``)): one that misses there is out, for one replay (a group
    ladder walks every candidate down from an overstated bracket, several replays each).
    One that meets it is probed at the best's bracket (the lower end, then the upper);
    meeting the upper end too, it climbs its own ladder from there and becomes the best.
    On the ``final`` rung one that met the edge is also scored at the observed rate (its
    figures are reported); off it a candidate only needs ranking, to promote it (a miss at
    the best's rate ranks it by how close it came, with ``band`` 0). A result that
    attainment's fall with the rate already implies (a miss below the scale, a pass above
    it) is not replayed."""
    seen: dict[KVPlan, dict[float, GoodputScore]] = {p: {} for p in plans}

    def probe(p: KVPlan, scale: float) -> bool:
        known = _implied(seen[p], scale, target)
        if known is not None:
            return known
        seen[p][scale] = score(p, n, scale)
        return meets(seen[p][scale], target)

    plans = list(plans)
    guess = next((h for h in hints if TRICKLE_SCALE <= h <= CEILING_SCALE), None)
    if screen and final and guess is not None and len(plans) > 2:
        # On the full stream the shorter one's order is a poor guide (it overstates
        # capacity, by more for some candidates than for others): all of them at the
        # expected capacity first, and the one that met it, or came closest, climbs first,
        # so the others are measured against a near-best bracket.
        for p in plans:
            probe(p, guess)
        plans.sort(key=lambda p: (not meets(seen[p][guess], target),
                                  -seen[p][guess].slo_attainment))
    lower, upper = 0.0, math.inf
    best = plans[0] if plans else None
    for i, p in enumerate(plans):
        if i == 0 or lower <= 0.0 or best is None:
            b = climb(score, [p], n, target, tolerance, hints if i == 0 else (upper,))
            if i == 0 or b.lower > 0.0:
                lower, upper, best = b.lower, b.upper, p
            continue
        if not probe(p, lower * (1.0 - band)):
            continue
        if final:
            score(p, n, 1.0)  # its figures at the observed rate
        if not probe(p, lower) or math.isinf(upper):
            continue  # within the band of the best, below it
        if not final and (seen[p][lower].slo_attainment if lower in seen[p] else 1.0) < (
                score(best, n, lower).slo_attainment):
            continue  # off the last rung: met the best's rate with less to spare, a tie
        if not probe(p, upper):
            continue  # at the best's capacity, to the tolerance
        b = climb(score, [p], n, target, tolerance, start=upper)
        lower, upper, best = b.lower, b.upper, p
    return Bracket(lower, upper)


def _implied(scores: Mapping[float, GoodputScore], scale: float, target: float
             ) -> bool | None:
    """Whether the SLO holds at ``scale``, from scores already taken: met at or above it
    (holds), missed at or below it (does not); None when they do not say."""
    if any(s >= scale and meets(x, target) for s, x in scores.items()):
        return True
    if any(s <= scale and not meets(x, target) for s, x in scores.items()):
        return False
    return None


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
    "knockout",
    "meets",
    "observed_score",
    "replicas_needed",
    "settle_ties",
    "standing",
]
