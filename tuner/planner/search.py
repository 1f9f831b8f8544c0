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
   reuse-sized ones and the budget: ``decide_offload_size``) for the best two, only where the
   policy gives a budget, the profile shows reuse a CPU tier could serve and prefix caching
   is on (the simulator's CPU tier, ``simulator/offload.py``); then block size (the sizes
   the backend accepts) for the best one. Memory fraction, max-model-len and prefix caching
   stay as the rules chose them: more KV memory never lowers capacity in the simulator (the
   risk of a high fraction is an OOM it cannot score), and it charges nothing for prefix
   caching's hashing, so "on" would always win (docs/planner.md). A pin fixes its knob.
2. **Successive halving.** Every candidate replays a short prefix of the traffic (100
   requests) at the observed rate, and the capacity ladder (``capacity.climb``) measures
   the group's capacity on it (to 8 %); the best third (by the order below) and the best
   candidate for every value of every knob go on to a 3x longer one, whose ladder starts
   from the shorter one's bracket, and so on up to the full sample (800 requests, capacity
   to 2 %). Deterministic: the traffic is made once (seeded), candidates are taken in a
   fixed order.
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
   scores of the current stage that compare with it), its reason in ``stopped_by``.

Pure apart from the budget's meter (its clock and memory probe are the caller's): no I/O, no
randomness beyond the scorer's seeded traffic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kvtune.tuner import knobs, kv_quality
from kvtune.tuner.plan import (
    ExpectedFigures,
    KVPlan,
    PoolPlan,
    Reason,
    SearchAlternative,
    SearchSummary,
)
from kvtune.tuner.plan_reuse import TierSize
from kvtune.tuner.planner import (
    decide_block_size,
    decide_dtype,
    decide_max_num_seqs,
    decide_offload_size,
    decide_prefix_offload,
    expected,
    kv_dtype_options,
    reuse_money,
)
from kvtune.tuner.planner.capacity import (
    Bracket,
    GoodputScore,
    GoodputScorer,
    Standing,
    climb,
    replicas_needed,
    settle_ties,
    standing,
)
from kvtune.tuner.planner.planning import plan_pool, preflight
from kvtune.tuner.planner.planrun import MAX_NUM_SEQS_CEILING, PlanRun
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_budget import (
    UNBOUNDED,
    BudgetMeter,
    BudgetStop,
    SearchBudgetSpent,
)
from kvtune.tuner.planner.search_front import pareto_front
from kvtune.tuner.planner.search_reasons import told_for_final

# Capacities within 2% of the best are a tie: the spread of repeated simulations with
# different seeds on the shipped traces (bench/oracle.py) stays under it, and the final
# ladder measures capacity to within it.
CAPACITY_TIE = 0.02
# The targets are p95 targets: the SLO holds when 95% of the requests meet both.
SLO_ATTAINMENT = 0.95
# max-num-batched-tokens candidates besides the rule's (vLLM's defaults are 2K/8K/16K). 512:
# when compute binds, a step carrying a large prefill chunk stalls every decoding request
# (8K tokens of an 8B model: ~0.2 s on an H100), and a small budget piggybacks prefill on
# memory-bound decode steps instead (Sarathi-Serve's stall-free batching): on Azure at 5x
# on an H100 (bench/oracle.py, compute-bound) TPOT p95 falls from 50 to 16 ms and every
# request meets the SLO, where 2K leaves 5 % short.
BATCHED_TOKENS = (512, 2048, 8192, 16384)
# Rung sizes of the successive halving, in requests of the traffic (the last: everything).
RUNGS = (100, 300, 800)
KEEP_FRACTION = 3  # keep the best third at each rung
# Block sizes tried for the best few after the first pass.
BLOCK_FINALISTS = 1
# Candidates that also try CPU KV offload (when it is searched at all, ``_offload_size``).
OFFLOAD_FINALISTS = 2
# Default targets when the policy sets none (the rule-based planner's defaults).
DEFAULT_TTFT_SECONDS = 2.0


@dataclass(slots=True)
class _Scored:
    plan: KVPlan
    standing: Standing
    changed: tuple[str, ...]
    lost: str = ""

    @property
    def score(self) -> GoodputScore:
        """The figures at the observed rate."""
        return self.standing.at_observed


