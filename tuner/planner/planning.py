"""The offline planner: one pool's vLLM KV-cache configuration, with a reason for every
choice and the figures it expects.

``PIPELINE`` below is the order of the decisions, in one place: each step takes the run's
facts (``planrun.PlanRun``, read-only) and the ``draft.Draft`` so far and returns a new
draft with its knob, reason and warnings added. Each knob is decided in its own
``decide_<knob>.py``; docs/planner.md has the table. A knob is pinned by
``PlanPolicy.pins``; a pin that can never work raises ``InvalidInput`` (``validation``)
naming the pin, the value and the allowed values. When nothing fits, ``NoFeasiblePlan``
(``infeasible``) quotes the bytes needed and available and the smallest changes that fit.
"""

from __future__ import annotations

from dataclasses import replace

from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan import KVPlan, PoolPlan, Reason, offload_backend
from kvtune.tuner.planner import (
    budget,
    decide_attention_backend,
    decide_batched_tokens,
    decide_block_size,
    decide_dtype,
    decide_max_model_len,
    decide_max_num_seqs,
    decide_pattern,
    decide_prefix_offload,
    decide_utilization,
    expected,
    infeasible,
    kv_dtype_options,
)
from kvtune.tuner.planner.checks import WEIGHTS_AS_PLANNED
from kvtune.tuner.planner.draft import Draft, Step, need
from kvtune.tuner.planner.planrun import MAX_NUM_SEQS_CEILING, Memory, PlanRun
from kvtune.tuner.planner.policy import PlanPolicy

# Re-exported: the planner's public names (cli, operator, simulator, tests import them here).
from kvtune.tuner.planner.request import CandidateScorer, PlanRequest, session_tokens

__all__ = [
    "PIPELINE",
    "CandidateScorer",
    "PlanRequest",
    "kv_capacity_by_dtype",
    "plan_pool",
    "preflight",
    "session_tokens",
]


def assemble(run: PlanRun, draft: Draft) -> Draft:
    """The decided knobs as one ``KVPlan``, at the probe block size (decided next)."""
    pins = run.pins
    seqs = need(draft.max_num_seqs, "max-num-seqs")
    offload = draft.kv_offloading_size_gib
    return replace(draft, plan=KVPlan(
        block_size=need(draft.probe_block_size, "the probe block size"),
        kv_cache_dtype=need(draft.kv_cache_dtype, "kv-cache-dtype"),
        gpu_memory_utilization=need(draft.gpu_memory_utilization, "gpu-memory-utilization"),
        kv_cache_memory_bytes=pins.kv_cache_memory_bytes,
        max_model_len=need(draft.max_model_len, "max-model-len").tokens,
        max_num_seqs=seqs,
        max_num_batched_tokens=max(need(draft.batched_tokens, "max-num-batched-tokens"), seqs),
        enable_prefix_caching=need(draft.enable_prefix_caching, "enable-prefix-caching"),
        kv_offloading_size_gib=offload,
        kv_offloading_backend=offload_backend(offload),
        attention_backend=pins.attention_backend,
        dtype=run.weights.dtype_flag,
        quantization=run.weights.quantization_flag,
        allow_deprecated_quantization=run.weights.allow_deprecated_quantization,
    ))


def final_preflight(run: PlanRun, draft: Draft) -> Draft:
    """The draft unchanged if its plan still passes vLLM's pre-flight at its own block size
    (at the step budget memory was figured with), else ``NoFeasiblePlan``."""
    plan = need(draft.plan, "the assembled plan")
    batched = need(draft.batched_tokens, "max-num-batched-tokens")
    mem = run.memory(plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs, batched,
                     plan.gpu_memory_utilization)
    if not run.preflight_ok(mem, plan.kv_cache_dtype, plan.block_size, batched,
                            plan.max_model_len):
        raise infeasible.no_fit(run, plan.max_model_len, batched,
                                plan.gpu_memory_utilization, ())
    return draft


def weights_reason(run: PlanRun, draft: Draft) -> Draft:
    """The draft with how the weights load (flags, quantization), when there is any news."""
    weights = run.weights
    if not (weights.vllm_args() or weights.method or run.model.torch_dtype == "float32"):
        return draft
    return draft.reason(Reason(
        knob="quantization", choice=weights.quantization_flag or weights.method or "none",
        code=WEIGHTS_AS_PLANNED,
        message=weights.note + (
            f": {' '.join(weights.vllm_args())}" if weights.vllm_args() else ""),
    ))


# The decisions in order; each reads the knobs the steps before it decided.
PIPELINE: tuple[Step, ...] = (
    decide_batched_tokens.runtime_default,  # vLLM's default: every memory figure needs it
    decide_utilization.decide,  # gpu-memory-utilization: the largest safe fraction
    decide_prefix_offload.prefix_caching,  # enable-prefix-caching: from the sharing
    decide_max_model_len.target,  # max-model-len: a high quantile of prompt + output
    decide_utilization.check_room,  # weights and buffers leave room for any KV
    decide_max_num_seqs.tpot_target,  # the TPOT target the batch is sized for
    decide_dtype.decide,  # kv-cache-dtype: the widest that holds the target (may shrink
    #                       max-model-len to pass pre-flight)
    decide_max_num_seqs.decide,  # max-num-seqs: decode bandwidth, capped by what fits
    decide_max_model_len.settle,  # max-model-len: grown back into what max-num-seqs frees
    decide_batched_tokens.tune,  # max-num-batched-tokens: grown for the TTFT SLO
    decide_prefix_offload.offload,  # kv-offloading-size: from reuse and the CPU budget
    assemble,  # the knobs as one KVPlan
    # then block-size (with a scorer, together with max-num-seqs): decide_block_size.decide,
    # called from plan_pool, which holds the scorer
)
# After the block size: checked once more, then what the plan will run with.
FINISH: tuple[Step, ...] = (
    final_preflight,
    decide_attention_backend.report,  # attention-backend: left to vLLM, reported
    weights_reason,  # quantization / dtype flags the weights need
    decide_pattern.report,  # the article's reuse pattern: what the pins offer for it
)


def plan_pool(request: PlanRequest, scorer: CandidateScorer | None = None) -> PoolPlan:
    """Plan one pool. Pure: no I/O. Raises ``NoFeasiblePlan`` when nothing fits and
    ``InvalidInput`` for a pin or input that can never work."""
    run = PlanRun(request)  # validates the request and the pins

    def block_size(run: PlanRun, draft: Draft) -> Draft:
        return decide_block_size.decide(run, draft, scorer)

    draft = Draft(warnings=run.validation_warnings)
    for step in (*PIPELINE, block_size, *FINISH):
        draft = step(run, draft)
    plan = need(draft.plan, "the assembled plan")
    return PoolPlan(
        model_id=run.model.hf_id,
        gpu_class=run.gpu.name,
        tensor_parallel=run.tp,
        vllm_version=run.runtime.vllm_version,
        plan=plan,
        expected=expected.figures(run, plan, draft.score),
        reasons=draft.reasons,
        warnings=draft.warnings,
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
    mml = need(decide_max_model_len.target(run, Draft()).max_model_len, "max-model-len").tokens
    skip = kv_dtype_options.aliases(run)
    for d in kv_dtype_options.options(run):
        if d.name in skip or run.backends.dtype_unusable(d) is not None:
            continue
        bs = run.backends.smallest_block(d.name)
        mem = run.memory(d.name, bs, MAX_NUM_SEQS_CEILING, batched, util)
        out[d.name] = run.sessions(mem, d.name, bs, run.p95_session, batched, mml)
    return out
