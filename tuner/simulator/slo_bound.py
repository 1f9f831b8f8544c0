"""When no configuration can meet the SLO at any rate: a closed-form bound, before simulating.

The simulator times a step from its tokens and the bytes it reads (``timing.StepCostModel``):
at least the weights read once (memory-bound), at least the FLOPs of its tokens (compute-
bound), at least the engine's per-step overhead. Two floors follow that no knob can beat:

- **TTFT** of the p95 prompt: its uncached tokens prefilled alone, in one step (chunking
  only adds steps: every step reads the weights again and the FLOPs are the same), nothing
  else running, no queue, no KV read beyond its own tokens. Uncached: the prompt less the
  shared system prompt; where history may be cached (multi-turn traffic, or a profile with an
  observed prefix hit rate the traffic is calibrated to) only one token is counted, so the
  floor stays a floor.
- **TPOT**: one decode step of one sequence with no context (the weights read once).

If the p95 prompt's floor exceeds the TTFT target, more than 5 % of requests miss it on every
configuration; if one decode step exceeds the TPOT target, every request with two or more
output tokens (the median request has) misses it. Either way no rate meets the SLO:
``SLOUnreachable``, with the floors, instead of a search that would score zeros until its
budget runs out.
"""

from __future__ import annotations

from kvtune.tuner.plan import SLOUnreachable
from kvtune.tuner.planner.decide_max_num_seqs import DEFAULT_TPOT_SECONDS
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.search import DEFAULT_TTFT_SECONDS
from kvtune.tuner.simulator import pipeline_costs
from kvtune.tuner.simulator.engine import step_cost_for


def uncached_prompt_tokens(request: PlanRequest) -> int:
    """The p95 prompt's tokens that no cache can serve (module doc)."""
    profile = request.profile
    if profile.multi_turn or profile.prefix_hit_rate is not None:
        return 1
    return max(1, profile.context_tokens.p95 - profile.shared_prefix_tokens)


def latency_floors(request: PlanRequest, kv_cache_dtype: str) -> tuple[float, float, int]:
    """(TTFT floor, TPOT floor, uncached prompt tokens), in seconds (module doc). The KV
    dtype only names the cost model: the floors read no KV beyond the prompt's own."""
    cost = step_cost_for(request, kv_cache_dtype)
    prompt = uncached_prompt_tokens(request)
    # Causal attention of one prompt over itself: n (n + 1) / 2 (query, key) pairs.
    ttft = cost.step_seconds(prompt, 0, prompt * (prompt + 1) / 2, overlapped=True)
    tpot = cost.step_seconds(1, 0, 1.0, overlapped=True)
    pp = request.pipeline_parallel
    if pp > 1:
        # ``cost`` is one stage's: a token crosses every stage and the sends between them.
        send = pipeline_costs.send_seconds_per_token(request)
        ttft = pipeline_costs.latency_seconds(ttft, pp, send * prompt)
        tpot = pipeline_costs.latency_seconds(tpot, pp, send)
    return ttft, tpot, prompt


def slo_unreachable(request: PlanRequest, kv_cache_dtype: str) -> SLOUnreachable | None:
    """The bound's verdict: None when some configuration may meet the SLO."""
    slo = request.policy.slo
    if slo.ttft_p95_seconds is None and slo.tpot_p95_seconds is None:
        return None  # the defaults are the planner's, not a promise to anyone
    ttft_target = slo.ttft_p95_seconds or DEFAULT_TTFT_SECONDS
    tpot_target = slo.tpot_p95_seconds or DEFAULT_TPOT_SECONDS
    ttft, tpot, prompt = latency_floors(request, kv_cache_dtype)
    missed: list[str] = []
    if ttft > ttft_target:
        missed.append(f"the p95 prompt's prefill ({prompt:,} uncached tokens in one step, "
                      f"served alone) takes at least {ttft * 1000:.1f} ms, over the TTFT "
                      f"p95 target of {ttft_target * 1000:g} ms")
    # TPOT counts from the second output token: only a floor when most requests have one.
    if tpot > tpot_target and request.profile.output_tokens.p50 >= 2:
        missed.append(f"one decode step (one sequence alone, the weights read once) takes "
                      f"at least {tpot * 1000:.2f} ms, over the TPOT p95 target of "
                      f"{tpot_target * 1000:g} ms")
    if not missed:
        return None
    message = (f"SLO unreachable on {request.gpu.name} (tensor parallel "
               f"{request.tensor_parallel}) at any request rate: {'; '.join(missed)}; the best "
               f"attainable is TTFT {ttft * 1000:.1f} ms, TPOT {tpot * 1000:.2f} ms. Loosen the "
               "SLO, or plan a faster GPU class or more tensor parallelism")
    return SLOUnreachable(ttft_floor_seconds=ttft, tpot_floor_seconds=tpot,
                          ttft_target_seconds=ttft_target, tpot_target_seconds=tpot_target,
                          prompt_tokens=prompt, message=message)


__all__ = ["latency_floors", "slo_unreachable", "uncached_prompt_tokens"]