@dataclass(frozen=True, slots=True)
class SearchSettings:
    rungs: tuple[int, ...] = RUNGS
    tie: float = CAPACITY_TIE
    slo_attainment: float = SLO_ATTAINMENT
    # How close the ladder brackets the best capacity: on the last rung (the figure the
    # plan reports, and the replicas needed), and on the shorter ones (only to promote).
    capacity_tolerance: float = CAPACITY_TIE
    rung_tolerance: float = 0.08
    alternatives: int = 3
    batched_tokens: tuple[int, ...] = BATCHED_TOKENS


DEFAULT_SETTINGS = SearchSettings()


@dataclass(frozen=True, slots=True)
class SearchProgress:
    """Where a running search is, for a caller that shows it (``kvtune plan`` on stderr):
    ``done`` of ``total`` scores taken in the current stage (``capacity``: probes of the
    ladder so far, no total). The search takes seconds; it reports after every score and
    never reads a clock."""

    stage: Literal["halving", "offload", "block size", "capacity"]
    done: int
    total: int
    candidates: int  # candidates that passed pre-flight
    round: int = 0  # successive-halving round, from 1
    rounds: int = 0
    requests: int = 0  # requests each score replays
    rate_scale: float = 1.0  # capacity: the rate probed, as a multiple of the observed one

    def text(self) -> str:
        if self.stage == "halving":
            return (f"searching {self.candidates} candidates: {self.done}/{self.total} "
                    f"(successive halving round {self.round}/{self.rounds}, "
                    f"{self.requests} requests each)")
        if self.stage == "offload":
            return (f"trying CPU KV offload on the best candidates: {self.done}/{self.total} "
                    f"({self.requests} requests each)")
        if self.stage == "block size":
            return (f"trying block sizes on the best candidate: {self.done}/{self.total} "
                    f"({self.requests} requests each)")
        return (f"measuring capacity at SLO: {self.done} scores, now at {self.rate_scale:.3g}x "
                f"the observed rate ({self.requests} requests each)")


SearchProgressHook = Callable[[SearchProgress], None]


@dataclass(slots=True)
class _Book:
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

    def has(self, plan: KVPlan, n: int) -> bool:
        """Scored at the observed rate on ``n`` requests."""
        return 1.0 in self.by_plan.get((plan, n), {})

    def standing(self, plan: KVPlan, n: int, target: float) -> Standing:
        return standing(self.by_plan[(plan, n)], target)


# The knobs the halving varies (block size is tried on the finalists).
_SEARCHED = ("kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens")
_KNOBS = ("kv_cache_dtype", "block_size", "max_num_seqs", "max_num_batched_tokens",
          "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len",
          "enable_prefix_caching", "kv_offloading_size_gib")


def changed_knobs(plan: KVPlan, reference: KVPlan | None) -> tuple[str, ...]:
    """The vLLM flags (dashed) whose value differs from ``reference``."""
    if reference is None:
        return ()
    return tuple(knobs.BY_NAME[k].flag for k in _KNOBS
                 if getattr(plan, k) != getattr(reference, k))


def littles_law_sequences(request: PlanRequest, rate_per_second: float) -> int:
    """Sequences in the engine at once (L = lambda x W): the arrival rate times the time a
    median request spends there when it just meets the targets (TTFT, then its output at
    the TPOT target)."""
    slo = request.policy.slo
    ttft = slo.ttft_p95_seconds or DEFAULT_TTFT_SECONDS
    tpot = slo.tpot_p95_seconds or decide_max_num_seqs.DEFAULT_TPOT_SECONDS
    outputs = request.profile.output_tokens
    mean_output = (outputs.p50 + outputs.p95) / 2  # a skewed mean, from two quantiles
    return max(1, math.ceil(rate_per_second * (ttft + mean_output * tpot)))


def _round8(n: float) -> int:
    return int(max(8, min(MAX_NUM_SEQS_CEILING, 8 * math.ceil(n / 8))))


def _precision_bits(run: PlanRun, dtype: str) -> int:
    return run.runtime.dtype(dtype).bits


