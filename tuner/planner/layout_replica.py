"""The capacity search's summary of a chosen layout, per replica.

The search plans one engine (one DP rank) on its share of the traffic
(``layout_choice``: each DP rank serves 1/DP of a replica's share), so its summary counts
engines: its ``replicas`` are engines, its capacity at SLO and output tokens are one
engine's and ``replicas_needed`` counts engines. A pool scales by replicas of DP engines, so
once the layout is chosen the summary is restated per replica: capacity, rates and tokens
times DP, replicas and replicas needed in replicas (``ceil(observed rate / replica
capacity)``). Ratios (SLO attainment, latencies, cost per million) do not change. The
engine's own figures (KV tokens, sequences) stay in ``expected``, as vLLM logs them per
engine; its ``capacity_requests_per_second`` and ``replicas_needed`` are restated too.
"""

from __future__ import annotations

import math

from kvtune.tuner.plan import PoolPlan, SearchSummary

# The search's own reasons say "req/s per replica" of the engine it replayed.
_ENGINE_WORDS = (" req/s per replica;", " req/s per engine (DP rank);")


def _replicas_needed(observed_rate: float, capacity: float) -> int | None:
    """ceil(observed rate / capacity), as ``capacity.replicas_needed``; None: no capacity."""
    if capacity <= 0:
        return None
    return max(1, math.ceil(observed_rate / capacity - 1e-9))


def per_replica_summary(s: SearchSummary, dp: int) -> SearchSummary:
    """``s`` (one engine's, over ``s.replicas`` engines) restated for replicas of ``dp``
    engines."""
    capacity = s.capacity_requests_per_second * dp
    reuse = s.reuse
    if reuse is not None:
        # The CPU tier is one engine's --kv-offloading-size; a replica has dp of them.
        reuse = reuse.model_copy(update={
            "cpu_tier_gib_per_replica": reuse.cpu_tier_gib_per_replica * dp})
    return s.model_copy(update={
        "replicas": max(1, s.replicas // dp),
        "rate_per_replica_per_second": s.rate_per_replica_per_second * dp,
        "capacity_requests_per_second": capacity,
        "replicas_needed": _replicas_needed(s.observed_rate_per_second, capacity),
        "output_tokens_per_second": s.output_tokens_per_second * dp,
        "littles_law_sequences": s.littles_law_sequences * dp,
        "alternatives": tuple(a.model_copy(update={
            "capacity_requests_per_second": a.capacity_requests_per_second * dp})
            for a in s.alternatives),
        "front": tuple(p.model_copy(update={
            "capacity_requests_per_second": p.capacity_requests_per_second * dp,
            "output_tokens_per_second": p.output_tokens_per_second * dp}) for p in s.front),
        "reuse": reuse,
    })


def per_replica(pool: PoolPlan) -> PoolPlan:
    """``pool`` (a chosen layout's plan) with its search summary per replica; unchanged
    without a search or at DP 1 (one engine is the replica)."""
    s, layout = pool.search, pool.layout
    if s is None or layout is None or layout.data_parallel == 1:
        return pool
    dp = layout.data_parallel
    summary = per_replica_summary(s, dp)
    expected = pool.expected.model_copy(update={
        "capacity_requests_per_second": summary.capacity_requests_per_second,
        "replicas_needed": summary.replicas_needed})
    old, new = _ENGINE_WORDS
    reasons = tuple(r.model_copy(update={"message": r.message.replace(old, new)})
                    if r.code == "BestCapacity" else r for r in pool.reasons)
    warnings = pool.warnings
    if not s.slo_met and s.slo_set:
        from kvtune.tuner.planner.search_report import slo_at_risk_message

        # The search's SLO-at-risk line counted engines; say it per replica.
        was, now = slo_at_risk_message(s), slo_at_risk_message(summary)
        warnings = tuple(now if w == was else w for w in warnings)
    return pool.model_copy(update={"search": summary, "expected": expected,
                                   "reasons": reasons, "warnings": warnings})

