"""The planner as a search scored on SLO-goodput (docs/planner.md, "The search").

``plan_pool`` decides every knob by rule and checks the plan against vLLM's pre-flight; it
is fast and needs no traffic. ``search`` starts from that plan and asks what the traffic
says: it varies the knobs that trade latency against capacity, keeps only candidates vLLM
would start (the analytic pre-flight), and ranks the rest by SLO-goodput, the requests per
second that meet both their TTFT and TPOT targets (DistServe's definition), as a
``GoodputScorer`` (the simulator, replaying the pool's own traffic) predicts them.

1. **Candidates.** KV dtype (the widest allowed dtype of each precision class vLLM runs for
   this attention on this GPU, never below the quality floor, only where the KV-quality
   gate allows) x max-num-seqs (the concurrency the traffic needs by Little's law, arrival
   rate x the time a request spends in the engine at the SLO, 4x that, and the rules') x
   max-num-batched-tokens (512, 2K, 8K, 16K and the rules'); then CPU KV offload (off, and
   the policy's CPU budget as ``--kv-offloading-size``) for the best two, only where the
   policy gives a budget, the profile shows reuse a CPU tier could serve and prefix caching
   is on (the simulator's CPU tier, ``simulator/offload.py``); then block size (the sizes
   the backend accepts) for the best one. Memory fraction, max-model-len and prefix caching
   stay as the rules chose them: more KV memory never lowers goodput in the simulator (the
   risk of a high fraction is an OOM it cannot score), and it charges nothing for prefix
   caching's hashing, so "on" would always win (docs/planner.md). A pin fixes its knob.
2. **Successive halving.** Every candidate replays a short prefix of the traffic (100
   requests); the best third (by the order below) and the best candidate for every value of
   every knob go on to a 3x longer one, and so on up to the full sample (800).
   Deterministic: the traffic is made once (seeded) and candidates are taken in a fixed
   order.
3. **The order.** Higher goodput wins; goodputs within ``GOODPUT_TIE`` of the best are a tie
   (simulation noise), broken by the wider KV precision (quality), then by fewer knobs
   changed from the running plan (stability; the rule-based plan when nothing runs), then by
   more headroom (the larger slack to the SLO targets).
4. **When the SLO cannot be met** (fewer than ``SLO_ATTAINMENT`` of the requests meet both
   targets at the observed rate): the best configuration, the highest fraction of the rate
   one replica sustains within the SLO (bisection), and the replicas the traffic needs.

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
from typing import Literal, Protocol

from kvtune.tuner import knobs, kv_quality
from kvtune.tuner.plan import (
    ExpectedFigures,
    FrontPoint,
    KVPlan,
    PoolPlan,
    Reason,
    SearchAlternative,
    SearchSummary,
)
from kvtune.tuner.planner import (
    decide_block_size,
    decide_dtype,
    decide_max_num_seqs,
    decide_prefix_offload,
    expected,
    kv_dtype_options,
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
from kvtune.tuner.planner.search_reasons import told_for_final

# Goodputs within 2% of the best are a tie: the spread of repeated simulations with
# different seeds on the shipped traces (bench/oracle.py) stays under it.
GOODPUT_TIE = 0.02
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
# The rate fraction at which requests arrive one at a time (nothing queues).
_TRICKLE = 1e-3
# Default targets when the policy sets none (the rule-based planner's defaults).
DEFAULT_TTFT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class GoodputScore:
    """What a scorer predicts for one plan on a prefix of the traffic."""

    goodput_requests_per_second: float
    slo_attainment: float
    throughput_requests_per_second: float
    ttft_p95_seconds: float
    tpot_p95_seconds: float
    requests: int  # how many requests were replayed
    preemptions: int = 0
    prefix_hit_rate: float = 0.0
    output_tokens_per_second: float = 0.0  # output tokens served per second (the cost base)
    starts: bool = True  # False: vLLM would not start it (no figures)


class GoodputScorer(Protocol):
    """Predicts a plan's SLO-goodput on the pool's traffic (``tuner/simulator`` implements
    it on a trace or on traffic made from the profile)."""

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


@dataclass(slots=True)
class _Scored:
    plan: KVPlan
    score: GoodputScore
    changed: tuple[str, ...]
    lost: str = ""


@dataclass(frozen=True, slots=True)
class SearchSettings:
    rungs: tuple[int, ...] = RUNGS
    tie: float = GOODPUT_TIE
    slo_attainment: float = SLO_ATTAINMENT
    # Bisection steps for the rate one replica sustains (only when the SLO is missed).
    rate_steps: int = 6
    alternatives: int = 3
    batched_tokens: tuple[int, ...] = BATCHED_TOKENS


DEFAULT_SETTINGS = SearchSettings()


@dataclass(frozen=True, slots=True)
class SearchProgress:
    """Where a running search is, for a caller that shows it (``kvtune plan`` on stderr):
    ``done`` of ``total`` scores taken in the current stage. The search takes seconds; it
    reports after every score and never reads a clock."""

    stage: Literal["halving", "offload", "block size", "sustainable rate"]
    done: int
    total: int
    candidates: int  # candidates that passed pre-flight
    round: int = 0  # successive-halving round, from 1
    rounds: int = 0
    requests: int = 0  # requests each score replays

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
        return (f"bisecting the rate one replica sustains within the SLO: "
                f"{self.done}/{self.total}")


SearchProgressHook = Callable[[SearchProgress], None]


@dataclass(slots=True)
class _Book:
    """Every score taken, keyed by plan and rung, so a plan is never replayed twice."""

    scorer: GoodputScorer
    request: PlanRequest
    meter: BudgetMeter = field(default_factory=UNBOUNDED.start)
    seen: dict[tuple[KVPlan, int, float], GoodputScore] = field(default_factory=dict)
    simulated_requests: int = 0

    def score(self, plan: KVPlan, n: int, rate_scale: float = 1.0) -> GoodputScore:
        key = (plan, n, rate_scale)
        got = self.seen.get(key)
        if got is None:
            self.meter.check()  # raises BudgetStop (or SearchCancelled) before the work
            got = self.scorer.score(self.request, plan, n, rate_scale)
            self.seen[key] = got
            self.simulated_requests += got.requests
        return got


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


def _order(items: Sequence[_Scored], run: PlanRun, tie: float) -> list[_Scored]:
    """Best first: goodput, and within a tie of the best, wider precision, fewer changed
    knobs, more headroom. Candidates outside the tie band follow by goodput."""
    if not items:
        return []
    top = max(x.score.goodput_requests_per_second for x in items)

    def key(x: _Scored) -> tuple[float, ...]:
        g = x.score.goodput_requests_per_second
        tied = g >= top * (1.0 - tie)
        return (0.0 if tied else 1.0,
                -(_precision_bits(run, x.plan.kv_cache_dtype)) if tied else -g,
                float(len(x.changed)) if tied else 0.0,
                -_slack(x.score, run.req),
                -g)

    return sorted(items, key=key)


def _promote(ranked: Sequence[_Scored]) -> list[KVPlan]:
    """The candidates that go on to the next, longer stream: the best third, and the best
    candidate for every value of every knob searched. A short stream shows where the SLO
    breaks first, not how far a queue grows later (under overload a larger batched-token
    budget can lose on 450 requests and win on 1,200): no value of a knob is dropped on a
    short stream alone."""
    k = max(2, math.ceil(len(ranked) / KEEP_FRACTION))
    # By goodput alone (then capacity): the tie rules (precision, stability) decide only
    # among the finalists; applied here they would promote a tied 16-bit candidate over
    # the fp8 one with the same other knobs, which may pull ahead on the longer stream.
    by_goodput = sorted(ranked, key=lambda x: (-x.score.goodput_requests_per_second,
                                               -x.score.throughput_requests_per_second))
    out = [x.plan for x in by_goodput[:k]]
    for knob in _SEARCHED:
        champions: dict[object, KVPlan] = {}
        for x in by_goodput:  # best first
            champions.setdefault(getattr(x.plan, knob), x.plan)
        out += [p for p in champions.values() if p not in out]
    return out


def _why_lost(loser: _Scored, best: _Scored, run: PlanRun, tie: float, reference: str
              ) -> str:
    g, b = loser.score.goodput_requests_per_second, best.score.goodput_requests_per_second
    if g < b * (1.0 - tie):
        return f"lower goodput ({g:.2f} vs {b:.2f} req/s)"
    lb, bb = (_precision_bits(run, loser.plan.kv_cache_dtype),
              _precision_bits(run, best.plan.kv_cache_dtype))
    if lb < bb:
        return f"tied on goodput; {bb}-bit KV keeps more precision than {lb}-bit"
    if len(loser.changed) > len(best.changed):
        return (f"tied on goodput; changes {len(loser.changed)} knobs from the {reference}, "
                f"the chosen one {len(best.changed)}")
    return "tied on goodput; less headroom to the SLO targets"


@dataclass(slots=True)
class _Stages:
    """The search's state between stages: what is ranked so far (one stream length), and
    the scores of the stage in progress, so a spent budget keeps whatever compares."""

    run: PlanRun
    book: _Book
    settings: SearchSettings
    reference: KVPlan
    progress: SearchProgressHook | None
    ranked: list[_Scored] = field(default_factory=list)
    ranked_n: int = 0
    partial: list[_Scored] = field(default_factory=list)
    partial_n: int = 0
    considered: int = 0

    def scored(self, plans: Sequence[KVPlan], n: int, stage: SearchProgress) -> list[_Scored]:
        self.partial, self.partial_n = [], n
        for i, p in enumerate(plans):
            self.partial.append(_Scored(p, self.book.score(p, n),
                                        changed_knobs(p, self.reference)))
            if self.progress is not None:
                self.progress(SearchProgress(
                    stage=stage.stage, done=i + 1, total=len(plans),
                    candidates=stage.candidates, round=stage.round, rounds=stage.rounds,
                    requests=n))
        return self.partial

    def rank(self, items: Sequence[_Scored], n: int) -> None:
        self.ranked, self.ranked_n = _order(items, self.run, self.settings.tie), n
        self.partial = []

    def salvage(self, reason: str) -> None:
        """After ``BudgetStop``: the last ranking plus the current stage's scores on the same
        stream length; nothing scored at all is ``SearchBudgetSpent``."""
        same = [x for x in self.partial if x.plan not in {y.plan for y in self.ranked}]
        if self.ranked and self.partial_n == self.ranked_n:
            self.rank([*self.ranked, *same], self.ranked_n)
        elif not self.ranked and self.partial:
            self.rank(self.partial, self.partial_n)
        if not self.ranked:
            raise SearchBudgetSpent(reason)


def _halving_and_finalists(st: _Stages, request: PlanRequest, pool: list[KVPlan],
                           rungs: Sequence[int], offload_size: float | None) -> None:
    """Successive halving over ``pool``, then offload and block size for the finalists
    (module doc, 1-2); leaves the ranking in ``st``."""
    run = st.run
    survivors = pool
    for i, n in enumerate(rungs):
        stage = SearchProgress("halving", 0, len(survivors), st.considered, i + 1, len(rungs))
        st.rank(st.scored(survivors, n, stage), n)
        if i < len(rungs) - 1:
            survivors = _promote(st.ranked)
    final_n = rungs[-1]
    if offload_size is not None:
        tried = [x.plan.with_offload(offload_size) for x in st.ranked[:OFFLOAD_FINALISTS]]
        tried = [p for p in tried if all(p != y.plan for y in st.ranked)]
        st.considered += len(tried)
        stage = SearchProgress("offload", 0, len(tried), st.considered)
        st.rank([*st.ranked, *st.scored(tried, final_n, stage)], final_n)
    # Block size for the finalists (their dtype's sizes the backend accepts).
    extra: list[KVPlan] = []
    if run.pins.block_size is None:
        for x in st.ranked[:BLOCK_FINALISTS]:
            for bs in decide_block_size.candidates(run, x.plan.kv_cache_dtype):
                p = x.plan.model_copy(update={"block_size": bs})
                if p not in extra and all(p != y.plan for y in st.ranked) and _starts(request, p):
                    extra.append(p)
    st.considered += len(extra)
    stage = SearchProgress("block size", 0, len(extra), st.considered)
    st.rank([*st.ranked, *st.scored(extra, final_n, stage)], final_n)


def search(
    request: PlanRequest, scorer: GoodputScorer, running: KVPlan | None = None,
    settings: SearchSettings | None = None, progress: SearchProgressHook | None = None,
    replicas: int = 1, meter: BudgetMeter | None = None,
) -> PoolPlan:
    """Plan one pool by SLO-goodput (module doc). Raises what ``plan_pool`` raises.
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
        _halving_and_finalists(st, request, pool, rungs, offload_size)
    except BudgetStop as exc:
        stopped = exc.reason
        st.salvage(exc.reason)
    ranked, final_n, considered = st.ranked, st.ranked_n, st.considered
    best = ranked[0]
    for x in ranked[1:]:
        x.lost = _why_lost(x, best, run, settings.tie,
                           "running plan" if running is not None else "rules' plan")
    offload_reason: Reason | None = None
    max_scale: float | None = None
    needed: int | None = None
    meets = best.score.slo_attainment >= settings.slo_attainment
    try:
        if offload_size is not None and stopped is None:
            offload_reason = _offload_reason(book, best, offload_size, final_n, settings.tie)
        if not meets and stopped is None:
            max_scale = _sustainable_scale(book, best.plan, final_n, settings, progress,
                                           considered)
            # Each replica gets 1/replicas of the traffic and sustains max_scale of its share.
            needed = math.ceil(replicas / max_scale - 1e-9) if max_scale > 0 else None
    except BudgetStop as exc:
        stopped = exc.reason
    summary = _summary(request, best, ranked, settings, rate, replicas, book, final_n,
                       considered, running is not None, max_scale, needed, stopped)
    return _pool_plan(run, base_pool, best, summary, ranked, offload_reason)