def _dtypes(run: PlanRun) -> list[str]:
    """The widest allowed dtype of each precision class (16, 8, 4 bits), widest first."""
    if run.pins.kv_cache_dtype is not None:
        return [run.pins.kv_cache_dtype]
    out: list[str] = []
    bits_seen: set[int] = set()
    skip = kv_dtype_options.aliases(run)
    for name in kv_dtype_options.allowed(run):
        if name in skip:
            continue
        bits = _precision_bits(run, name)
        if bits not in bits_seen:
            bits_seen.add(bits)
            out.append(name)
    return out


def _candidates(run: PlanRun, base: KVPlan, rate: float, settings: SearchSettings
                ) -> list[KVPlan]:
    pins = run.pins
    little = littles_law_sequences(run.req, rate)
    if pins.max_num_seqs is not None:
        seqs = [pins.max_num_seqs]
    else:
        seqs = sorted({_round8(little), _round8(4 * little), base.max_num_seqs})
    if pins.max_num_batched_tokens is not None:
        batched = [pins.max_num_batched_tokens]
    else:
        batched = sorted({*settings.batched_tokens, base.max_num_batched_tokens})
    out: list[KVPlan] = []
    for dtype in _dtypes(run):
        bs = pins.block_size or (base.block_size if dtype == base.kv_cache_dtype
                                 else run.backends.smallest_block(dtype))
        bs = decide_block_size.hybrid_forced(run, dtype, bs) or bs
        for s in seqs:
            for b in batched:
                plan = base.model_copy(update={
                    "kv_cache_dtype": dtype, "block_size": bs, "max_num_seqs": s,
                    # vLLM refuses fewer batched tokens than sequences.
                    "max_num_batched_tokens": max(b, s),
                })
                if plan not in out:
                    out.append(plan)
    return out


def _offload_size(run: PlanRun, base: KVPlan) -> float | None:
    """The ``--kv-offloading-size`` the search tries besides off, or None when offload is
    not searched: pinned, no CPU budget of at least 1 GiB, prefix caching off (the tier is
    keyed by its hashes), no reuse in the profile, or a GPU class without a host-link fact
    (nothing to time the loads with)."""
    if run.pins.kv_offloading_size_gib is not None or not base.enable_prefix_caching:
        return None
    if run.req.gpu.host_link_bytes_per_second is None:
        return None
    size = decide_prefix_offload.budget_size_gib(run)
    if size < 1 or not decide_prefix_offload.shares_prefixes(run):
        return None
    return float(size)


def _starts(request: PlanRequest, plan: KVPlan) -> bool:
    ok, _, _ = preflight(request, plan)
    return ok


def _slack(score: GoodputScore, request: PlanRequest) -> float:
    """How far the p95 latencies stay below their targets (higher: more headroom)."""
    slo = request.policy.slo
    ttft = slo.ttft_p95_seconds or DEFAULT_TTFT_SECONDS
    tpot = slo.tpot_p95_seconds or decide_max_num_seqs.DEFAULT_TPOT_SECONDS
    worst = max(score.ttft_p95_seconds / ttft, score.tpot_p95_seconds / tpot)
    return -worst if math.isfinite(worst) else -math.inf


def _order(items: Sequence[_Scored], run: PlanRun, settings: SearchSettings
           ) -> list[_Scored]:
    """Best first (module doc, 3): meeting the target at the observed rate (when any
    does), then capacity, within a tie of the best: wider precision, fewer changed knobs,
    more headroom. Candidates outside the tie band follow by capacity, then by how close
    they came where they dropped off the ladder."""
    if not items:
        return []
    target, tie = settings.slo_attainment, settings.tie
    any_meets = any(x.standing.meets_observed(target) for x in items)

    def feasible(x: _Scored) -> bool:
        return x.standing.meets_observed(target) or not any_meets

    top = max((x.standing.lower_scale for x in items if feasible(x)), default=0.0)

    def key(x: _Scored) -> tuple[float, ...]:
        st = x.standing
        ok = feasible(x)
        tied = ok and top > 0 and st.lower_scale >= top * (1.0 - tie)
        if tied:
            return (0.0, 0.0, -_precision_bits(run, x.plan.kv_cache_dtype),
                    float(len(x.changed)), x.plan.kv_offloading_size_gib or 0.0,
                    -_slack(x.score, run.req), -st.lower_scale)
        return (0.0 if ok else 1.0, 1.0, -st.lower_scale, -st.attainment_at_upper,
                -st.at_observed.slo_attainment, -_slack(x.score, run.req))

    return sorted(items, key=key)


