"""The article's four reuse patterns (issue 27 item 4), each on its own traffic shape: the plan
says what the pinned vLLM, LMCache and Inference Extension offer for it and what they cannot
do (``tuner/planner/decide_pattern.py``), and RAG's CacheBlend estimate
(``tuner/rag_blend.py``)."""

from __future__ import annotations

import random

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import PoolPlan, Reason
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile, profile_from_trace
from kvtune.tuner.rag_blend import RagRequest, estimate
from kvtune.tuner.simulator.goodput_search import TrafficScorer
from kvtune.tuner.simulator.workload import requests_from_trace
from kvtune.tuner.traces import Trace, TraceRequest
from kvtune.tuner.workload import WorkloadKind

L8 = "meta-llama/Llama-3.1-8B-Instruct"


def _request(trace: Trace, kind: WorkloadKind, cpu_gib: int = 0) -> PlanRequest:
    return PlanRequest(model=get_model(L8), gpu=get_gpu_class("H100"),
                       profile=profile_from_trace(trace, kind=kind),
                       policy=PlanPolicy(slo=SLO(ttft_p95_seconds=2.0, tpot_p95_seconds=0.05),
                                         cpu_offload_budget_bytes=cpu_gib * 2**30))


def _reason(pool: PoolPlan, knob: str) -> Reason:
    found = [r for r in pool.reasons if r.knob == knob]
    assert len(found) == 1, [r.knob for r in pool.reasons]
    return found[0]


def tenant_trace(tenants: int = 40, requests: int = 400) -> Trace:
    """Every request: the same 6-block system prompt, then 1-4 blocks of its own."""
    rng = random.Random(1)
    rows, next_id = [], 100
    for k in range(requests):
        own = rng.randint(1, 4)
        ids = (*range(6), *range(next_id, next_id + own))
        next_id += own
        rows.append(TraceRequest(k * 0.25, 512 * len(ids), 200, ids))
    del tenants
    return Trace("tenants", "mooncake-jsonl", rows)


def session_trace(sessions: int = 30, turns: int = 6) -> Trace:
    """Conversations taking turns, each turn re-sending its history plus one block."""
    rows = []
    for k in range(sessions * turns):
        turn, s = divmod(k, sessions)
        ids = tuple(1000 * (s + 1) + j for j in range(turn + 2))
        rows.append(TraceRequest(k * 0.5, 512 * len(ids), 150, ids))
    return Trace("chat", "mooncake-jsonl", rows)


def test_multi_tenant_the_shared_prefix_stays_resident_and_the_plan_says_what_salt_does() -> None:
    trace = tenant_trace()
    request = _request(trace, "multi-tenant")
    assert request.profile.shared_prefix_tokens == 6 * 512
    pool = plan_pool(request)
    reason = _reason(pool, "cache-salt")
    assert reason.code == "IsolationNotRetention"
    assert "3,072-token" in reason.message and "cannot pin" in reason.message
    # Resident by use: at the trace's rate every request after the first hits the prefix.
    score = TrafficScorer(tuple(requests_from_trace(trace))).score(
        request, pool.plan, len(trace.requests))
    prompt = sum(r.prompt_tokens for r in trace.requests)
    shared_share = (len(trace.requests) - 1) * 6 * 512 / prompt
    assert score.prefix_hit_rate >= shared_share * 0.99


def test_rag_cacheblend_estimate_on_out_of_order_chunks() -> None:
    """Popular chunks retrieved in a different order each time: the prefix cache catches the
    instruction only, CacheBlend would catch most chunks (an estimate)."""
    rng = random.Random(7)
    corpus = list(range(200))
    weights = [1.0 / (i + 1) for i in corpus]  # Zipf popularity
    reqs = []
    for _ in range(500):
        chunks: list[int] = []
        while len(chunks) < 5:
            c = rng.choices(corpus, weights)[0]
            if c not in chunks:
                chunks.append(c)
        reqs.append(RagRequest(0, tuple(chunks), 50))
    est = estimate(reqs, instruction_tokens=400, chunk_tokens=512)
    assert est.prefix_share < 0.35  # the instruction, and the popular chunks ranked first
    assert est.blend_extra_share > 0.4 > est.prefix_share  # chunks seen before, elsewhere
    # The same chunks in the same order: the prefix cache already catches them all.
    same = estimate([RagRequest(0, (1, 2, 3), 50)] * 10, 400, 512)
    assert same.blendable_tokens == 0 and same.prefix_share > 0.8


def test_rag_plan_says_cacheblend_is_off_on_the_pins() -> None:
    pool = plan_pool(PlanRequest(model=get_model(L8), gpu=get_gpu_class("H100"),
                                 profile=preset_profile("rag")))
    reason = _reason(pool, "cache-blend")
    assert reason.choice == "off" and "registers the model" in reason.message
    assert pool.kv_tier is None and "kv-transfer-config" not in " ".join(pool.vllm_args())


def test_agent_plan_keeps_session_kv_in_a_tier_or_says_why_not() -> None:
    trace = session_trace()
    with_tier = _reason(plan_pool(_request(trace, "agent", cpu_gib=64)), "session-kv")
    assert with_tier.code == "SessionTier" and "session gaps ask for" in with_tier.message
    without = _reason(plan_pool(_request(trace, "agent")), "session-kv")
    assert without.code == "NoCPUBudget"


def test_multi_turn_chat_plan_states_the_nearest_routing() -> None:
    trace = session_trace()
    request = _request(trace, "chat")
    assert request.profile.multi_turn
    reason = _reason(plan_pool(request), "routing")
    assert reason.choice == "prefix-cache-affinity-filter"
    assert "no consistent hashing" in reason.message and "bounded" in reason.message
    # Single-turn chat gets no routing reason.
    single = plan_pool(PlanRequest(model=get_model(L8), gpu=get_gpu_class("H100"),
                                   profile=preset_profile("rag")))
    assert not [r for r in single.reasons if r.knob == "routing"]
