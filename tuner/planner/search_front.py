"""The search's Pareto front: capacity at SLO against cost and latency. Pure.

Over the configurations the search scored on the full stream, the ones no other beats on
every axis at once: more capacity at SLO (requests/s one replica serves within it), more
output tokens per second at the observed rate (on one GPU class, cost per token is its
hourly price over that), less latency against the SLO targets at the observed rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtune.tuner.plan import FrontPoint, KVPlan
from kvtune.tuner.planner.capacity import GoodputScore, Standing


def _dominates(a: FrontPoint, b: FrontPoint) -> bool:
    """``a`` is at least as good as ``b`` on every axis and better on one."""
    ge = (a.capacity_requests_per_second >= b.capacity_requests_per_second
          and a.output_tokens_per_second >= b.output_tokens_per_second
          and a.latency_vs_slo <= b.latency_vs_slo)
    gt = (a.capacity_requests_per_second > b.capacity_requests_per_second
          or a.output_tokens_per_second > b.output_tokens_per_second
          or a.latency_vs_slo < b.latency_vs_slo)
    return ge and gt


def _same_figures(a: FrontPoint, b: FrontPoint) -> bool:
    return (a.capacity_requests_per_second == b.capacity_requests_per_second
            and a.output_tokens_per_second == b.output_tokens_per_second
            and a.latency_vs_slo == b.latency_vs_slo)


def pareto_front(ranked: Sequence[tuple[KVPlan, Standing, bool]], rate_per_second: float,
                 latency_vs_slo: Callable[[GoodputScore], float]) -> tuple[FrontPoint, ...]:
    """The front over ``ranked`` ((plan, standing, chosen), in the search's order); the
    chosen one is always listed, flagged when a tie rule (precision, stability) chose it
    over a point that dominates it. Highest capacity first; of points with the same figures,
    the first in the search's order. A candidate's capacity is the highest rate its ladder
    saw it meet the SLO at (the chosen one's to the ladder's tolerance)."""
    points = [FrontPoint(
        vllm_args=tuple(plan.vllm_args()), chosen=chosen, on_front=True,
        capacity_requests_per_second=rate_per_second * st.lower_scale,
        slo_attainment=st.at_observed.slo_attainment,
        output_tokens_per_second=st.at_observed.output_tokens_per_second,
        ttft_p95_seconds=st.at_observed.ttft_p95_seconds,
        tpot_p95_seconds=st.at_observed.tpot_p95_seconds,
        latency_vs_slo=latency_vs_slo(st.at_observed),
    ) for plan, st, chosen in ranked]
    out: list[FrontPoint] = []
    for i, p in enumerate(points):
        dominated = any(_dominates(q, p) for q in points)
        duplicate = any(_same_figures(q, p) for q in points[:i])
        if p.chosen:
            out.append(p.model_copy(update={"on_front": not dominated}))
        elif not dominated and not duplicate:
            out.append(p)
    out.sort(key=lambda p: (-p.capacity_requests_per_second, -p.output_tokens_per_second,
                            p.latency_vs_slo))
    return tuple(out)


__all__ = ["pareto_front"]
