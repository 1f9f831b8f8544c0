"""The planner as a search for capacity at SLO (docs/planner.md, "The search").

``plan_pool`` decides every knob by rule and checks the plan against vLLM's pre-flight; it
is fast and needs no traffic. ``search`` starts from that plan and asks what the traffic
says: it varies the knobs that trade latency against capacity, keeps only candidates vLLM
would start (the analytic pre-flight), and ranks the rest by **capacity at SLO** (DistServe's
goodput, ``capacity.py``): the highest arrival rate of the pool's own traffic one replica
serves while the SLO's attainment target holds in steady state (95 % of the requests meet
both their TTFT and TPOT targets; refused and unfinished requests are misses), as a
``GoodputScorer`` (the simulator, replaying the pool's own traffic) predicts it.

1. **Candidates.** KV dtype (the widest allowed dtype of each precision class vLLM runs for
   this attention on this GPU, never below the quality floor, only where the KV-quality
   gate allows) x max-num-seqs (the concurrency the traffic needs by Little's law, arrival
   rate x the time a request spends in the engine at the SLO, 4x that, and the rules') x
   max-num-batched-tokens (512, 2K, 8K, 16K and the rules'); then CPU KV offload (off, and
   the policy's CPU budget as ``--kv-offloading-size``) for the best two, only where the
   policy gives a budget, the profile shows reuse a CPU tier could serve and prefix caching
   is on (the simulator's CPU tier, ``simulator/offload.py``); block size (the sizes the
   backend accepts) for the first rung's best, on the middle rung. Memory fraction,
   max-model-len and prefix caching stay as the rules chose them: more KV memory never
   lowers capacity in the simulator (the risk of a high fraction is an OOM it cannot
   score), and it charges nothing for prefix caching's hashing, so "on" would always win
   (docs/planner.md). A pin fixes its knob.
2. **Successive halving.** Every candidate replays a short prefix of the traffic (100
   requests), then 300, then the full sample (800). Each rung is a knockout
   (``capacity.knockout``, ``search_stages.py``): the most promising candidate climbs its
   own capacity ladder (to 8 %, to 2 % on the last rung) from where the shorter rungs put
   the best capacity, and every other one is replayed once at the best's rate, more only
   when it reaches it. The best third and the best candidate for every value of every knob
   go on to the middle rung, the best third to the last. Deterministic: the traffic is made
   once (seeded), candidates are taken in a fixed order.
3. **The order.** A candidate that misses the attainment target at the observed rate ranks
   below every one that meets it (unless none does); then higher capacity wins; capacities
   within ``CAPACITY_TIE`` of the best are a tie (simulation noise), broken by the wider
   KV precision (quality), then by fewer knobs changed from the running plan (stability;
   the rule-based plan when nothing runs), then by more headroom (the larger slack to the
   SLO targets at the observed rate). A plan that refuses more than 5 % of the requests
   (prompts over its max-model-len) misses the target at every rate: it cannot win.
4. **When the SLO is missed at the observed rate**: the best configuration's capacity and
   the replicas the traffic needs (``SLOAtRisk``); overload is never a tie, capacity ranks
   the candidates. When no configuration can meet it at any rate, the closed-form bound
   (``simulator/slo_bound.py``) says so before any of this runs.
5. **Within a budget** (``search_budget.py``): the meter is checked before every score; a
   spent budget ends the search with the best candidate of the last complete stage (and the
   scores of the current stage that compare with it), its reason in ``stopped_by``; that
   plan is then measured alone on the full stream within a grace (``GRACE_SHARE`` of the
   budget), so the capacity reported is the full stream's (``capacity_measured_requests``
   says which stream it is from when even the grace runs out).

Pure apart from the budget's meter (its clock and memory probe are the caller's): no I/O, no
randomness beyond the scorer's seeded traffic.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtune.tuner.plan import KVPlan, PoolPlan, Reason
from kvtune.tuner.plan_reuse import TierSize
from kvtune.tuner.planner import decide_block_size, decide_offload_size, reuse_money
from kvtune.tuner.planner.capacity import GoodputScore, GoodputScorer
from kvtune.tuner.planner.planning import plan_pool
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_budget import UNBOUNDED, BudgetMeter, BudgetStop
from kvtune.tuner.planner.search_front import pareto_front
from kvtune.tuner.planner.search_order import Scored, promote, strength, why_lost
from kvtune.tuner.planner.search_report import (
    budget_stop_message,
    pool_plan,
    slo_at_risk_message,
    summary,
)
from kvtune.tuner.planner.search_settings import (
    BLOCK_FINALISTS,
    CAPACITY_TIE,
    DEFAULT_SETTINGS,
    DEFAULT_TTFT_SECONDS,
    OFFLOAD_FINALISTS,
    SLO_ATTAINMENT,
    SearchProgress,
    SearchProgressHook,
    SearchSettings,
)
from kvtune.tuner.planner.search_space import (
    candidates,
    changed_knobs,
    grid,
    littles_law_sequences,
    offload_size,
    starts,
)
from kvtune.tuner.planner.search_stages import Book, Stages

# After a budget stop, the CPU seconds (a share of the budget, at least a few seconds) the
# search may still spend measuring the chosen plan on the full stream, so the capacity it
# reports is never a short stream's (which overstates it: 74.8 req/s on 100 requests of the
# chat profile at 5 req/s on an H100, 44.8 on all 800).
GRACE_SHARE = 0.25
GRACE_MIN_CPU_SECONDS = 5.0


def _halving(st: Stages, request: PlanRequest, pool: list[KVPlan], rungs: Sequence[int],
             start: KVPlan) -> None:
    """Successive halving over ``pool`` (module doc, 2); leaves the ranking in ``st``.
    ``start``: the plan measured first (the rules'). Block sizes for the best candidate of
    the first rung join the middle one (a replay of the whole stream costs ~1 CPU second;
    there they cost a third of that)."""
    settings = st.settings
    target = settings.slo_attainment
    survivors = [start, *(p for p in pool if p != start)] if start in pool else pool
    for i, n in enumerate(rungs):
        last = i == len(rungs) - 1
        if i > 0 and i == len(rungs) - 2:
            survivors += _block_sizes(st, request)
        st.partial, st.partial_n = [], n
        tol = settings.capacity_tolerance if last else settings.rung_tolerance
        # Off the last rung a candidate only needs ranking, to promote it: one replay at
        # the best's rate (``capacity.knockout``), its figures at the observed rate from a
        # higher rate it met (``capacity.observed_score``), none when it missed there.
        stage = SearchProgress("halving", 0, len(survivors), st.considered, i + 1, len(rungs))
        st.measure(survivors, n, tol, settings.tie if last else 0.0, final=last, stage=stage)
        st.rank(survivors, n, settle=last, final=last)
        if not last:
            survivors = promote(st.ranked, target,
                                champions=i < len(rungs) - 2 or len(rungs) < 3)


def _block_sizes(st: Stages, request: PlanRequest) -> list[KVPlan]:
    """The best candidate's other block sizes (its dtype's sizes the backend accepts)."""
    run = st.run
    extra: list[KVPlan] = []
    if run.pins.block_size is None:
        for x in st.ranked[:BLOCK_FINALISTS]:
            for bs in decide_block_size.candidates(run, x.plan.kv_cache_dtype):
                p = x.plan.model_copy(update={"block_size": bs})
                if p not in extra and all(p != y.plan for y in st.ranked) and starts(request, p):
                    extra.append(p)
    st.considered += len(extra)
    return extra


def _finalists(st: Stages, request: PlanRequest, rungs: Sequence[int],
               offload_gib: float | None) -> None:
    """CPU KV offload for the leaders on the full stream, and block size for the best when
    there was no middle rung to try them on (module doc, 1)."""
    n, tol, tie = rungs[-1], st.settings.capacity_tolerance, st.settings.tie
    if offload_gib is not None:
        leaders = [x.plan for x in st.ranked[:OFFLOAD_FINALISTS]]
        tried = decide_offload_size.tried(st.run, leaders, offload_gib)
        tried = [p for p in tried if all(p != y.plan for y in st.ranked)]
        st.considered += len(tried)
        st.measure([*leaders, *tried], n, tol, tie)
        st.rank([*(x.plan for x in st.ranked), *tried], n, settle=True)
    extra = _block_sizes(st, request) if len(rungs) < 3 else []
    if extra:
        st.measure([st.ranked[0].plan, *extra], n, tol, tie)
        st.rank([*(x.plan for x in st.ranked), *extra], n, settle=True)


def search(
    request: PlanRequest, scorer: GoodputScorer, running: KVPlan | None = None,
    settings: SearchSettings | None = None, progress: SearchProgressHook | None = None,
    replicas: int = 1, meter: BudgetMeter | None = None,
) -> PoolPlan:
    """Plan one pool by capacity at SLO (module doc). Raises what ``plan_pool`` raises.
    ``progress`` is told after every score (``SearchProgress``). ``scorer`` replays one
    replica's share of the traffic; ``replicas``: how many share it (the replicas needed
    are counted against all of it). ``meter``: the budget (``search_budget``); when it is
    spent the best plan so far comes back with ``stopped_by``, its capacity measured on the
    full stream when a short grace allows (else said to be a short stream's);
    ``SearchBudgetSpent`` when nothing was scored, ``SearchCancelled`` when told to stop."""
    settings = settings or DEFAULT_SETTINGS
    base_pool = plan_pool(request)
    base = base_pool.plan
    run = PlanRun(request)
    offload_gib = offload_size(run, base)
    if offload_gib is not None:
        # Offload is searched: the halving runs without it (the simpler plan; ties keep it),
        # the finalists try it.
        base = base.with_offload(None)
    rate = scorer.rate_per_second
    book = Book(scorer, request, meter or UNBOUNDED.start())
    rungs = sorted({min(n, scorer.max_requests) for n in settings.rungs})
    pool = [p for p in candidates(run, base, rate, settings) if starts(request, p)]
    if base not in pool:
        pool.insert(0, base)
    st = Stages(run, book, settings, running or base, progress, considered=len(pool))
    stopped: str | None = None
    try:
        _halving(st, request, pool, rungs, base)
        _finalists(st, request, rungs, offload_gib)
    except BudgetStop as exc:
        stopped = exc.reason
        st.salvage(exc.reason)
    final_n = st.ranked_n
    reference = "running plan" if running is not None else "rules' plan"
    best = st.ranked[0]
    if stopped is not None and final_n < rungs[-1]:
        best = _measured_in_grace(st, best, rungs[-1])
    offload_reason: Reason | None = None
    tiers: tuple[TierSize, ...] = ()
    try:
        if offload_gib is not None and stopped is None:
            offload_reason, tiers = _offload_reason(st, best, offload_gib, final_n, rate)
        if stopped is None:
            _runners_up(st, final_n)
    except BudgetStop as exc:
        stopped = stopped or (exc.reason if offload_reason is None and offload_gib else None)
    ranked = [best, *(x for x in st.ranked if x.plan != best.plan)]
    for x in ranked[1:]:
        x.lost = why_lost(x, best, run, settings, rate, reference)
    figures = summary(request, best, ranked, settings, rate, replicas,
                      book.simulated_requests, final_n, st.considered, reference, stopped,
                      best.score.requests)
    figures = figures.model_copy(update={"reuse": reuse_money.figures(
        run, best.plan, best.score, figures.observed_rate_per_second, tiers)})
    return pool_plan(run, base_pool, best, figures, offload_reason)


def _runners_up(st: Stages, n: int) -> None:
    """The candidates the knockout put out on the full stream after one replay, scored at
    the observed rate, the closest first, until the summary has its alternatives (the runners-
    up ``kvtune plan`` shows): their capacity is then the highest rate they met (the observed
    one, or none), with the rate they missed in ``why_lost``."""
    target = st.settings.slo_attainment
    wanted = st.settings.alternatives + 1 - len(st.ranked)
    out = [p for (p, m), scores in st.book.by_plan.items()
           if m == n and scores and 1.0 not in scores]
    out.sort(key=lambda p: strength(st.book.standing(p, n, target), target), reverse=True)
    for p in out[:max(0, wanted)]:
        st.book.score(p, n)
        st.rank([*(x.plan for x in st.ranked), p], n)


def _measured_in_grace(st: Stages, best: Scored, n: int) -> Scored:
    """The chosen plan measured on all ``n`` requests within a grace of the budget (module
    doc, 5); ``best`` as it stood on the short stream when the grace runs out too."""
    meter = st.book.meter
    budget = meter.budget.cpu_seconds
    grace = max(GRACE_MIN_CPU_SECONDS, GRACE_SHARE * budget) if budget is not None else 0.0
    meter.grant(grace)
    try:
        full = st.measure_alone(best.plan, n)
    except BudgetStop:
        return best
    return Scored(best.plan, full, best.changed)


def _offload_reason(st: Stages, best: Scored, budget_gib: float, n: int, rate: float
                   ) -> tuple[Reason, tuple[TierSize, ...]]:
    """How many GiB of CPU tier pay and why (``decide_offload_size``): the chosen plan's
    capacity at SLO without a tier and at every size tried, on the full stream (a knockout
    among them that reuses the search's scores; a size it put out after one replay is
    quoted as under the rate it missed)."""
    sizes = decide_offload_size.options(st.run, best.plan.with_offload(None), budget_gib)
    plans = [best.plan.with_offload(size) for size in (None, *(o.size_gib for o in sizes))]
    st.measure(plans, n, st.settings.capacity_tolerance, st.settings.tie)
    target = st.settings.slo_attainment
    for p in plans:
        st.book.score(p, n)  # its figures at the observed rate (cached for the finalists)
    rows = decide_offload_size.tier_sizes(
        sizes, [st.book.standing(p, n, target) for p in plans], rate,
        best.plan.kv_offloading_size_gib or 0.0, target, st.settings.tie)
    return decide_offload_size.explain(st.run, best.plan, rows, st.settings.tie, n), rows


__all__ = [
    "CAPACITY_TIE",
    "DEFAULT_SETTINGS",
    "DEFAULT_TTFT_SECONDS",
    "SLO_ATTAINMENT",
    "GoodputScore",
    "GoodputScorer",
    "SearchProgress",
    "SearchProgressHook",
    "SearchSettings",
    "budget_stop_message",
    "changed_knobs",
    "grid",
    "littles_law_sequences",
    "pareto_front",
    "search",
    "slo_at_risk_message",
]
