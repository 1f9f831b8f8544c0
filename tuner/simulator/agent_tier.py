"""Capacity per dollar of a CPU tier sized from an agent's session gaps against the tier at
the policy's budget (issue 27: "an agentic trace gets a tier sized from its session gaps that
beats offload-at-budget on capacity per dollar").

Each size is replayed on the same request stream on its own capacity ladder (req/s per
replica at SLO, ``capacity.climb``); a replica's cost per hour is its GPUs' price plus the
tier's pinned host memory at a price per GiB-hour. Capacity per dollar is requests per second
per (dollar per hour). kvtune ships no host-memory price (``planner/reuse_money.py``), so the
caller gives one; ``break_even_host_price`` says from which price on the smaller tier wins, so
the claim does not hang on one assumed figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner import decide_offload_size
from kvtune.tuner.planner.capacity import GoodputScore
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.simulator import tier_choice
from kvtune.tuner.simulator.goodput_search import TrafficScorer


@dataclass(frozen=True, slots=True)
class TierRun:
    """One tier size replayed: its capacity at SLO and its figures at the stream's rate."""

    label: str
    size_gib: float  # host GiB per replica (0: no tier)
    capacity_requests_per_second: float
    at_observed: GoodputScore

    def usd_per_hour(self, gpu_usd_per_hour: float, host_usd_per_gib_hour: float) -> float:
        return gpu_usd_per_hour + self.size_gib * host_usd_per_gib_hour

    def capacity_per_usd(self, gpu_usd_per_hour: float, host_usd_per_gib_hour: float) -> float:
        """Requests per second per dollar-per-hour of one replica."""
        return self.capacity_requests_per_second / self.usd_per_hour(
            gpu_usd_per_hour, host_usd_per_gib_hour)


def session_size_gib(request: PlanRequest, plan: KVPlan) -> float | None:
    """The session-gap tier the planner tries for ``plan`` (``decide_offload_size``), GiB."""
    run = PlanRun(request)
    option = decide_offload_size.session_gap_size(
        request.profile, decide_offload_size.tier_bytes_per_token(run, plan))
    return None if option is None else option.size_gib


def replay(request: PlanRequest, plan: KVPlan, scorer: TrafficScorer, label: str,
           size_gib: float | None, tolerance: float) -> TierRun:
    """``plan`` with a native CPU tier of ``size_gib`` (None: none) on its capacity ladder."""
    capacity, at_own_rate = tier_choice.capacity_at_slo(
        request, plan.with_offload(size_gib), scorer, tolerance)
    return TierRun(label, size_gib or 0.0, capacity, at_own_rate)


def break_even_host_price(small: TierRun, large: TierRun, gpu_usd_per_hour: float
                          ) -> float | None:
    """The host price per GiB-hour above which ``small`` gives more capacity per dollar than
    ``large`` (0: at any price; None: at no price, ``small`` serves less and costs no less)."""
    c_s, c_l = small.capacity_requests_per_second, large.capacity_requests_per_second
    # c_s / (G + s p) > c_l / (G + l p)  <=>  p (c_s l - c_l s) > G (c_l - c_s)
    slope = c_s * large.size_gib - c_l * small.size_gib
    gap = gpu_usd_per_hour * (c_l - c_s)
    if gap < 0:
        return 0.0 if slope >= 0 else None  # small serves more: it wins unless it costs more
    if slope <= 0:
        return None
    return gap / slope


__all__ = ["TierRun", "break_even_host_price", "replay", "session_size_gib"]