def _summary(request: PlanRequest, best: _Scored, ranked: Sequence[_Scored],
             settings: SearchSettings, rate: float, replicas: int, book: _Book, final_n: int,
             considered: int, has_running: bool, max_scale: float | None,
             needed: int | None, stopped: str | None) -> SearchSummary:
    slo = request.policy.slo
    return SearchSummary(
        observed_rate_per_second=rate * replicas,
        replicas=replicas,
        rate_per_replica_per_second=rate,
        littles_law_sequences=littles_law_sequences(request, rate),
        goodput_requests_per_second=best.score.goodput_requests_per_second,
        slo_attainment=best.score.slo_attainment,
        ttft_p95_seconds=best.score.ttft_p95_seconds,
        tpot_p95_seconds=best.score.tpot_p95_seconds,
        slo_met=best.score.slo_attainment >= settings.slo_attainment,
        slo_set=slo.ttft_p95_seconds is not None or slo.tpot_p95_seconds is not None,
        max_rate_within_slo_per_second=(rate * max_scale if max_scale is not None else None),
        replicas_needed=needed,
        candidates=considered,
        simulated_requests=book.simulated_requests,
        requests_per_candidate=final_n,
        changed_from=("running plan" if has_running else "rules' plan"),
        changed_knobs=best.changed,
        alternatives=tuple(
            SearchAlternative(
                vllm_args=tuple(x.plan.vllm_args()),
                goodput_requests_per_second=x.score.goodput_requests_per_second,
                slo_attainment=x.score.slo_attainment,
                ttft_p95_seconds=x.score.ttft_p95_seconds,
                tpot_p95_seconds=x.score.tpot_p95_seconds,
                why_lost=x.lost,
            )
            for x in ranked[1:1 + settings.alternatives]
        ),
        output_tokens_per_second=best.score.output_tokens_per_second,
        front=pareto_front(ranked, best, request),
        stopped_by=stopped,
    )