def _strength(x: _Scored, target: float) -> tuple[float, ...]:
    st = x.standing
    return (1.0 if st.meets_observed(target) else 0.0, st.lower_scale,
            st.attainment_at_upper, st.at_observed.slo_attainment)


def _promote(ranked: Sequence[_Scored], target: float) -> list[KVPlan]:
    """The candidates that go on to the next, longer stream: the best third, and the best
    candidate for every value of every knob searched. A short stream shows where the SLO
    breaks first, not how far a queue grows later (under overload a larger batched-token
    budget can lose on 450 requests and win on 1,200): no value of a knob is dropped on a
    short stream alone."""
    k = max(2, math.ceil(len(ranked) / KEEP_FRACTION))
    # By capacity alone: the tie rules (precision, stability) decide only among the
    # finalists; applied here they would promote a tied 16-bit candidate over the fp8 one
    # with the same other knobs, which may pull ahead on the longer stream.
    by_capacity = sorted(ranked, key=lambda x: _strength(x, target), reverse=True)
    out = [x.plan for x in by_capacity[:k]]
    for knob in _SEARCHED:
        champions: dict[object, KVPlan] = {}
        for x in by_capacity:  # best first
            champions.setdefault(getattr(x.plan, knob), x.plan)
        out += [p for p in champions.values() if p not in out]
    return out


def _why_lost(loser: _Scored, best: _Scored, run: PlanRun, settings: SearchSettings,
              rate: float, reference: str) -> str:
    target, tie = settings.slo_attainment, settings.tie
    ls, bs = loser.standing, best.standing
    if bs.meets_observed(target) and not ls.meets_observed(target):
        return (f"misses the SLO at the observed rate ({ls.at_observed.slo_attainment:.1%} of "
                f"requests meet it, needs {target:.0%})")
    if ls.lower_scale < bs.lower_scale * (1.0 - tie) or bs.lower_scale == 0:
        return (f"lower capacity at SLO (misses it at {rate * ls.upper_scale:.2f} req/s; the "
                f"chosen one sustains {rate * bs.lower_scale:.2f})")
    lb, bb = (_precision_bits(run, loser.plan.kv_cache_dtype),
              _precision_bits(run, best.plan.kv_cache_dtype))
    if lb < bb:
        return f"tied on capacity; {bb}-bit KV keeps more precision than {lb}-bit"
    if len(loser.changed) > len(best.changed):
        return (f"tied on capacity; changes {len(loser.changed)} knobs from the {reference}, "
                f"the chosen one {len(best.changed)}")
    return "tied on capacity; less headroom to the SLO targets"


