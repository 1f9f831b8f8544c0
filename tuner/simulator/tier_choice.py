"""Which KV tier beyond the GPU pays, and how many GiB (issue 27 item 1): the searched plan's
capacity at SLO with no tier, vLLM's native CPU tier, and LMCache's CPU, local-disk and remote
tiers, each replayed over its own link (``engine.lmcache_tier``, ``facts/kv_tiers.py``).

The capacity search (``planner/search.py``) sizes the native CPU tier among its finalists;
this stage then weighs the other kinds on the plan it chose, each on its own capacity ladder
over the same stream. The best capacity wins; within the capacity tie the cheaper tier wins.
With a host-memory price (``kvtune plan --host-memory-price``, and ``--disk-price`` for the
disk tier's GiB) cheaper means fewer dollars per hour of the tier's memory and disk; without
one it means less pinned host memory first (a node's DRAM is its scarcest part beside the
GPUs), then less disk. A remote store's GiB count as host memory of another node.
The reason says which tier and how many GiB pay, with each option's capacity and hit rates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtune.tuner.facts import kv_tiers
from kvtune.tuner.plan import ExpectedFigures, KVPlan, PoolPlan, Reason
from kvtune.tuner.plan_tier import KVTier
from kvtune.tuner.planner.capacity import GoodputScore, climb
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.search_settings import CAPACITY_TIE, SLO_ATTAINMENT
from kvtune.tuner.simulator.goodput_search import TrafficScorer
from kvtune.tuner.simulator.workload import SimRequest


@dataclass(frozen=True, slots=True)
class TierOption:
    """One tier to weigh: vLLM's native CPU tier (``native_gib``), an LMCache ``tier``, or
    neither (no tier)."""

    native_gib: float | None = None
    tier: KVTier | None = None

    @property
    def label(self) -> str:
        if self.tier is not None:
            return f"{self.tier.kind} {self.tier.size_gib:g} GiB"
        return f"native-cpu {self.native_gib:g} GiB" if self.native_gib else "no tier"

    @property
    def host_gib(self) -> float:
        """Pinned host memory, this node's or (remote) another's: the cost ranked first."""
        if self.tier is None:
            return self.native_gib or 0.0
        if self.tier.kind == "lmcache-remote":
            return self.tier.buffer_gib + self.tier.size_gib
        return self.tier.cpu_gib()

    @property
    def disk_gib(self) -> float:
        return self.tier.disk_gib() if self.tier is not None else 0.0


@dataclass(frozen=True, slots=True)
class TierPrices:
    """USD per GiB-hour of pinned host memory and of local disk (None: not priced)."""

    host_usd_per_gib_hour: float | None = None
    disk_usd_per_gib_hour: float | None = None

    def usd_per_hour(self, option: TierOption) -> float | None:
        """The option's memory and disk per hour, or None without a host price (disk alone
        cannot rank a disk tier against a CPU one)."""
        if self.host_usd_per_gib_hour is None:
            return None
        return (option.host_gib * self.host_usd_per_gib_hour
                + option.disk_gib * (self.disk_usd_per_gib_hour or 0.0))

    def describe(self) -> str:
        disk = ("" if self.disk_usd_per_gib_hour is None
                else f", disk ${self.disk_usd_per_gib_hour:g}/GiB-h")
        return f"host memory ${self.host_usd_per_gib_hour:g}/GiB-h{disk}"


@dataclass(frozen=True, slots=True)
class TierResult:
    option: TierOption
    capacity_requests_per_second: float
    at_observed: GoodputScore


def capacity_at_slo(request: PlanRequest, plan: KVPlan, scorer: TrafficScorer,
                    tolerance: float) -> tuple[float, GoodputScore]:
    """``plan``'s capacity at SLO on ``scorer``'s stream (req/s per replica, to
    ``tolerance``) and its score at the stream's own rate, remembered from the climb rather
    than replayed again."""
    seen: dict[float, GoodputScore] = {}

    def score(p: KVPlan, m: int, scale: float) -> GoodputScore:
        if scale not in seen:
            seen[scale] = scorer.score(request, p, m, scale)
        return seen[scale]

    bracket = climb(score, [plan], scorer.max_requests, SLO_ATTAINMENT, tolerance)
    return scorer.rate_per_second * bracket.lower, score(plan, scorer.max_requests, 1.0)


def _measure(request: PlanRequest, plan: KVPlan, option: TierOption,
             stream: tuple[SimRequest, ...], tolerance: float) -> TierResult:
    scorer = TrafficScorer(stream, tier=option.tier)
    return TierResult(option, *capacity_at_slo(request, plan.with_offload(option.native_gib),
                                                scorer, tolerance))


def weigh(request: PlanRequest, plan: KVPlan, options: Sequence[TierOption],
          stream: tuple[SimRequest, ...], tolerance: float = 0.01) -> list[TierResult]:
    """Each option's capacity at SLO on ``stream`` (no tier first) and its figures at the
    stream's own rate."""
    every = [TierOption(), *(o for o in options if o != TierOption())]
    return [_measure(request, plan, o, stream, tolerance) for o in every]


def chosen(results: Sequence[TierResult], tie: float, prices: TierPrices = TierPrices()
           ) -> TierResult:
    """The best capacity, or within ``tie`` of it the cheapest (module doc)."""
    best = max(r.capacity_requests_per_second for r in results)
    within = [r for r in results if r.capacity_requests_per_second >= best * (1.0 - tie)]

    def cost(r: TierResult) -> tuple[float, float, float]:
        usd = prices.usd_per_hour(r.option)
        return (usd if usd is not None else 0.0, r.option.host_gib, r.option.disk_gib)

    return min(within, key=cost)


