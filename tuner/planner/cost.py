"""What a searched configuration costs (docs/planner.md, "Cost"): GPU hourly prices
(``tuner/facts/prices.py``) over what the simulator predicts one replica serves.

- cost per million output tokens = price per GPU-hour x GPUs per replica / (output tokens
  served per second at the observed rate x 3600) x 10^6;
- cost per million requests meeting the SLO: the same over the capacity at SLO (the highest
  rate one replica serves within it: what a replica costs per good request when the pool is
  scaled to the traffic, ``replicas_needed`` replicas).

On one GPU class the price is a constant, so the Pareto front of the search (capacity,
output tokens per second, latency) is the front of capacity against cost; across GPU classes
the price decides, and ``rank_by_cost`` orders pools by the chosen point's cost per million
requests meeting the SLO. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtune.tuner.facts.prices import GPUPrice
from kvtune.tuner.plan import CostFigures, PoolPlan
from kvtune.tuner.planner import reuse_money

_PER_MILLION_HOURS = 1e6 / 3600.0


def per_million(usd_per_hour: float, per_second: float) -> float | None:
    """USD per million units served at ``per_second`` by something costing ``usd_per_hour``;
    None when nothing is served."""
    if per_second <= 0:
        return None
    return usd_per_hour * _PER_MILLION_HOURS / per_second


def priced(pool: PoolPlan, price: GPUPrice | None) -> PoolPlan:
    """``pool`` with the cost of its chosen configuration and of every front point (no
    change without a capacity search or a price)."""
    s = pool.search
    if s is None or price is None:
        return pool
    # One engine's GPUs (the search plans one engine): TP, times its stages under PP.
    gpus = pool.tensor_parallel * (pool.layout.pipeline_parallel if pool.layout else 1)
    hourly = price.usd_per_gpu_hour * gpus
    cost = CostFigures(
        usd_per_gpu_hour=price.usd_per_gpu_hour, price_source=price.source,
        gpus_per_replica=gpus, usd_per_replica_hour=hourly,
        cost_per_million_output_tokens_usd=per_million(hourly, s.output_tokens_per_second),
        cost_per_million_good_requests_usd=per_million(hourly, s.capacity_requests_per_second),
    )
    front = tuple(p.model_copy(update={
        "cost_per_million_output_tokens_usd": per_million(hourly, p.output_tokens_per_second),
        "cost_per_million_good_requests_usd": per_million(hourly,
                                                          p.capacity_requests_per_second),
    }) for p in s.front)
    pool = pool.model_copy(update={"search": s.model_copy(update={"cost": cost,
                                                                   "front": front})})
    return reuse_money.priced(pool, price)  # what prefix reuse saves, at the same price


def _good_request_cost(pool: PoolPlan) -> float:
    c = pool.tp_choice
    if c is not None:
        # tensorParallel auto (planner/tp_choice.py): the replicas chosen serve the rate.
        at_rate = next((o.cost_per_million_requests_at_rate_usd for o in c.options
                        if o.chosen), None)
        if at_rate is not None:
            return at_rate
    s = pool.search
    if s is None or s.cost is None:
        return float("inf")
    figure = s.cost.cost_per_million_good_requests_usd
    return figure if figure is not None else float("inf")


def rank_by_cost(pools: Sequence[PoolPlan]) -> list[PoolPlan]:
    """Pools cheapest first by what a million requests meeting the SLO cost on their chosen
    configuration (over its capacity at SLO: a class that needs more replicas pays more); pools
    without a price or a search last, in their given order."""
    return sorted(pools, key=_good_request_cost)


__all__ = ["per_million", "priced", "rank_by_cost"]
