"""``NoFeasiblePlan``: what to say when nothing fits.

The error quotes the bytes one max-model-len request needs at the policy's narrowest allowed
dtype (weights, buffers, KV) against what the memory fraction makes available, the candidates
that were ruled out and why, and the smallest changes that would fit: more tensor parallel,
FP8 weights, a lower KV precision floor, a shorter max-model-len. Each suggestion is checked
by planning the changed request's memory, not guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtune.tuner.errors import InvalidInput, NoFeasiblePlan
from kvtune.tuner.facts.weights import weight_bits
from kvtune.tuner.plan import CandidateVerdict
from kvtune.tuner.planner import budget, kv_dtype_options, planrun
from kvtune.tuner.planner.checks import (
    BELOW_QUALITY_FLOOR,
    MAX_MODEL_LEN_DOES_NOT_FIT,
    TOO_FEW_SEQUENCES,
)

if TYPE_CHECKING:
    from kvtune.tuner.planner.planrun import PlanRun


def fits_with(
    run: PlanRun, tp: int, weights_dtype: str, dtype: str, max_model_len: int, batched: int,
    utilization: float,
) -> bool:
    """One ``max_model_len`` request at ``dtype`` passes pre-flight with this TP and these
    weights (the KV dtype pin dropped)."""
    try:
        req = run.req.model_copy(update={
            "tensor_parallel": tp, "weights_dtype": weights_dtype,
            "policy": run.req.policy.model_copy(update={"pins": run.pins.model_copy(
                update={"kv_cache_dtype": None})}),
        })
        other = planrun.PlanRun(req)
    except InvalidInput:
        return False
    bs = other.backends.smallest_block(dtype)
    mem = other.memory(dtype, bs, other.seqs_for_memory, batched, utilization)
    return other.preflight_ok(mem, dtype, bs, batched, max_model_len)


def no_fit(
    run: PlanRun, max_model_len: int, batched: int, utilization: float,
    verdicts: Sequence[CandidateVerdict],
) -> NoFeasiblePlan:
    gib = run.gib
    # Bytes are quoted at the policy's narrowest allowed dtype (what could have fitted).
    floor_bits = kv_dtype_options.PRECISION_FLOOR_BITS[run.req.policy.lowest_kv_precision]
    allowed = kv_dtype_options.allowed(run) or [kv_dtype_options.sixteen_bit(run)]
    narrowest = run.pins.kv_cache_dtype or kv_dtype_options.narrowest(run, allowed)
    bs = run.backends.smallest_block(narrowest)
    mem = run.memory(narrowest, bs, run.seqs_for_memory, batched, utilization)
    need = mem.non_kv.total_bytes + run.request_bytes(
        narrowest, bs, max_model_len, batched, max_model_len
    ) + mem.page_bytes
    available = budget.requested_bytes(run.gpu, utilization)
    if run.pins.kv_cache_memory_bytes is not None:
        available = mem.non_kv.total_bytes + run.pins.kv_cache_memory_bytes
    suggestions: list[str] = []
    for tp in (2, 4, 8):
        if tp > run.tp and fits_with(
            run, tp, run.req.weights_dtype, narrowest, max_model_len, batched, utilization
        ):
            suggestions.append(f"tensor parallel {tp}")
            break
    if weight_bits(run.model, run.req.weights_dtype) > 8 and fits_with(
        run, run.tp, "fp8", narrowest, max_model_len, batched, utilization
    ):
        suggestions.append("FP8 weights (--weights-dtype fp8)")
    for d in kv_dtype_options.options(run):
        if d.bits < floor_bits and run.backends.dtype_unusable(d) is None:
            dbs = run.backends.smallest_block(d.name)
            m = run.memory(d.name, dbs, run.seqs_for_memory, batched, utilization)
            if run.preflight_ok(m, d.name, dbs, batched, max_model_len):
                suggestions.append(f"a lower KV precision floor ({d.name}, {d.bits}-bit)")
                break
    longest = run.largest_fitting_len(
        mem, narrowest, bs, batched, max_model_len
    ) if mem.num_gpu_blocks >= 2 else 0
    if longest >= 256:
        suggestions.append(f"max-model-len {longest // 256 * 256}")
    relevant = (MAX_MODEL_LEN_DOES_NOT_FIT, TOO_FEW_SEQUENCES, BELOW_QUALITY_FLOOR)
    detail = "; ".join(
        f"{v.value}: {v.detail}" for v in verdicts if not v.ok and v.check in relevant
    ) or "none"
    what = (
        "the weights and runtime buffers alone do not fit"
        if mem.non_kv.total_bytes >= available
        else f"one {max_model_len}-token request does not fit"
    )
    return NoFeasiblePlan(
        f"{run.model.hf_id} on {run.gpu.name} at TP {run.tp} with "
        f"{run.req.weights_dtype} weights: {what}. Needed {gib(need)} "
        f"({gib(mem.non_kv.weights_bytes)} weights, "
        f"{gib(mem.non_kv.total_bytes - mem.non_kv.weights_bytes)} activations/CUDA "
        f"graphs/buffers, the rest KV), available {gib(available)} of "
        f"{gib(run.gpu.cuda_total_bytes)} at gpu-memory-utilization {utilization:g}. "
        f"Candidates: {detail}.",
        needed_bytes=need, available_bytes=available, suggestions=suggestions,
    )