@dataclass(slots=True)
class _Stages:
    """The search's state between stages: what is ranked so far (one stream length), and
    the plans of the stage in progress, so a spent budget keeps whatever compares."""

    run: PlanRun
    book: _Book
    settings: SearchSettings
    reference: KVPlan
    progress: SearchProgressHook | None
    ranked: list[_Scored] = field(default_factory=list)
    ranked_n: int = 0
    partial: list[KVPlan] = field(default_factory=list)
    partial_n: int = 0
    considered: int = 0
    bracket: Bracket = field(default_factory=lambda: Bracket(0.0, math.inf))

    def observe(self, plans: Sequence[KVPlan], n: int, stage: SearchProgress) -> None:
        """Every plan at the observed rate (the constraint), told one by one."""
        self.partial, self.partial_n = list(plans), n
        for i, p in enumerate(plans):
            self.book.score(p, n)
            if self.progress is not None:
                self.progress(SearchProgress(
                    stage=stage.stage, done=i + 1, total=len(plans),
                    candidates=stage.candidates, round=stage.round, rounds=stage.rounds,
                    requests=n))

    def measure(self, plans: Sequence[KVPlan], n: int, tolerance: float,
                hints: Sequence[float]) -> None:
        """The capacity ladder over ``plans`` (``capacity.climb``)."""
        done = 0

        def score(plan: KVPlan, m: int, scale: float) -> GoodputScore:
            nonlocal done
            fresh = scale not in self.book.by_plan.get((plan, m), {})
            got = self.book.score(plan, m, scale)
            if fresh and self.progress is not None:
                done += 1
                self.progress(SearchProgress("capacity", done, 0, self.considered,
                                             requests=m, rate_scale=scale))
            return got

        target = self.settings.slo_attainment
        self.bracket = climb(score, plans, n, target, tolerance, hints)

    def rank(self, plans: Sequence[KVPlan], n: int, settle: bool = False) -> None:
        """Rank ``plans`` by their standing on ``n`` requests; ``settle``: probe first the
        candidates undecided at the edge of the tie band."""
        target = self.settings.slo_attainment
        plans = list(dict.fromkeys(p for p in plans if self.book.has(p, n)))
        standings = {p: self.book.standing(p, n, target) for p in plans}
        if settle:
            feasible = [p for p in plans if standings[p].meets_observed(target)] or plans
            top = max(standings[p].lower_scale for p in feasible)
            settle_ties(self.book.score, feasible, n, target, top, self.settings.tie,
                        standings)
            standings = {p: self.book.standing(p, n, target) for p in plans}
        items = [_Scored(p, standings[p], changed_knobs(p, self.reference)) for p in plans]
        self.ranked, self.ranked_n = _order(items, self.run, self.settings), n
        self.partial = []

    def hints(self) -> tuple[float, ...]:
        """Where the next ladder starts: the last bracket, and steps below it."""
        lo, hi = self.bracket.lower, self.bracket.upper
        if lo <= 0:
            return (hi / 2, hi / 4) if math.isfinite(hi) else ()
        # A shorter stream overstates capacity (less time for a queue to build): walk down
        # from its bracket in steps before bisecting, so the whole group is probed at few
        # scales before it thins out.
        return (lo, min(hi, lo * 1.5), lo * 0.9, lo * 0.8, lo * 0.65, lo * 0.5)

    def salvage(self, reason: str) -> None:
        """After ``BudgetStop``: the last ranking plus the current stage's plans scored on
        the same stream length; nothing scored at all is ``SearchBudgetSpent``."""
        if self.ranked and self.partial_n == self.ranked_n:
            self.rank([*(x.plan for x in self.ranked), *self.partial], self.ranked_n)
        elif not self.ranked and self.partial:
            self.rank(self.partial, self.partial_n)
        if not self.ranked:
            raise SearchBudgetSpent(reason)


def _halving_and_finalists(st: _Stages, request: PlanRequest, pool: list[KVPlan],
                           rungs: Sequence[int], offload_size: float | None,
                           start: KVPlan) -> None:
    """Successive halving over ``pool``, then offload and block size for the finalists
    (module doc, 1-2); leaves the ranking in ``st``. ``start``: the plan whose capacity is
    measured first (the rules')."""
    run, settings = st.run, st.settings
    target = settings.slo_attainment
    survivors = pool
    for i, n in enumerate(rungs):
        last = i == len(rungs) - 1
        stage = SearchProgress("halving", 0, len(survivors), st.considered, i + 1, len(rungs))
        st.observe(survivors, n, stage)
        tol = settings.capacity_tolerance if last else settings.rung_tolerance
        if i == 0:
            # A first estimate, cheap: the capacity of the rules' plan alone; the group's
            # ladder starts there instead of climbing from 1x with every candidate. (Scoring
            # every candidate once at that estimate instead of a ladder saved a third of the
            # CPU and lost 5 % of capacity on bench/oracle.py's memory-bound setting.)
            st.measure([start if start in survivors else survivors[0]], n, tol, ())
        st.measure(survivors, n, tol, st.hints())
        st.rank(survivors, n, settle=last)
        if not last:
            survivors = _promote(st.ranked, target)
    final_n = rungs[-1]
    tol = settings.capacity_tolerance
    if offload_size is not None:
        leaders = [x.plan for x in st.ranked[:OFFLOAD_FINALISTS]]
        tried = decide_offload_size.tried(run, leaders, offload_size)
        tried = [p for p in tried if all(p != y.plan for y in st.ranked)]
        st.considered += len(tried)
        st.observe(tried, final_n, SearchProgress("offload", 0, len(tried), st.considered))
        st.measure([*leaders, *tried], final_n, tol, st.hints())
        st.rank([*(x.plan for x in st.ranked), *tried], final_n, settle=True)
    # Block size for the finalists (their dtype's sizes the backend accepts).
    extra: list[KVPlan] = []
    if run.pins.block_size is None:
        for x in st.ranked[:BLOCK_FINALISTS]:
            for bs in decide_block_size.candidates(run, x.plan.kv_cache_dtype):
                p = x.plan.model_copy(update={"block_size": bs})
                if p not in extra and all(p != y.plan for y in st.ranked) and _starts(request, p):
                    extra.append(p)
    st.considered += len(extra)
    st.observe(extra, final_n, SearchProgress("block size", 0, len(extra), st.considered))
    if extra:
        st.measure([st.ranked[0].plan, *extra], final_n, tol, st.hints())
    st.rank([*(x.plan for x in st.ranked), *extra], final_n, settle=bool(extra))


