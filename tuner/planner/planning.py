"""The offline planner: one pool's vLLM KV-cache configuration, with a reason for every
choice and the figures it expects.

``plan_pool`` below makes the decisions in this order (each reads the ones before it); each
lives in its own module, and docs/planner.md has the table:

1. ``max-num-batched-tokens``: vLLM's default for the GPU (``decide_batched_tokens``).
2. ``gpu-memory-utilization``: the largest safe fraction (``decide_utilization``).
3. ``enable-prefix-caching``: from the profile's sharing (``decide_prefix_offload``).
4. ``max-model-len``: a high quantile of prompt + output (``decide_max_model_len``).
5. ``kv-cache-dtype``: the widest that holds the target concurrency and passes pre-flight
   (``decide_dtype``); may shrink max-model-len.
6. ``max-num-seqs``: the decode bandwidth model, capped by what fits (``decide_max_num_seqs``).
7. ``max-num-batched-tokens`` again, for the TTFT SLO (``decide_batched_tokens.tune``).
8. ``kv-offloading-size`` (``decide_prefix_offload``).
9. ``block-size`` (``decide_block_size``), with a ``CandidateScorer`` together with
   max-num-seqs; then the attention backend vLLM will pick (``decide_attention_backend``).

Every knob can be pinned (``PlanPolicy.pins``); a pin that can never work raises
``InvalidInput`` (``validation``) naming the pin, the value and the allowed values. When
nothing fits, ``NoFeasiblePlan`` (``infeasible``) quotes the bytes needed and available and
the smallest changes that fit. Shared state and memory arithmetic: ``planrun.PlanRun``.
"""

from __future__ import annotations

from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan import CandidateScore, KVPlan, PoolPlan, Reason, offload_backend
from kvtune.tuner.planner import (
    budget,
    decide_attention_backend,
    decide_batched_tokens,
    decide_block_size,
    decide_dtype,
    decide_max_model_len,
    decide_max_num_seqs,
    decide_prefix_offload,
    decide_utilization,
    expected,
    infeasible,
    kv_dtype_options,
)
from kvtune.tuner.planner.checks import WEIGHTS_AS_PLANNED
from kvtune.tuner.planner.planrun import MAX_NUM_SEQS_CEILING, Memory, PlanRun
from kvtune.tuner.planner.policy import PlanPolicy

# Re-exported: the planner's public names (cli, operator, simulator, tests import them here).
from kvtune.tuner.planner.request import CandidateScorer, PlanRequest, session_tokens

__all__ = [
    "CandidateScorer",
    "PlanRequest",
    "kv_capacity_by_dtype",
    "plan_pool",
    "preflight",
    "session_tokens",
]


def plan_pool(request: PlanRequest, scorer: CandidateScorer | None = None) -> PoolPlan:
    """Plan one pool. Pure: no I/O. Raises ``NoFeasiblePlan`` when nothing fits and
    ``InvalidInput`` for a pin or input that can never work."""
    run = PlanRun(request)  # validates the request and the pins
    pins = run.pins

    batched = decide_batched_tokens.runtime_default(run)
    utilization = decide_utilization.decide(run)
    prefix_caching = decide_prefix_offload.prefix_caching(run)
    max_model_len, len_code, len_message = decide_max_model_len.target(run)
    run.len_target = max_model_len
    decide_utilization.check_room(run, batched, utilization, max_model_len)

    tpot, tpot_why = decide_max_num_seqs.tpot_target(run)
    dtype, (max_model_len, len_code, len_message) = decide_dtype.decide(
        run, batched, utilization, max_model_len, len_code, len_message, tpot, tpot_why)

    # max-num-seqs: bandwidth model at the chosen dtype, capped by what fits; memory is
    # figured at the probe block size (the block size is decided last).
    bs = pins.block_size or run.backends.smallest_block(dtype)
    mem = run.memory(dtype, bs, run.seqs_for_memory, batched, utilization)
    fit_p50 = run.sessions(mem, dtype, bs, run.p50_session, batched, max_model_len)
    max_num_seqs = decide_max_num_seqs.decide(
        run, dtype, bs, batched, max_model_len, tpot, tpot_why, fit_p50)
    max_model_len, len_code, len_message = decide_max_model_len.regrow(
        run, dtype, bs, max_num_seqs, batched, utilization, max_model_len, len_code,
        len_message)
    decide_max_model_len.record(run, max_model_len, len_code, len_message)

    batched = decide_batched_tokens.tune(
        run, batched, dtype, bs, max_num_seqs, utilization, max_model_len)
    offload = decide_prefix_offload.offload(run)

    plan = KVPlan(
        block_size=bs,
        kv_cache_dtype=dtype,
        gpu_memory_utilization=utilization,
        kv_cache_memory_bytes=pins.kv_cache_memory_bytes,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(batched, max_num_seqs),
        enable_prefix_caching=prefix_caching,
        kv_offloading_size_gib=offload,
        kv_offloading_backend=offload_backend(offload),
        attention_backend=pins.attention_backend,
        dtype=run.weights.dtype_flag,
        quantization=run.weights.quantization_flag,
        allow_deprecated_quantization=run.weights.allow_deprecated_quantization,
    )
    block_reason: Reason
    chosen_score: CandidateScore | None = None
    if scorer is not None:
        plan, block_reason, chosen_score = decide_block_size.scored(run, plan, scorer, fit_p50)
    else:
        sessions_p95 = run.sessions(mem, dtype, bs, run.p95_session, batched, max_model_len)
        bs, block_reason = decide_block_size.closed_form(
            run, dtype, sessions_p95, prefix_caching)
        plan = plan.model_copy(update={"block_size": bs})
    run.reasons.append(block_reason)
    return _final_pool_plan(run, plan, batched, utilization, chosen_score)


