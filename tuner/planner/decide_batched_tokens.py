"""``--max-num-batched-tokens``: how many tokens one scheduler step carries.

Decided twice. First (``runtime_default``), before anything else: vLLM's default for the
GPU's memory, since activations and so every memory figure depend on it. Last (``tune``),
once dtype, block size, max-num-seqs and max-model-len are known: ``prefill.step_token_budget``
keeps the default and grows it (2x, 4x) only when the TTFT SLO needs it and pre-flight still
passes. A pin wins both times.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvtune.tuner.facts.weights import weight_bits
from kvtune.tuner.plan import Reason
from kvtune.tuner.planner import decode, prefill
from kvtune.tuner.planner.draft import need

if TYPE_CHECKING:
    from kvtune.tuner.planner.draft import Draft
    from kvtune.tuner.planner.planrun import PlanRun


def runtime_default(run: PlanRun, draft: Draft) -> Draft:
    """The draft with the step budget memory is figured with (the pin, else vLLM's
    default); its reason comes with ``tune`` unless pinned."""
    default_tokens, _ = run.runtime.defaults_for_memory(
        run.gpu.cuda_total_bytes, run.gpu.name
    )
    pin = run.pins.max_num_batched_tokens
    if pin is not None:
        return replace(draft.pinned("max-num-batched-tokens", str(pin)), batched_tokens=pin)
    return replace(draft, batched_tokens=default_tokens)


def chunked_step_seconds(
    run: PlanRun, dtype: str, bs: int, num_seqs: int, chunk_tokens: int, max_model_len: int,
    batched: int,
) -> float:
    """A step that decodes ``num_seqs`` median sessions and prefills ``chunk_tokens``:
    the bandwidth-bound decode plus the compute-bound chunk (conservatively additive)."""
    per_seq = run.request_bytes(
        dtype, bs, min(run.p50_session, max_model_len), batched, max_model_len)
    decode_s = decode.decode_step_seconds(
        run.model, run.gpu, run.tp, run.weights_bytes, num_seqs, per_seq, run.layout
    ) * run.decode_time_scale
    bits = weight_bits(run.model, run.req.weights_dtype)
    return decode_s + chunk_tokens * decode.prefill_seconds_per_token(
        run.model, run.gpu, run.tp, bits, run.layout) * run.prefill_time_scale


def tune(run: PlanRun, draft: Draft) -> Draft:
    """The draft with max-num-batched-tokens tuned: ``prefill.step_token_budget`` for this
    pool (pinned: left alone)."""
    if run.pins.max_num_batched_tokens is not None:
        return draft
    default = need(draft.batched_tokens, "max-num-batched-tokens")
    dtype = need(draft.kv_cache_dtype, "kv-cache-dtype")
    bs = need(draft.probe_block_size, "the probe block size")
    num_seqs = need(draft.max_num_seqs, "max-num-seqs")
    utilization = need(draft.gpu_memory_utilization, "gpu-memory-utilization")
    max_model_len = need(draft.max_model_len, "max-model-len").tokens
    bits = weight_bits(run.model, run.req.weights_dtype)

    def fits(tokens: int) -> bool:
        mem = run.memory(dtype, bs, num_seqs, tokens, utilization)
        return run.preflight_ok(mem, dtype, bs, tokens, max_model_len)

    result = prefill.step_token_budget(
        default_tokens=default,
        num_seqs=num_seqs,
        prompt_tokens=run.req.profile.context_tokens.p95,
        decode_seconds=chunked_step_seconds(
            run, dtype, bs, num_seqs, 0, max_model_len, default),
        prefill_seconds_per_token=decode.prefill_seconds_per_token(
            run.model, run.gpu, run.tp, bits, run.layout) * run.prefill_time_scale,
        ttft_slo_seconds=run.req.policy.slo.ttft_p95_seconds,
        fits=fits,
        default_label=f"vLLM {run.runtime.vllm_version}'s default for a "
        f"{run.gib(run.gpu.cuda_total_bytes)} GPU",
    )
    draft = draft.warn(*result.warnings).reason(Reason(
        knob="max-num-batched-tokens", choice=str(result.tokens), code=result.code,
        message=result.message,
    ))
    return replace(draft, batched_tokens=result.tokens)