def search(
    request: PlanRequest, scorer: GoodputScorer, running: KVPlan | None = None,
    settings: SearchSettings | None = None, progress: SearchProgressHook | None = None,
    replicas: int = 1, meter: BudgetMeter | None = None,
) -> PoolPlan:
    """Plan one pool by capacity at SLO (module doc). Raises what ``plan_pool`` raises.
    ``progress`` is told after every score (``SearchProgress``). ``scorer`` replays one
    replica's share of the traffic; ``replicas``: how many share it (the replicas needed
    are counted against all of it). ``meter``: the budget (``search_budget``); when it is
    spent the best plan so far comes back with ``stopped_by``; ``SearchBudgetSpent`` when
    nothing was scored, ``SearchCancelled`` when told to stop."""
    settings = settings or DEFAULT_SETTINGS
    base_pool = plan_pool(request)
    base = base_pool.plan
    run = PlanRun(request)
    offload_size = _offload_size(run, base)
    if offload_size is not None:
        # Offload is searched: the halving runs without it (the simpler plan; ties keep it),
        # the finalists try it.
        base = base.with_offload(None)
    rate = scorer.rate_per_second
    book = _Book(scorer, request, meter or UNBOUNDED.start())
    rungs = sorted({min(n, scorer.max_requests) for n in settings.rungs})
    pool = [p for p in _candidates(run, base, rate, settings) if _starts(request, p)]
    if base not in pool:
        pool.insert(0, base)
    st = _Stages(run, book, settings, running or base, progress, considered=len(pool))
    stopped: str | None = None
    try:
        _halving_and_finalists(st, request, pool, rungs, offload_size, base)
    except BudgetStop as exc:
        stopped = exc.reason
        st.salvage(exc.reason)
    ranked, final_n = st.ranked, st.ranked_n
    best = ranked[0]
    reference = "running plan" if running is not None else "rules' plan"
    for x in ranked[1:]:
        x.lost = _why_lost(x, best, run, settings, rate, reference)
    offload_reason: Reason | None = None
    tiers: tuple[TierSize, ...] = ()
    try:
        if offload_size is not None and stopped is None:
            offload_reason, tiers = _offload_reason(st, best, offload_size, final_n, rate)
    except BudgetStop as exc:
        stopped = exc.reason
    summary = _summary(request, best, ranked, settings, rate, replicas, book, final_n,
                       st.considered, reference, stopped)
    summary = summary.model_copy(update={"reuse": reuse_money.figures(
        run, best.plan, best.score, summary.observed_rate_per_second, tiers)})
    return _pool_plan(run, base_pool, best, summary, offload_reason)