def explain(results: Sequence[TierResult], pick: TierResult, tie: float,
            prices: TierPrices = TierPrices()) -> Reason:
    """Which tier and how many GiB pay, and why, with every option's figures."""
    off = results[0]
    table = "; ".join(
        f"{r.option.label}: {r.capacity_requests_per_second:.3g} req/s, hits GPU "
        f"{r.at_observed.prefix_hit_rate:.1%} / tier {r.at_observed.cpu_hit_rate:.1%}"
        for r in results)
    if pick is off:
        head = (f"no tier beyond the GPU pays: {off.capacity_requests_per_second:.3g} req/s "
                f"per replica without one, no tier beats it by more than the {tie:.0%} tie")
    else:
        gain = (pick.capacity_requests_per_second / off.capacity_requests_per_second - 1.0
                if off.capacity_requests_per_second > 0 else float("inf"))
        head = (f"{pick.option.label} pays: capacity at SLO "
                f"{pick.capacity_requests_per_second:.3g} req/s per replica against "
                f"{off.capacity_requests_per_second:.3g} without ({gain:+.0%}), the tier "
                f"serving {pick.at_observed.cpu_hit_rate:.1%} of prompt tokens beside the "
                f"GPU's {pick.at_observed.prefix_hit_rate:.1%}; the cheapest within the "
                f"{tie:.0%} tie of the best")
        usd = prices.usd_per_hour(pick.option)
        if usd is not None:
            head += f" (${usd:.3f}/h of memory and disk at {prices.describe()})"
    return Reason(knob="kv-tier", choice=pick.option.label, code="BestCapacity",
                  message=f"{head}. Tiers weighed, each over its own link: {table}")


def with_tier(pool: PoolPlan, pick: TierResult, reason: Reason) -> PoolPlan:
    """``pool`` with the chosen tier (native: the offload knobs; LMCache: ``kv_tier``) and
    the reason beside its others."""
    plan = pool.plan.with_offload(pick.option.native_gib)
    reasons = (*(r for r in pool.reasons if r.knob != reason.knob), reason)
    expected = replace_expected(pool, pick)
    return pool.model_copy(update={"plan": plan, "kv_tier": pick.option.tier,
                                   "reasons": reasons, "expected": expected})


def replace_expected(pool: PoolPlan, pick: TierResult) -> ExpectedFigures:
    """The plan's predicted hit rates at the chosen tier: the GPU's, and the tier's own in
    ``cpu_prefix_hit_rate`` (whatever its medium; the reason names the tier)."""
    return pool.expected.model_copy(update={
        "prefix_hit_rate": round(pick.at_observed.prefix_hit_rate, 4),
        "cpu_prefix_hit_rate": round(pick.at_observed.cpu_hit_rate, 4)})


@dataclass(frozen=True, slots=True)
class TierAllowance:
    """What the caller allows beyond vLLM's native CPU tier: an LMCache local-disk tier of
    ``disk_gib`` per replica, a remote store at ``remote_url`` of which one replica may fill
    ``remote_gib`` (``kvtune plan --kv-tier-*``, ``spec.tuning.kvTiers``)."""

    disk_gib: float | None = None
    remote_url: str | None = None
    remote_gib: float = kv_tiers.LMCACHE_REMOTE_DEFAULT_GIB

    @property
    def any(self) -> bool:
        return self.disk_gib is not None or self.remote_url is not None


def options(allowance: TierAllowance, tensor_parallel: int, cpu_gib: float) -> list[TierOption]:
    """The tiers to weigh: native and LMCache CPU at ``cpu_gib`` (none at 0), the disk and
    the remote tier when allowed, each behind LMCache's CPU buffer."""
    buffer = kv_tiers.LMCACHE_BUFFER_GIB_PER_RANK * tensor_parallel
    out = []
    if cpu_gib > 0:
        out += [TierOption(native_gib=cpu_gib),
                TierOption(tier=KVTier(kind="lmcache-cpu", size_gib=cpu_gib))]
    if allowance.disk_gib is not None:
        out.append(TierOption(tier=KVTier(kind="lmcache-disk", size_gib=allowance.disk_gib,
                                          buffer_gib=buffer)))
    if allowance.remote_url is not None:
        out.append(TierOption(tier=KVTier(kind="lmcache-remote", size_gib=allowance.remote_gib,
                                          buffer_gib=buffer, remote_url=allowance.remote_url)))
    return out


def choose(pool: PoolPlan, request: PlanRequest, stream: tuple[SimRequest, ...],
           allowance: TierAllowance, prices: TierPrices = TierPrices()) -> PoolPlan:
    """``pool`` with the tier that pays among none, native CPU (at the size the search chose,
    else at the policy's budget) and what ``allowance`` allows, replayed on ``stream`` (the
    search's: the CLI's and the operator's one step)."""
    cpu_gib = float(pool.plan.kv_offloading_size_gib
                    or request.policy.cpu_offload_budget_bytes / 2**30)
    results = weigh(request, pool.plan.with_offload(None),
                    options(allowance, pool.tensor_parallel, cpu_gib), stream)
    pick = chosen(results, CAPACITY_TIE, prices)
    return with_tier(pool, pick, explain(results, pick, CAPACITY_TIE, prices))


__all__ = ["TierAllowance", "TierOption", "TierPrices", "TierResult", "choose", "chosen",
           "explain", "options", "replace_expected", "weigh", "with_tier"]