def _final_pool_plan(run: PlanRun, plan: KVPlan, batched: int, utilization: float,
                     chosen_score: CandidateScore | None) -> PoolPlan:
    """The decided ``plan`` checked once more against vLLM's pre-flight, with the attention
    backend's and the weights' reasons, as the pool's plan."""
    # The final plan must still pass vLLM's pre-flight at its own block size and batch.
    if not run.preflight_ok(
        run.memory(plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs, batched,
                   utilization),
        plan.kv_cache_dtype, plan.block_size, batched, plan.max_model_len,
    ):
        raise infeasible.no_fit(run, plan.max_model_len, batched, utilization, ())
    decide_attention_backend.report(run, plan)
    weights = run.weights
    if weights.vllm_args() or weights.method or run.model.torch_dtype == "float32":
        run.reasons.append(Reason(
            knob="quantization", choice=weights.quantization_flag or weights.method or "none",
            code=WEIGHTS_AS_PLANNED,
            message=weights.note + (
                f": {' '.join(weights.vllm_args())}" if weights.vllm_args() else ""),
        ))
    return PoolPlan(
        model_id=run.model.hf_id,
        gpu_class=run.gpu.name,
        tensor_parallel=run.tp,
        vllm_version=run.runtime.vllm_version,
        plan=plan,
        expected=expected.figures(run, plan, chosen_score),
        reasons=tuple(run.reasons),
        warnings=tuple(run.warnings),
        # TP alone keeps the plan's shape of before layouts (no layout key).
        layout=None if run.layout == ParallelLayout(tensor_parallel=run.tp) else run.layout,
    )


def preflight(request: PlanRequest, plan: KVPlan) -> tuple[bool, int, int]:
    """(ok, bytes one max-model-len request needs, KV bytes available) for any plan, e.g. one
    a human wrote: vLLM refuses to start unless ``ok``."""
    run = PlanRun(request.model_copy(update={"policy": PlanPolicy()}))
    batched = plan.max_num_batched_tokens
    mem = run.memory(
        plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs, batched,
        plan.gpu_memory_utilization,
    )
    if plan.kv_cache_memory_bytes is not None:
        page = mem.page_bytes
        mem = Memory(mem.non_kv, plan.kv_cache_memory_bytes, page,
                     plan.kv_cache_memory_bytes // page)
    need = run.request_bytes(
        plan.kv_cache_dtype, plan.block_size, plan.max_model_len, batched, plan.max_model_len)
    ok = run.preflight_ok(
        mem, plan.kv_cache_dtype, plan.block_size, batched, plan.max_model_len)
    return ok, need, max(0, (mem.num_gpu_blocks - 1) * mem.page_bytes)


def kv_capacity_by_dtype(request: PlanRequest) -> dict[str, int]:
    """Concurrent p95 sessions per usable KV dtype at the planner's other choices (what the
    table's dtype comparison shows). Ignores the quality floor."""
    run = PlanRun(request.model_copy(update={"policy": PlanPolicy(
        slo=request.policy.slo, lowest_kv_precision="int4")}))
    out: dict[str, int] = {}
    batched, _ = run.runtime.defaults_for_memory(request.gpu.cuda_total_bytes,
                                                 request.gpu.name)
    util = budget.default_gpu_memory_utilization(request.gpu)
    mml, _, _ = decide_max_model_len.target(run)
    skip = kv_dtype_options.aliases(run)
    for d in kv_dtype_options.options(run):
        if d.name in skip or run.backends.dtype_unusable(d) is not None:
            continue
        bs = run.backends.smallest_block(d.name)
        mem = run.memory(d.name, bs, MAX_NUM_SEQS_CEILING, batched, util)
        out[d.name] = run.sessions(mem, d.name, bs, run.p95_session, batched, mml)
    return out