def _summary(request: PlanRequest, best: _Scored, ranked: Sequence[_Scored],
             settings: SearchSettings, rate: float, replicas: int, book: _Book, final_n: int,
             considered: int, reference: str, stopped: str | None) -> SearchSummary:
    slo = request.policy.slo
    return SearchSummary(
        observed_rate_per_second=rate * replicas,
        replicas=replicas,
        rate_per_replica_per_second=rate,
        littles_law_sequences=littles_law_sequences(request, rate),
        capacity_requests_per_second=rate * best.standing.lower_scale,
        slo_attainment=best.score.slo_attainment,
        ttft_p95_seconds=best.score.ttft_p95_seconds,
        tpot_p95_seconds=best.score.tpot_p95_seconds,
        slo_met=best.standing.meets_observed(settings.slo_attainment),
        slo_set=slo.ttft_p95_seconds is not None or slo.tpot_p95_seconds is not None,
        replicas_needed=replicas_needed(replicas, best.standing.lower_scale),
        candidates=considered,
        simulated_requests=book.simulated_requests,
        requests_per_candidate=final_n,
        changed_from=reference,
        changed_knobs=best.changed,
        alternatives=tuple(
            SearchAlternative(
                vllm_args=tuple(x.plan.vllm_args()),
                capacity_requests_per_second=rate * x.standing.lower_scale,
                slo_attainment=x.score.slo_attainment,
                ttft_p95_seconds=x.score.ttft_p95_seconds,
                tpot_p95_seconds=x.score.tpot_p95_seconds,
                why_lost=x.lost,
            )
            for x in ranked[1:1 + settings.alternatives]
        ),
        output_tokens_per_second=best.score.output_tokens_per_second,
        front=pareto_front([(x.plan, x.standing, x is best) for x in ranked], rate,
                           lambda score: -_slack(score, request)),
        stopped_by=stopped,
    )


def _offload_reason(st: _Stages, best: _Scored, budget_gib: float, n: int, rate: float
                   ) -> tuple[Reason, tuple[TierSize, ...]]:
    """How many GiB of CPU tier pay and why (``decide_offload_size``): the chosen plan's
    capacity at SLO without a tier and at every size tried (the full stream; the ladder
    reuses the search's scores)."""
    sizes = decide_offload_size.options(st.run, best.plan.with_offload(None), budget_gib)
    plans = [best.plan.with_offload(size) for size in (None, *(o.size_gib for o in sizes))]
    st.observe(plans, n, SearchProgress("offload", 0, len(plans), st.considered))
    st.measure(plans, n, st.settings.capacity_tolerance, st.hints())
    target = st.settings.slo_attainment
    rows = decide_offload_size.tier_sizes(
        sizes, [st.book.standing(p, n, target) for p in plans], rate,
        best.plan.kv_offloading_size_gib or 0.0, target)
    return decide_offload_size.explain(st.run, best.plan, rows, st.settings.tie, n), rows


def _pool_plan(run: PlanRun, base_pool: PoolPlan, best: _Scored, summary: SearchSummary,
               offload_reason: Reason | None = None) -> PoolPlan:
    plan = best.plan
    base = base_pool.plan
    changed = set(changed_knobs(plan, base))
    if offload_reason is not None:
        # Its reason comes from the search (below), whether or not the rules chose alike.
        changed.add("kv-offloading-size")
    s = best.score
    figures = (f"capacity at SLO {summary.capacity_requests_per_second:.2f} req/s per "
               f"replica; at the observed {summary.rate_per_replica_per_second:.2f} req/s "
               f"{s.slo_attainment:.1%} of requests meet the SLO, TTFT p95 "
               f"{s.ttft_p95_seconds:.3f} s, TPOT p95 {s.tpot_p95_seconds * 1000:.1f} ms "
               f"(over {s.requests} requests)")
    reasons = told_for_final(run.req, plan, base_pool.reasons, changed, summary.candidates)
    for knob in sorted(changed):
        if offload_reason is not None and knob == "kv-offloading-size":
            reasons.append(offload_reason)
            continue
        value = getattr(plan, knobs.FLAG_TO_NAME[knob])
        was = getattr(base, knobs.FLAG_TO_NAME[knob])
        reasons.append(Reason(
            knob=knob, choice=knobs.choice_text(value),
            code="BestCapacity",
            message=(f"the capacity search chose {value} over the rules' {was} among "
                     f"{summary.candidates} candidates: {figures}"
                     + (_quality_quote(run, str(value)) if knob == "kv-cache-dtype" else "")),
        ))
    # The rules' warnings about their own concurrency target or about a dtype the search
    # replaced no longer describe the plan.
    gone = (f"kv-cache-dtype {base.kv_cache_dtype} " if plan.kv_cache_dtype !=
            base.kv_cache_dtype else None)
    warnings = [w for w in base_pool.warnings
                if not w.startswith("KV capacity limits concurrency")
                and (gone is None or gone not in w)]
    if not summary.slo_met and summary.slo_set:
        warnings.append(slo_at_risk_message(summary))
    if summary.stopped_by is not None:
        warnings.append(budget_stop_message(summary))
    exp = expected.figures(run, plan, None)
    exp = ExpectedFigures.model_validate({
        **exp.model_dump(),
        "prefix_hit_rate": s.prefix_hit_rate,
        "cpu_prefix_hit_rate": s.cpu_hit_rate,
        "capacity_requests_per_second": summary.capacity_requests_per_second,
        "replicas_needed": summary.replicas_needed,
        "slo_attainment": s.slo_attainment,
        "ttft_p95_seconds": s.ttft_p95_seconds,
        "tpot_p95_seconds": s.tpot_p95_seconds,
    })
    return base_pool.model_copy(update={
        "plan": plan, "expected": exp, "reasons": tuple(reasons),
        "warnings": tuple(warnings), "search": summary,
    })