def _offload_reason(book: _Book, best: _Scored, size: float, n: int, tie: float) -> Reason:
    """Why the plan has offload on or off: the chosen plan's predicted goodput with and
    without the CPU tier (both on the full stream; a score the search took is reused)."""
    on = book.score(best.plan.with_offload(size), n)
    off = book.score(best.plan.with_offload(None), n)
    chosen = best.plan.kv_offloading_size_gib
    figures = (f"predicted SLO-goodput {on.goodput_requests_per_second:.3g} req/s with "
               f"{size:g} GiB of CPU KV offload (TTFT p95 {on.ttft_p95_seconds:.3f} s), "
               f"{off.goodput_requests_per_second:.3g} req/s without (TTFT p95 "
               f"{off.ttft_p95_seconds:.3f} s) over {n} requests")
    if chosen:
        why = "the goodput search keeps the CPU tier on: "
    elif on.goodput_requests_per_second > off.goodput_requests_per_second:
        why = (f"the goodput search leaves offload off: within the {tie:.0%} tie, where the "
               "simpler plan wins; ")
    else:
        why = "the goodput search leaves offload off: "
    return Reason(knob="kv-offloading-size", choice=f"{chosen:g}" if chosen else "off",
                  code="BestGoodput", message=why + figures)


def _dominates(a: FrontPoint, b: FrontPoint) -> bool:
    """``a`` is at least as good as ``b`` on every axis and better on one."""
    ge = (a.goodput_requests_per_second >= b.goodput_requests_per_second
          and a.output_tokens_per_second >= b.output_tokens_per_second
          and a.latency_vs_slo <= b.latency_vs_slo)
    gt = (a.goodput_requests_per_second > b.goodput_requests_per_second
          or a.output_tokens_per_second > b.output_tokens_per_second
          or a.latency_vs_slo < b.latency_vs_slo)
    return ge and gt


