"""The capacity search sizes the CPU tier from the trace's reuse (``decide_offload_size``):
the smallest size within the capacity tie of the best, not the policy's budget; the plan
says how many GiB pay and why, with per-tier hit rates and what reuse saves."""

from __future__ import annotations

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.planner.search import CAPACITY_TIE, SearchSettings, search
from kvtune.tuner.simulator.goodput_search import TrafficScorer
from kvtune.tuner.simulator.workload import requests_from_trace
from kvtune.tuner.traces import Trace, TraceRequest

SESSIONS, TURNS, BLOCKS_PER_TURN, RATE = 64, 4, 5, 1.5
BUDGET_GIB = 256


def round_robin_trace() -> Trace:
    """64 sessions taking turns one after another, each turn re-sending its session's whole
    history (5 blocks of 512 tokens a turn) as Mooncake prefix ids: a history comes back after
    every other session's turn, 490K-650K distinct tokens later (30-40 GiB at fp8 KV), more
    than an L40S's KV cache holds (~394K tokens) and far less than the 256 GiB budget."""
    rows = []
    for k in range(SESSIONS * TURNS):
        turn, s = divmod(k, SESSIONS)
        ids = tuple(1 + s * 100 + j for j in range(BLOCKS_PER_TURN * (turn + 1)))
        rows.append(TraceRequest(k / RATE, 512 * len(ids), 100, ids))
    return Trace("round-robin", "mooncake-jsonl", rows)


@pytest.mark.slow
def test_the_tier_is_the_smallest_size_within_the_tie_not_the_budget() -> None:
    trace = round_robin_trace()
    request = PlanRequest(
        model=get_model("meta-llama/Llama-3.1-8B-Instruct"), gpu=get_gpu_class("L40S"),
        profile=profile_from_trace(trace),
        policy=PlanPolicy(slo=SLO(ttft_p95_seconds=3.0, tpot_p95_seconds=0.1),
                          cpu_offload_budget_bytes=BUDGET_GIB * 2**30))
    scorer = TrafficScorer(tuple(requests_from_trace(trace)))
    pool = search(request, scorer, settings=SearchSettings(rungs=(80, 256)))
    chosen = pool.plan.kv_offloading_size_gib
    assert chosen is not None and chosen < BUDGET_GIB
    s = pool.search
    assert s is not None and s.reuse is not None
    rows = {t.size_gib: t for t in s.reuse.tier_sizes}
    # Off, the reuse-distance sizes, the budget; the chosen one is marked.
    assert rows[0.0].basis == "no CPU tier" and BUDGET_GIB in rows and len(rows) >= 3
    assert [t.size_gib for t in s.reuse.tier_sizes if t.chosen] == [chosen]
    best = max(t.capacity_requests_per_second for t in rows.values())
    assert rows[chosen].capacity_requests_per_second >= best * (1 - CAPACITY_TIE)
    # Every smaller size (no tier included) falls short of the tie: the chosen size pays.
    for size, t in rows.items():
        if size < chosen:
            assert t.capacity_requests_per_second < best * (1 - CAPACITY_TIE), size
    assert rows[chosen].capacity_requests_per_second > rows[0.0].capacity_requests_per_second
    reason = next(r for r in pool.reasons if r.knob == "kv-offloading-size")
    assert reason.choice == f"{chosen:g}"
    assert reason.message.startswith(f"{chosen:g} GiB of CPU tier pays: capacity at SLO "
                                     f"{rows[chosen].capacity_requests_per_second:.3g} req/s")
    assert "the smallest within the 2% capacity tie" in reason.message
    assert "(p50)" in reason.message and "(budget)" in reason.message
    assert "comes back after p50 43 s" in reason.message
    # The chosen plan's figures are the search's capacity, with its hits per tier.
    # (The reuse figures are rounded to 4 decimals: they travel in a search Job's answer.)
    assert s.capacity_requests_per_second == pytest.approx(
        rows[chosen].capacity_requests_per_second, abs=1e-4)
    e = pool.expected
    assert e.cpu_prefix_hit_rate is not None and e.cpu_prefix_hit_rate > 0.1
    assert e.cpu_prefix_hit_rate == pytest.approx(s.reuse.cpu_prefix_hit_rate, abs=1e-4)
    assert s.reuse.cpu_prefix_hit_rate == rows[chosen].cpu_prefix_hit_rate
    assert e.prefix_hit_rate == pytest.approx(s.reuse.gpu_prefix_hit_rate, abs=1e-4)
    assert rows[0.0].cpu_prefix_hit_rate == 0.0
    assert s.reuse.prefill_gpu_seconds_saved_per_day > 0
    assert s.reuse.cpu_tier_gib_per_replica == chosen