def _quality_quote(run: PlanRun, dtype: str) -> str:
    """The KV-quality evidence on a dtype the search chose (its candidates came through the
    same gate, ``kv_dtype_options.allowed``)."""
    verdict = decide_dtype.quality_gate(run, dtype)
    return "" if verdict.code == kv_quality.REFERENCE else f"; quality: {verdict.detail}"


def slo_at_risk_message(summary: SearchSummary) -> str:
    """One line with the numbers: the SLO cannot be met at the observed rate."""
    over = (f" over {summary.replicas} replicas ({summary.rate_per_replica_per_second:.2f} "
            f"req/s each)" if summary.replicas > 1 else "")
    msg = (f"SLO at risk: the best configuration meets the SLO for "
           f"{summary.slo_attainment:.1%} of requests at the observed "
           f"{summary.observed_rate_per_second:.2f} req/s{over} (needs "
           f"{SLO_ATTAINMENT:.0%})")
    rate = summary.capacity_requests_per_second
    if rate > 0:
        msg += f"; one replica's capacity at SLO is {rate:.2f} req/s"
        if summary.replicas_needed is not None:
            msg += f", so the traffic needs {summary.replicas_needed} replicas"
    else:
        msg += ("; no request rate meets the SLO on this GPU class: the requests' own service "
                "time (prefill, then decode at the batch size) exceeds the targets; loosen "
                "them or plan a faster GPU class or more tensor parallelism")
    return msg


def budget_stop_message(summary: SearchSummary) -> str:
    """One line: the search's budget ended it early, and what the plan is then."""
    return (f"search stopped by its budget: {summary.stopped_by}; the plan is the best of "
            f"{summary.candidates} candidates as far as they were scored, its capacity "
            f"({summary.capacity_requests_per_second:.3g} req/s) measured on the first "
            f"{summary.requests_per_candidate:,} requests of the stream (a short stream can "
            f"overstate it; {summary.simulated_requests:,} requests simulated; raise the "
            "search budget "
            "for a full search: kvtune plan --search-cpu-seconds/--search-memory-mib, the "
            "chart's search.cpuSeconds/search.memoryMiB)")


def grid(request: PlanRequest, rate_per_second: float,
         settings: SearchSettings | None = None) -> list[KVPlan]:
    """Every candidate the search could consider (all block sizes, offload off and on
    wherever the search tries it, no halving), that vLLM would start: the exhaustive grid a
    benchmark compares the search with."""
    settings = settings or DEFAULT_SETTINGS
    base = plan_pool(request).plan
    run = PlanRun(request)
    offload_size = _offload_size(run, base)
    sizes: tuple[float | None, ...] = (base.kv_offloading_size_gib,)
    if offload_size is not None:
        sizes = (None, *(o.size_gib for o in decide_offload_size.options(run, base, offload_size)))
        base = base.with_offload(None)
    out: list[KVPlan] = []
    for p in _candidates(run, base, rate_per_second, settings):
        for bs in decide_block_size.candidates(run, p.kv_cache_dtype):
            for size in sizes:
                q = p.model_copy(update={"block_size": bs}).with_offload(size)
                if q not in out and _starts(request, q):
                    out.append(q)
    if base not in out:
        out.insert(0, base)
    return out


__all__ = [
    "CAPACITY_TIE",
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