def pareto_front(ranked: Sequence[_Scored], best: _Scored, request: PlanRequest
                 ) -> tuple[FrontPoint, ...]:
    """The configurations scored on the full stream that no other dominates on goodput,
    output tokens per second (on one GPU class, cost per token is its hourly price over
    that) and latency against the SLO; the chosen one is always listed, flagged when a tie
    rule (precision, stability) chose it over a point that dominates it. Best goodput first;
    of points with the same figures, the first in the search's order."""
    points = [FrontPoint(
        vllm_args=tuple(x.plan.vllm_args()), chosen=x is best, on_front=True,
        goodput_requests_per_second=x.score.goodput_requests_per_second,
        slo_attainment=x.score.slo_attainment,
        output_tokens_per_second=x.score.output_tokens_per_second,
        ttft_p95_seconds=x.score.ttft_p95_seconds, tpot_p95_seconds=x.score.tpot_p95_seconds,
        latency_vs_slo=-_slack(x.score, request),
    ) for x in ranked]
    out: list[FrontPoint] = []
    for i, p in enumerate(points):
        dominated = any(_dominates(q, p) for q in points)
        duplicate = any(_same_figures(q, p) for q in points[:i])
        if p.chosen:
            out.append(p.model_copy(update={"on_front": not dominated}))
        elif not dominated and not duplicate:
            out.append(p)
    out.sort(key=lambda p: (-p.goodput_requests_per_second, -p.output_tokens_per_second,
                            p.latency_vs_slo))
    return tuple(out)


