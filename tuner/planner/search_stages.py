"""The capacity search's book of scores and its state between stages (``search.py``).

``Book`` takes every score once (keyed by plan, stream length and rate scale) under the
budget's meter. ``Stages`` holds the ranking so far and measures groups of candidates with
``capacity.knockout``, starting each ladder where the shorter streams predict the capacity.
Pure apart from the budget's meter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.capacity import (
    GoodputScore,
    GoodputScorer,
    Standing,
    knockout,
    settle_ties,
    standing,
)
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_budget import UNBOUNDED, BudgetMeter, SearchBudgetSpent
from kvtune.tuner.planner.search_order import Scored, order, strength
from kvtune.tuner.planner.search_settings import (
    SearchProgress,
    SearchProgressHook,
    SearchSettings,
)
from kvtune.tuner.planner.search_space import changed_knobs

# Where a ladder starts on a longer stream when only one shorter one was measured: a short
# stream overstates capacity (less time for a queue to build; the chat profile at 5 req/s on
# an H100 loses ~25 % from 100 to 300 requests), so it walks down from there.
_FIRST_SHRINK = 0.8


@dataclass(slots=True)
class Book:
    """Every score taken, keyed by plan, stream length and rate scale, so a plan is never
    replayed twice; indexed by (plan, stream length) for the capacity ladder."""

    scorer: GoodputScorer
    request: PlanRequest
    meter: BudgetMeter = field(default_factory=UNBOUNDED.start)
    by_plan: dict[tuple[KVPlan, int], dict[float, GoodputScore]] = field(default_factory=dict)
    simulated_requests: int = 0

    def score(self, plan: KVPlan, n: int, rate_scale: float = 1.0) -> GoodputScore:
        scales = self.by_plan.setdefault((plan, n), {})
        got = scales.get(rate_scale)
        if got is None:
            self.meter.check()  # raises BudgetStop (or SearchCancelled) before the work
            got = self.scorer.score(self.request, plan, n, rate_scale)
            scales[rate_scale] = got
            self.simulated_requests += got.requests
        return got

    def has(self, plan: KVPlan, n: int, observed: bool = True) -> bool:
        """Scored at the observed rate on ``n`` requests (its figures are reported), or,
        with ``observed`` off, scored there at all."""
        scores = self.by_plan.get((plan, n), {})
        return 1.0 in scores if observed else bool(scores)

    def standing(self, plan: KVPlan, n: int, target: float) -> Standing:
        return standing(self.by_plan[(plan, n)], target)


@dataclass(slots=True)
class Stages:
    """The search's state between stages: what is ranked so far (one stream length), and
    the plans of the stage in progress, so a spent budget keeps whatever compares."""

    run: PlanRun
    book: Book
    settings: SearchSettings
    reference: KVPlan
    progress: SearchProgressHook | None
    ranked: list[Scored] = field(default_factory=list)
    ranked_n: int = 0
    partial: list[KVPlan] = field(default_factory=list)
    partial_n: int = 0
    considered: int = 0
    # The best capacity's bracket per stream length measured (lower, upper scale).
    brackets: dict[int, tuple[float, float]] = field(default_factory=dict)

    def observe(self, plans: Sequence[KVPlan], n: int, stage: SearchProgress) -> None:
        """Every plan at the observed rate (the constraint), told one by one."""
        self.partial, self.partial_n = list(plans), n
        for i, p in enumerate(plans):
            self.book.score(p, n)
            self._tell(SearchProgress(
                stage=stage.stage, done=i + 1, total=len(plans), candidates=stage.candidates,
                round=stage.round, rounds=stage.rounds, requests=n))

    def _tell(self, progress: SearchProgress) -> None:
        if self.progress is not None:
            self.progress(progress)

    def measure(self, plans: Sequence[KVPlan], n: int, tolerance: float, band: float,
                final: bool = True, stage: SearchProgress | None = None) -> None:
        """The best capacity among ``plans`` (``capacity.knockout``, most promising first:
        by their standing on the longest shorter stream, else in the given order).
        ``stage``: told as each candidate is first replayed (a halving round), then every
        other replay as a ladder's probe."""
        self.partial, self.partial_n = list(dict.fromkeys([*self.partial, *plans])), n
        done = 0
        reached: set[KVPlan] = set()

        def score(plan: KVPlan, m: int, scale: float) -> GoodputScore:
            nonlocal done
            fresh = scale not in self.book.by_plan.get((plan, m), {})
            got = self.book.score(plan, m, scale)
            if stage is not None and plan not in reached:
                reached.add(plan)
                self._tell(SearchProgress(
                    stage=stage.stage, done=len(reached), total=len(plans),
                    candidates=stage.candidates, round=stage.round, rounds=stage.rounds,
                    requests=m))
            elif fresh:
                done += 1
                self._tell(SearchProgress("capacity", done, 0, self.considered,
                                          requests=m, rate_scale=scale))
            return got

        target = self.settings.slo_attainment
        ordered = self._promising_first(plans, n)
        # A stream measured already (a later stage: offload) has its best first.
        b = knockout(score, ordered, n, target, tolerance, band, self.hints(n), final,
                     screen=n not in self.brackets)
        self.brackets[n] = (b.lower, b.upper)

    def _promising_first(self, plans: Sequence[KVPlan], n: int) -> list[KVPlan]:
        """``plans`` by their standing on ``n`` requests where they have one, else on the
        longest shorter stream they were ranked on, else in the given order."""
        target = self.settings.slo_attainment
        shorter = [m for m in self.brackets if m <= n]

        def key(i_p: tuple[int, KVPlan]) -> tuple[object, ...]:
            i, p = i_p
            for m in sorted(shorter, reverse=True):
                if self.book.has(p, m, observed=False):
                    return (-m, tuple(-x for x in strength(self.book.standing(p, m, target),
                                                           target)), i)
            return (1, (), i)

        return [p for _, p in sorted(enumerate(plans), key=key)]

    def hints(self, n: int) -> tuple[float, ...]:
        """Where the ladder on ``n`` requests starts: this stream's bracket when measured,
        else a prediction from the shorter ones (each longer stream loses capacity at the
        rate the last two showed, per factor of length), and steps below it."""
        if n in self.brackets:
            lo, hi = self.brackets[n]
            return (lo, hi) if lo > 0 else ()
        shorter = sorted(m for m in self.brackets if m < n and self.brackets[m][0] > 0)
        if not shorter:
            lo, hi = next(iter(self.brackets.values()), (0.0, math.inf))
            return (hi / 2, hi / 4) if lo <= 0 < hi < math.inf else ()
        m2 = shorter[-1]
        lo = self.brackets[m2][0]
        shrink = _FIRST_SHRINK ** (math.log(n / m2) / math.log(3))
        if len(shorter) >= 2:
            m1 = shorter[-2]
            ratio = min(1.0, lo / self.brackets[m1][0])
            shrink = ratio ** (math.log(n / m2) / math.log(m2 / m1))
        guess = lo * shrink
        return (guess, guess * 1.05, guess * 0.92, guess * 0.8, guess * 0.65, guess * 0.5,
                lo, lo * 1.5)

    def rank(self, plans: Sequence[KVPlan], n: int, settle: bool = False,
             final: bool = True) -> None:
        """Rank ``plans`` by their standing on ``n`` requests; ``settle``: probe first the
        candidates undecided at the edge of the tie band. ``final``: only the ones with
        figures at the observed rate (the others lost at the edge of the best's band)."""
        target = self.settings.slo_attainment
        plans = list(dict.fromkeys(p for p in plans if self.book.has(p, n, final)))
        standings = {p: self.book.standing(p, n, target) for p in plans}
        if settle:
            feasible = [p for p in plans if standings[p].meets_observed(target)] or plans
            top = max(standings[p].lower_scale for p in feasible)
            settle_ties(self.book.score, feasible, n, target, top, self.settings.tie,
                        standings)
            standings = {p: self.book.standing(p, n, target) for p in plans}
        items = [Scored(p, standings[p], changed_knobs(p, self.reference)) for p in plans]
        self.ranked, self.ranked_n = order(items, self.run, self.settings), n
        self.partial = []

    def salvage(self, reason: str) -> None:
        """After ``BudgetStop``: the last ranking plus the current stage's plans scored on
        the same stream length; nothing scored at all is ``SearchBudgetSpent``."""
        # Off the last rung some were not scored at the observed rate: rank them all.
        if self.ranked and self.partial_n == self.ranked_n:
            self.rank([*(x.plan for x in self.ranked), *self.partial], self.ranked_n,
                      final=False)
        elif not self.ranked and self.partial:
            self.rank(self.partial, self.partial_n, final=False)
        if not self.ranked:
            raise SearchBudgetSpent(reason)

    def measure_alone(self, plan: KVPlan, n: int) -> Standing:
        """One plan's capacity on ``n`` requests (its own ladder, from the predicted scale)."""
        self.measure([plan], n, self.settings.capacity_tolerance, self.settings.tie)
        return self.book.standing(plan, n, self.settings.slo_attainment)


__all__ = ["Book", "Stages"]
