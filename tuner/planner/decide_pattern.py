"""The article's four reuse patterns (issue 27 item 4): one reason per pattern saying what the
pinned versions offer for it, what they cannot do, and what kvtune does instead. No knob
changes here; the knobs are decided by their own steps (prefix caching, the CPU tier).

- **multi-tenant** (shared system prompts): vLLM 0.33's per-request ``cache_salt``
  (``entrypoints/openai/{chat_completion,completion}/protocol.py``) is mixed into the first
  block's hash only (``v1/core/kv_cache_utils.py``: ``cache_salt_keys`` when
  ``start_token_idx == 0``), so requests with different salts share no block: isolation,
  per tenant. There is no pinning or retention priority: freed blocks go to one LRU queue
  (``v1/core/block_pool.py: free_blocks``), so a prefix stays resident only by being used;
- **rag**: CacheBlend cannot run on the pins (``tuner/rag_blend.py``);
- **agent**: session KV kept across tool calls in the CPU tier, sized from the session gaps
  (``decide_offload_size``); neither tier expires by time, so the TTL is the size;
- **chat** with multi-turn traffic: routing. The article asks for consistent hashing on the
  session with bounded load; the Inference Extension v1.5.0's plugin registry
  (``cmd/epp/runner/runner.go: registerInTreePlugins``) has no session-hash picker and no
  load bound, so kvtune renders the nearest it offers (``operator/routing/inference_pool.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtune.tuner.plan import Reason
from kvtune.tuner.planner.decide_offload_size import gpu_kv_tokens
from kvtune.tuner.planner.draft import Draft, need
from kvtune.tuner.rag_blend import BLEND_UNSUPPORTED

if TYPE_CHECKING:
    from kvtune.tuner.planner.planrun import PlanRun

ROUTING_NEAREST = (
    "the Inference Extension v1.5.0 has no consistent hashing on a session and no bounded "
    "load; with spec.routing.enabled kvtune renders the nearest, its "
    "prefix-cache-affinity-filter (a conversation's history is its prefix), then the load "
    "scorers. Overflow is not bounded by load (docs/reuse-patterns.md)")


def _tenant(run: PlanRun, draft: Draft) -> Reason:
    plan = need(draft.plan, "the assembled plan")
    shared = run.req.profile.shared_prefix_tokens
    tokens = gpu_kv_tokens(run, plan)
    share = f"{shared / tokens:.2%}" if tokens else "all"
    return Reason(
        knob="cache-salt", choice="per tenant (request field)", code="IsolationNotRetention",
        message=(
            f"the shared {shared:,}-token prefix stays resident by use ({share} of the GPU's "
            f"{tokens:,} KV tokens): vLLM 0.33 cannot pin it or give it retention priority "
            "(freed blocks are evicted least recently used). Its per-request cache_salt "
            "isolates tenants (different salts share no KV), at one copy of the prompt per "
            "salt"))


def _agent(run: PlanRun, draft: Draft) -> Reason:
    plan = need(draft.plan, "the assembled plan")
    gaps = run.req.profile.session_gap_seconds
    if not plan.kv_offloading_size_gib:
        return Reason(knob="session-kv", choice="GPU only", code="NoCPUBudget", message=(
            "session KV is kept across tool calls only while the GPU's prefix cache holds it: "
            "the policy gives no CPU budget for a tier (tuning.cpuOffloadGiB)"))
    basis = (f"the search tries the size the session gaps ask for (rate x p90 gap "
             f"{gaps.p90:g} s x prompt tokens)" if gaps is not None else
             "without session gaps (a trace gives them) it stays at the policy's budget")
    return Reason(knob="session-kv", choice="CPU tier", code="SessionTier", message=(
        f"session KV is kept across tool calls in the CPU tier; {basis}. No tier vLLM 0.33 "
        "runs expires blocks by time (LRU), so the TTL is the tier's size"))


def report(run: PlanRun, draft: Draft) -> Draft:
    """The draft with its pattern's reason (module doc); unchanged for other workloads."""
    profile = run.req.profile
    if profile.kind == "multi-tenant":
        return draft.reason(_tenant(run, draft))
    if profile.kind == "rag":
        return draft.reason(Reason(knob="cache-blend", choice="off", code="NotOnThePins",
                                   message=BLEND_UNSUPPORTED))
    if profile.kind == "agent":
        return draft.reason(_agent(run, draft))
    if profile.kind == "chat" and profile.multi_turn:
        return draft.reason(Reason(knob="routing", choice="prefix-cache-affinity-filter",
                                   code="NearestToConsistentHashing",
                                   message=f"sessions: {ROUTING_NEAREST}"))
    return draft


__all__ = ["ROUTING_NEAREST", "report"]