def _same_figures(a: FrontPoint, b: FrontPoint) -> bool:
    return (a.goodput_requests_per_second == b.goodput_requests_per_second
            and a.output_tokens_per_second == b.output_tokens_per_second
            and a.latency_vs_slo == b.latency_vs_slo)


def _sustainable_scale(book: _Book, plan: KVPlan, n: int, settings: SearchSettings,
                       progress: SearchProgressHook | None = None, candidates: int = 0
                       ) -> float:
    """The largest fraction of the observed rate at which ``plan`` meets the SLO (bisection
    in ``rate_steps`` steps); 0 when not even a trickle (requests a thousand times further
    apart, each served alone) meets it."""
    total = settings.rate_steps + 1

    def told(done: int) -> None:
        if progress is not None:
            progress(SearchProgress("sustainable rate", done, total, candidates, requests=n))

    trickle = book.score(plan, n, _TRICKLE).slo_attainment
    told(1)
    if trickle < settings.slo_attainment:
        return 0.0
    lo, hi = _TRICKLE, 1.0
    for step in range(settings.rate_steps):
        mid = (lo + hi) / 2
        attainment = book.score(plan, n, mid).slo_attainment
        told(step + 2)
        if attainment >= settings.slo_attainment:
            lo = mid
        else:
            hi = mid
    return lo


