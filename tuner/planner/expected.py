"""The figures a plan expects once vLLM runs it (``ExpectedFigures``): KV bytes per token,
KV cache bytes, blocks and tokens as vLLM logs them, concurrent p95 sessions and the decode
step time. The operator compares them with what vLLM reports after rollout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtune.tuner.facts.kvmemory import kv_bytes_per_token, request_blocks
from kvtune.tuner.plan import CandidateScore, ExpectedFigures, KVPlan
from kvtune.tuner.planner import decode

if TYPE_CHECKING:
    from kvtune.tuner.planner.planrun import PlanRun


def figures(run: PlanRun, plan: KVPlan, score: CandidateScore | None) -> ExpectedFigures:
    batched = plan.max_num_batched_tokens
    mem = run.memory(
        plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs, batched,
        plan.gpu_memory_utilization,
    )
    sessions = run.sessions(
        mem, plan.kv_cache_dtype, plan.block_size, run.p95_session, batched,
        plan.max_model_len,
    )
    per_seq = run.request_bytes(
        plan.kv_cache_dtype, plan.block_size, min(run.p50_session, plan.max_model_len),
        batched, plan.max_model_len,
    )
    step = decode.decode_step_seconds(
        run.model, run.gpu, run.tp, run.weights_bytes, plan.max_num_seqs, per_seq, run.layout
    ) * run.decode_time_scale
    return ExpectedFigures(
        kv_bytes_per_token=kv_bytes_per_token(
            run.model, plan.kv_cache_dtype, run.tp, model_dtype=run.model_dtype),
        kv_cache_bytes=mem.kv_cache_bytes,
        # As vLLM logs it ("GPU KV cache size: N tokens"): max-model-len requests that
        # fit times max-model-len; num_blocks x block_size for single-kind models.
        # Under decode context parallel a block holds block_size tokens on each of DCP ranks.
        kv_cache_tokens=int(mem.num_gpu_blocks / request_blocks(
            run.model, plan.max_model_len, plan.block_size, batched, plan.max_model_len,
        ) * plan.max_model_len) * run.layout.decode_context_parallel,
        num_gpu_blocks=mem.num_gpu_blocks,
        weights_bytes_per_gpu=run.weights_bytes,
        non_kv_bytes_per_gpu=mem.non_kv.total_bytes,
        concurrent_sequences=sessions,
        concurrent_sequences_context_tokens=min(run.p95_session, plan.max_model_len),
        decode_step_seconds=round(step, 6),
        prefix_hit_rate=score.prefix_hit_rate if score is not None else None,
    )
