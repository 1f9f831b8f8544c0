"""The capacity search's order (``search.py``, step 3): which candidate wins, which go on to
the next rung, and why each loser lost. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner import decide_max_num_seqs
from kvtune.tuner.planner.capacity import GoodputScore, Standing
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_settings import (
    DEFAULT_TTFT_SECONDS,
    KEEP_FRACTION,
    SearchSettings,
)
from kvtune.tuner.planner.search_space import SEARCHED, precision_bits


@dataclass(slots=True)
class Scored:
    """One candidate's standing on one stream length, and the knobs it changes."""

    plan: KVPlan
    standing: Standing
    changed: tuple[str, ...]
    lost: str = ""

    @property
    def score(self) -> GoodputScore:
        """The figures at the observed rate."""
        return self.standing.at_observed


def slack(score: GoodputScore, request: PlanRequest) -> float:
    """How far the p95 latencies stay below their targets (higher: more headroom)."""
    slo = request.policy.slo
    ttft = slo.ttft_p95_seconds or DEFAULT_TTFT_SECONDS
    tpot = slo.tpot_p95_seconds or decide_max_num_seqs.DEFAULT_TPOT_SECONDS
    worst = max(score.ttft_p95_seconds / ttft, score.tpot_p95_seconds / tpot)
    return -worst if math.isfinite(worst) else -math.inf


def order(items: Sequence[Scored], run: PlanRun, settings: SearchSettings) -> list[Scored]:
    """Best first (``search.py`` module doc, 3): meeting the target at the observed rate
    (when any does), then capacity, within a tie of the best: wider precision, fewer changed
    knobs, more headroom. Candidates outside the tie band follow by capacity, then by how
    close they came where they dropped off the ladder."""
    if not items:
        return []
    target, tie = settings.slo_attainment, settings.tie
    any_meets = any(x.standing.meets_observed(target) for x in items)

    def feasible(x: Scored) -> bool:
        return x.standing.meets_observed(target) or not any_meets

    top = max((x.standing.lower_scale for x in items if feasible(x)), default=0.0)

    def key(x: Scored) -> tuple[float, ...]:
        st = x.standing
        ok = feasible(x)
        tied = ok and top > 0 and st.lower_scale >= top * (1.0 - tie)
        if tied:
            return (0.0, 0.0, -precision_bits(run, x.plan.kv_cache_dtype),
                    float(len(x.changed)), x.plan.kv_offloading_size_gib or 0.0,
                    -slack(x.score, run.req), -st.lower_scale)
        return (0.0 if ok else 1.0, 1.0, -st.lower_scale, -st.attainment_at_upper,
                -st.at_observed.slo_attainment, -slack(x.score, run.req))

    return sorted(items, key=key)


def strength(st: Standing, target: float) -> tuple[float, ...]:
    """Capacity alone, for promotion and for the finals' order: meeting the target at the
    observed rate, the highest rate met, how close it came where it dropped out."""
    return (1.0 if st.meets_observed(target) else 0.0, st.lower_scale,
            st.attainment_at_upper, st.at_observed.slo_attainment)


def promote(ranked: Sequence[Scored], target: float, champions: bool = True
            ) -> list[KVPlan]:
    """The candidates that go on to the next, longer stream: the best third, and (with
    ``champions``: to every rung but the last) the best candidate for every value of every
    knob searched. A short stream shows where the SLO breaks first, not how far a queue
    grows later (under overload a larger batched-token budget can lose on 450 requests and
    win on 1,200): no value of a knob is dropped on the first, shortest stream alone; the
    last rung (a replay of the whole stream costs ~1 CPU second) takes the best third of
    the middle one."""
    k = max(2, math.ceil(len(ranked) / KEEP_FRACTION))
    # By capacity alone: the tie rules (precision, stability) decide only among the
    # finalists; applied here they would promote a tied 16-bit candidate over the fp8 one
    # with the same other knobs, which may pull ahead on the longer stream.
    by_capacity = sorted(ranked, key=lambda x: strength(x.standing, target), reverse=True)
    out = [x.plan for x in by_capacity[:k]]
    if not champions:
        return out
    for knob in SEARCHED:
        best_of: dict[object, KVPlan] = {}
        for x in by_capacity:  # best first
            best_of.setdefault(getattr(x.plan, knob), x.plan)
        out += [p for p in best_of.values() if p not in out]
    return out


def why_lost(loser: Scored, best: Scored, run: PlanRun, settings: SearchSettings,
             rate: float, reference: str) -> str:
    """One phrase: why ``loser`` ranks below ``best``."""
    target, tie = settings.slo_attainment, settings.tie
    ls, bs = loser.standing, best.standing
    if bs.meets_observed(target) and not ls.meets_observed(target):
        return (f"misses the SLO at the observed rate ({ls.at_observed.slo_attainment:.1%} of "
                f"requests meet it, needs {target:.0%})")
    if ls.lower_scale < bs.lower_scale * (1.0 - tie) or bs.lower_scale == 0:
        return (f"lower capacity at SLO (misses it at {rate * ls.upper_scale:.2f} req/s; the "
                f"chosen one sustains {rate * bs.lower_scale:.2f})")
    lb, bb = (precision_bits(run, loser.plan.kv_cache_dtype),
              precision_bits(run, best.plan.kv_cache_dtype))
    if lb < bb:
        return f"tied on capacity; {bb}-bit KV keeps more precision than {lb}-bit"
    if len(loser.changed) > len(best.changed):
        return (f"tied on capacity; changes {len(loser.changed)} knobs from the {reference}, "
                f"the chosen one {len(best.changed)}")
    return "tied on capacity; less headroom to the SLO targets"


__all__ = ["Scored", "order", "promote", "slack", "strength", "why_lost"]