def _pool_plan(run: PlanRun, base_pool: PoolPlan, best: _Scored, summary: SearchSummary,
               ranked: Sequence[_Scored], offload_reason: Reason | None = None) -> PoolPlan:
    plan = best.plan
    base = base_pool.plan
    changed = set(changed_knobs(plan, base))
    if offload_reason is not None:
        # Its reason comes from the search (below), whether or not the rules chose alike.
        changed.add("kv-offloading-size")
    s = best.score
    figures = (f"predicted SLO-goodput {s.goodput_requests_per_second:.2f} req/s "
               f"({s.slo_attainment:.1%} of requests meet the SLO), TTFT p95 "
               f"{s.ttft_p95_seconds:.3f} s, TPOT p95 {s.tpot_p95_seconds * 1000:.1f} ms over "
               f"{s.requests} requests at {summary.observed_rate_per_second:.2f} req/s")
    reasons = told_for_final(run.req, plan, base_pool.reasons, changed, summary.candidates)
    for knob in sorted(changed):
        if offload_reason is not None and knob == "kv-offloading-size":
            reasons.append(offload_reason)
            continue
        value = getattr(plan, knobs.FLAG_TO_NAME[knob])
        was = getattr(base, knobs.FLAG_TO_NAME[knob])
        reasons.append(Reason(
            knob=knob, choice=knobs.choice_text(value),
            code="BestGoodput",
            message=(f"the goodput search chose {value} over the rules' {was} among "
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
        "goodput_requests_per_second": s.goodput_requests_per_second,
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
    rate = summary.max_rate_within_slo_per_second
    if rate is not None and rate > 0:
        msg += f"; one replica sustains {rate:.2f} req/s within the SLO"
        if summary.replicas_needed is not None:
            msg += f", so the traffic needs {summary.replicas_needed} replicas"
    elif rate is not None:
        msg += ("; no request rate meets the SLO on this GPU class: the requests' own service "
                "time (prefill, then decode at the batch size) exceeds the targets; loosen "
                "them or plan a faster GPU class or more tensor parallelism")
    return msg


def budget_stop_message(summary: SearchSummary) -> str:
    """One line: the search's budget ended it early, and what the plan is then."""
    return (f"search stopped by its budget: {summary.stopped_by}; the plan is the best of "
            f"{summary.candidates} candidates as far as they were scored "
            f"({summary.simulated_requests:,} requests simulated; raise the search budget "
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
        sizes = (None, offload_size)
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
    "GOODPUT_TIE",
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
