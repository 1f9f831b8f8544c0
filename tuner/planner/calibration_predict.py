"""What the planner's own models predict at an operating point the cluster observed: the
decode step and one request's prefill time, with the request's calibration applied (so the
closed loop compares like with like: ``tuner/model_calibration.py``).

The decode step is ``decode.decode_step_seconds`` at the observed mean running sequences, each
holding the observed mean context; the prefill time is the planner's TTFT model
(``prefill.prompt_ttft_seconds``) of the observed mean computed prompt (the tokens prefilled,
prefix hits excluded) at the plan's step budget, beside the same decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.tuner.facts.weights import weight_bits
from kvtune.tuner.model_calibration import CalibrationKey, CalibrationSet, find
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner import decode, prefill
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.request import PlanRequest


@dataclass(frozen=True, slots=True)
class PredictedSteps:
    decode_seconds: float  # one decode step: the inter-token latency
    prefill_seconds: float  # one request's prefill (vLLM's request_prefill_time)


def predicted_steps(request: PlanRequest, plan: KVPlan, running_seqs: float,
                    context_tokens: float, prefill_tokens: float) -> PredictedSteps:
    """The planner's figures for ``plan`` with ``running_seqs`` sequences of
    ``context_tokens`` each decoding, and a prompt of ``prefill_tokens`` to prefill."""
    run = PlanRun(request)
    seqs = max(1, round(running_seqs))
    tokens = max(1, min(round(context_tokens), plan.max_model_len))
    per_seq = run.request_bytes(plan.kv_cache_dtype, plan.block_size, tokens,
                                plan.max_num_batched_tokens, plan.max_model_len)
    step = decode.decode_step_seconds(
        run.model, run.gpu, run.tp, run.weights_bytes, seqs, per_seq, run.layout
    ) * run.decode_time_scale
    per_token = decode.prefill_seconds_per_token(
        run.model, run.gpu, run.tp, weight_bits(run.model, request.weights_dtype)
    ) * run.prefill_time_scale
    ttft = prefill.prompt_ttft_seconds(max(1, round(prefill_tokens)),
                                       plan.max_num_batched_tokens, seqs, step, per_token)
    return PredictedSteps(decode_seconds=step, prefill_seconds=ttft)


def calibration_key(request: PlanRequest) -> CalibrationKey:
    """The key ``request``'s pool is calibrated under (the operator's and the cli's)."""
    return CalibrationKey(model=request.model.hf_id, gpu_class=request.gpu.name,
                          vllm_version=request.vllm_version, layout=request.layout.label)


def with_calibration(request: PlanRequest, calibrations: CalibrationSet | None
                     ) -> PlanRequest:
    """``request`` carrying its key's calibration from ``calibrations`` (as is without one)."""
    if calibrations is None:
        return request
    found = find(calibrations.calibrations, calibration_key(request))
    return request if found is None else request.model_copy(update={"calibration": found})


def predicted_blocks(request: PlanRequest, plan: KVPlan) -> int | None:
    """The KV blocks the planner expects vLLM to size for ``plan`` (as ``expected.figures``),
    with the request's calibration; None when the plan pins the KV bytes (vLLM allocates
    exactly those: nothing to calibrate)."""
    if plan.kv_cache_memory_bytes is not None:
        return None
    mem = PlanRun(request).memory(plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs,
                                  plan.max_num_batched_tokens, plan.gpu_memory_utilization)
    return int(mem.num_gpu_blocks)
