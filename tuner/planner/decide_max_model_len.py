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
from typing import TYPE_CHECKING

from kvtune.tuner.plan import Reason
from kvtune.tuner.planner import infeasible
from kvtune.tuner.planner.checks import PINNED
from kvtune.tuner.planner.request import session_tokens

if TYPE_CHECKING:
    from kvtune.tuner.planner.planrun import Memory, PlanRun

# max-model-len headroom over the observed high quantile of prompt + output.
MAX_MODEL_LEN_HEADROOM = 1.1
MAX_MODEL_LEN_ROUNDING_TOKENS = 1024


def target(run: PlanRun) -> tuple[int, str, str]:
    """(tokens, code, message) before the pre-flight check."""
    profile, model = run.req.profile, run.model
    floor = run.req.policy.min_max_model_len_tokens or 1
    if run.pins.max_model_len is not None:
        return run.pins.max_model_len, PINNED, "pinned by the policy"
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
        run.warnings.append(
            f"max-model-len {tokens} is below the longest observed session ({top} "
            "tokens): vLLM rejects such requests; pin max_model_len or set "
            "min_max_model_len_tokens to serve them"
        )
    return tokens, code, message


def shrink(
    run: PlanRun, mem: Memory, dtype: str, bs: int, batched: int, max_model_len: int,
    len_code: str, len_message: str, utilization: float,
) -> tuple[int, str, str]:
    """The longest max-model-len one request of which fits at ``dtype`` (pre-flight), with
    its (code, message); ``NoFeasiblePlan`` when pinned or below the floor."""
    if run.pins.max_model_len is not None:
        raise infeasible.no_fit(run, max_model_len, batched, utilization, ())
    longest = run.largest_fitting_len(mem, dtype, bs, batched, max_model_len)
    longest = longest // bs * bs
    floor = max(run.req.policy.min_max_model_len_tokens or 1, run.p95_session)
    if longest < floor:
        raise infeasible.no_fit(run, max(floor, 1), batched, utilization, ())
    run.unshrunk_len = (max_model_len, len_code, len_message)
    run.warnings.append(
        f"max-model-len lowered from {max_model_len} to {longest}: one longer request "
        f"would not fit in the KV cache ({dtype}), and vLLM would refuse to start"
    )
    return longest, "LargestThatFits", (
        f"{len_message}; lowered to {longest}, the longest request the KV cache holds "
        "(pre-flight)"
    )


def regrow(
    run: PlanRun, dtype: str, bs: int, max_num_seqs: int, batched: int, utilization: float,
    max_model_len: int, len_code: str, len_message: str,
) -> tuple[int, str, str]:
    """After ``shrink``: (max-model-len, code, message) at the final max-num-seqs."""
    if len_code != "LargestThatFits":
        return max_model_len, len_code, len_message
    # The length was shrunk with memory for the default max-num-seqs; the sampler
    # needs less for fewer sequences, which leaves room for a longer request.
    final = run.memory(dtype, bs, max_num_seqs, batched, utilization)
    longer = run.largest_fitting_len(final, dtype, bs, batched, run.len_target) // bs * bs
    lowered = f"max-model-len lowered from {run.unshrunk_len[0]} to {max_model_len}:" \
        if run.unshrunk_len else None
    if run.unshrunk_len is not None and longer >= run.unshrunk_len[0]:
        # All of the length fits after all: nothing was lowered, and no warning says so.
        run.warnings = [w for w in run.warnings if not (lowered and w.startswith(lowered))]
        return run.unshrunk_len
    if longer > max_model_len:
        len_message = len_message.replace(str(max_model_len), str(longer))
        run.warnings = [w.replace(f"to {max_model_len}:", f"to {longer}:")
                        for w in run.warnings]
        max_model_len = longer
    return max_model_len, len_code, len_message


def record(run: PlanRun, max_model_len: int, len_code: str, len_message: str) -> None:
    run.reasons.append(Reason(
        knob="max-model-len", choice=str(max_model_len), code=len_code, message=len_message,
    ))
