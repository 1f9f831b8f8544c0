"""Agents (issue 27, the article's pattern 2): session KV kept across tool calls in a CPU tier
sized from the session gaps, which beats the tier at the policy's budget on capacity per
dollar on the shipped agentic trace (bench/agent_tier.py prints the full figures)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvtune.e2e.traces import TRACES_DIR
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.prices import price_for
from kvtune.tuner.planner import decide_offload_size
from kvtune.tuner.planner.capacity import GoodputScore
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.simulator.agent_tier import (
    TierRun,
    break_even_host_price,
    replay,
    session_size_gib,
)
from kvtune.tuner.simulator.goodput_search import TrafficScorer
from kvtune.tuner.simulator.workload import requests_from_trace
from kvtune.tuner.traces import Trace, load_trace

REPO = Path(__file__).resolve().parents[2]
TRACE = TRACES_DIR / "agentic_trace.jsonl"
BUDGET_GIB = 256.0
HOST_USD_PER_GIB_HOUR = 0.004  # the bench's assumed price; the break-even bounds the claim


def _request(trace: Trace, kind: str = "agent") -> PlanRequest:
    return PlanRequest(
        model=get_model("meta-llama/Llama-3.3-70B-Instruct"), gpu=get_gpu_class("H200"),
        weights_dtype="fp8", profile=profile_from_trace(trace, kind=kind),  # type: ignore[arg-type]
        policy=PlanPolicy(slo=SLO(ttft_p95_seconds=4.0, tpot_p95_seconds=0.05),
                          cpu_offload_budget_bytes=int(BUDGET_GIB * 2**30)))


def test_the_shipped_trace_is_what_its_seeded_generator_writes() -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_agentic_trace.py"),
                          "--check"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_trace_has_the_stated_shape() -> None:
    """Tool-call sessions: every call but a session's first extends an earlier prompt."""
    p = profile_from_trace(load_trace(TRACE), kind="agent")
    gaps = p.session_gap_seconds
    assert gaps is not None and p.requests is not None
    assert gaps.count >= p.requests - 80  # 80 sessions: all but their first calls
    assert 5.0 < gaps.p50 < gaps.p90 < 60.0
    assert p.shared_prefix_tokens == 6 * 512 and p.multi_turn


def test_the_session_size_is_rate_times_ttl_times_prompt_and_only_for_agents() -> None:
    trace = load_trace(TRACE)
    request = _request(trace)
    plan = plan_pool(request).plan.with_offload(None)
    run = PlanRun(request)
    per_token = decide_offload_size.tier_bytes_per_token(run, plan)
    p = request.profile
    assert p.session_gap_seconds is not None and p.request_rate_per_second is not None
    want = p.request_rate_per_second * p.session_gap_seconds.p90 * p.context_tokens.p50
    option = decide_offload_size.session_gap_size(p, per_token)
    assert option is not None
    assert option.size_gib * 2**30 >= want * per_token > (option.size_gib - 1) * 2**30
    sizes = decide_offload_size.options(run, plan, BUDGET_GIB)
    assert [o.size_gib for o in sizes] == sorted(o.size_gib for o in sizes)
    assert option in sizes and sizes[-1].size_gib == BUDGET_GIB
    # The same traffic declared as anything but an agent's gets no session size.
    custom = request.model_copy(update={"profile": p.model_copy(update={"kind": "custom"})})
    assert all(not o.basis.startswith("session")
               for o in decide_offload_size.options(PlanRun(custom), plan, BUDGET_GIB))


@pytest.mark.slow
def test_the_session_gap_tier_beats_offload_at_budget_on_capacity_per_dollar() -> None:
    trace = load_trace(TRACE)
    request = _request(trace)
    base = plan_pool(request).plan.with_offload(None)
    session = session_size_gib(request, base)
    assert session is not None and session < BUDGET_GIB
    scorer = TrafficScorer(tuple(requests_from_trace(trace)))
    sized = replay(request, base, scorer, "session gaps", session, 0.02)
    budget = replay(request, base, scorer, "budget", BUDGET_GIB, 0.02)
    price = price_for("H200")
    assert price is not None
    gpu_usd = price.usd_per_gpu_hour
    assert sized.at_observed.cpu_hit_rate > 0  # the tier catches the sessions' returns
    assert (sized.capacity_per_usd(gpu_usd, HOST_USD_PER_GIB_HOUR)
            > budget.capacity_per_usd(gpu_usd, HOST_USD_PER_GIB_HOUR))
    even = break_even_host_price(sized, budget, gpu_usd)
    # It wins at any host price above a hundredth of a cent per GiB-hour.
    assert even is not None and even < 1e-3


def test_break_even_price() -> None:
    at = GoodputScore(1.0, True, 1.0, 1.0, 0.05, 10)
    small, large = TierRun("s", 50.0, 0.99, at), TierRun("l", 250.0, 1.0, at)
    even = break_even_host_price(small, large, 4.0)
    assert even is not None
    assert small.capacity_per_usd(4.0, even * 1.01) > large.capacity_per_usd(4.0, even * 1.01)
    assert small.capacity_per_usd(4.0, even * 0.99) < large.capacity_per_usd(4.0, even * 0.99)
    assert break_even_host_price(TierRun("s", 50.0, 1.1, at), large, 4.0) == 0.0
