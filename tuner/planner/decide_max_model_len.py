"""``--max-model-len``: the longest request vLLM accepts.

Inputs: the profile's session lengths (prompt + output), the model's
``max_position_embeddings``, the policy's floor, and pre-flight. Rule (``target``): the
observed maximum when it is within ``MAX_MODEL_LEN_HEADROOM`` of the p99, else the p99 with
that headroom; rounded up to 1,024, capped by the model, raised to the policy's floor. When no
allowed KV dtype passes pre-flight at that length (vLLM refuses to start unless one request
fits), ``shrink`` lowers it to the longest that fits, never below the floor or the p95
session; ``regrow`` gives back what the final, smaller max-num-seqs frees. A pin wins.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from kvtune.tuner.plan import Reason
from kvtune.tuner.planner import infeasible
from kvtune.tuner.planner.checks import PINNED
from kvtune.tuner.planner.draft import Length, need
from kvtune.tuner.planner.request import session_tokens

if TYPE_CHECKING:
    from kvtune.tuner.planner.draft import Draft
    from kvtune.tuner.planner.planrun import Memory, PlanRun

# max-model-len headroom over the observed high quantile of prompt + output.
MAX_MODEL_LEN_HEADROOM = 1.1
MAX_MODEL_LEN_ROUNDING_TOKENS = 1024


def target(run: PlanRun, draft: Draft) -> Draft:
    """The draft with max-model-len's target before the pre-flight check (its reason comes
    with ``settle``, once pre-flight and max-num-seqs have had their say)."""
    profile, model = run.req.profile, run.model
    floor = run.req.policy.min_max_model_len_tokens or 1
    if run.pins.max_model_len is not None:
        pinned = run.pins.max_model_len
        return replace(draft, max_model_len=Length(pinned, PINNED, "pinned by the policy"),
                       max_model_len_target_tokens=pinned)
    high = session_tokens(profile, "p99")
    top = session_tokens(profile, "max")
    # Take the observed maximum when it is close to p99 (fixed or bounded lengths);
    # otherwise the p99 with headroom, so rare outliers do not size every request.
    if top <= high * MAX_MODEL_LEN_HEADROOM:
        basis, raw = f"the longest session ({top} tokens)", top
    else:
        basis, raw = (
            f"p99 prompt + p99 output ({high} tokens) with "
            f"{MAX_MODEL_LEN_HEADROOM - 1:.0%} headroom",
            math.ceil(high * MAX_MODEL_LEN_HEADROOM),
        )
    tokens = -(-raw // MAX_MODEL_LEN_ROUNDING_TOKENS) * MAX_MODEL_LEN_ROUNDING_TOKENS
    code = "HighQuantileOfSessions"
    message = f"{basis}, rounded up to a multiple of {MAX_MODEL_LEN_ROUNDING_TOKENS}"
    if tokens > model.max_position_embeddings:
        tokens = model.max_position_embeddings
        code = "CappedByModel"
        message += f", capped by max_position_embeddings={model.max_position_embeddings}"
    if tokens < floor:
        tokens = floor
        code = "PolicyMinimum"
        message += f", raised to the policy's guaranteed {floor}"
    if top > tokens:
        draft = draft.warn(
            f"max-model-len {tokens} is below the longest observed session ({top} "
            "tokens): vLLM rejects such requests; pin max_model_len or set "
            "min_max_model_len_tokens to serve them"
        )
    return replace(draft, max_model_len=Length(tokens, code, message),
                   max_model_len_target_tokens=tokens)


def shrink(run: PlanRun, draft: Draft, mem: Memory, dtype: str, bs: int) -> Draft:
    """The draft with the longest max-model-len one request of which fits at ``dtype``
    (pre-flight); ``NoFeasiblePlan`` when pinned or below the floor."""
    batched = need(draft.batched_tokens, "max-num-batched-tokens")
    utilization = need(draft.gpu_memory_utilization, "gpu-memory-utilization")
    length = need(draft.max_model_len, "max-model-len")
    if run.pins.max_model_len is not None:
        raise infeasible.no_fit(run, length.tokens, batched, utilization, ())
    longest = run.largest_fitting_len(mem, dtype, bs, batched, length.tokens)
    longest = longest // bs * bs
    floor = max(run.req.policy.min_max_model_len_tokens or 1, run.p95_session)
    if longest < floor:
        raise infeasible.no_fit(run, max(floor, 1), batched, utilization, ())
    draft = draft.warn(
        f"max-model-len lowered from {length.tokens} to {longest}: one longer request "
        f"would not fit in the KV cache ({dtype}), and vLLM would refuse to start"
    )
    return replace(draft, max_model_len_unshrunk=length, max_model_len=Length(
        longest, "LargestThatFits",
        f"{length.message}; lowered to {longest}, the longest request the KV cache holds "
        "(pre-flight)"))


def settle(run: PlanRun, draft: Draft) -> Draft:
    """The draft with max-model-len final at the final max-num-seqs (``regrow``), and its
    reason."""
    draft = regrow(run, draft)
    length = need(draft.max_model_len, "max-model-len")
    return draft.reason(Reason(
        knob="max-model-len", choice=str(length.tokens), code=length.code,
        message=length.message,
    ))


def regrow(run: PlanRun, draft: Draft) -> Draft:
    """After ``shrink``: the draft with max-model-len grown into what the final max-num-seqs
    frees."""
    length = need(draft.max_model_len, "max-model-len")
    if length.code != "LargestThatFits":
        return draft
    dtype = need(draft.kv_cache_dtype, "kv-cache-dtype")
    bs = need(draft.probe_block_size, "the probe block size")
    batched = need(draft.batched_tokens, "max-num-batched-tokens")
    # The length was shrunk with memory for the default max-num-seqs; the sampler
    # needs less for fewer sequences, which leaves room for a longer request.
    final = run.memory(dtype, bs, need(draft.max_num_seqs, "max-num-seqs"), batched,
                       need(draft.gpu_memory_utilization, "gpu-memory-utilization"))
    longer = run.largest_fitting_len(
        final, dtype, bs, batched,
        need(draft.max_model_len_target_tokens, "max-model-len's target")) // bs * bs
    unshrunk = draft.max_model_len_unshrunk
    if unshrunk is not None and longer >= unshrunk.tokens:
        # All of the length fits after all: nothing was lowered, and no warning says so.
        lowered = f"max-model-len lowered from {unshrunk.tokens} to {length.tokens}:"
        return replace(draft, max_model_len=unshrunk, warnings=tuple(
            w for w in draft.warnings if not w.startswith(lowered)))
    if longer > length.tokens:
        return replace(draft, max_model_len=Length(
            longer, length.code, length.message.replace(str(length.tokens), str(longer))),
            warnings=tuple(w.replace(f"to {length.tokens}:", f"to {longer}:")
                           for w in draft.warnings))
    return draft
