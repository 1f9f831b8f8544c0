"""``--max-num-seqs``: how many sequences decode together.

Inputs: the chosen KV dtype and probe block size, max-model-len, the TPOT target (the
policy's TPOT p95 SLO, else ``DEFAULT_TPOT_SECONDS``) and the median session. Rule: the most
median sessions whose decode step (weights + their KV read once per step, ``decode.py``)
stays within the TPOT target, capped by the median sessions that fit in the KV cache, by
``MAX_NUM_SEQS_CEILING`` and by max-num-batched-tokens; rounded down to a multiple of 8 from
16 up. A pin wins. With a scorer, ``decide_block_size.scored`` may move it (its own reason).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvtune.tuner.plan import Reason
from kvtune.tuner.planner import decode
from kvtune.tuner.planner.draft import Target, need
from kvtune.tuner.planner.planrun import MAX_NUM_SEQS_CEILING

if TYPE_CHECKING:
    from kvtune.tuner.planner.draft import Draft
    from kvtune.tuner.planner.planrun import PlanRun

# When the policy sets no TPOT target, size the batch for this one (interactive serving).
DEFAULT_TPOT_SECONDS = 0.05


def tpot_target(run: PlanRun, draft: Draft) -> Draft:
    """The draft with the TPOT target (seconds, and where it comes from)."""
    tpot = run.req.policy.slo.tpot_p95_seconds
    if tpot is not None:
        return replace(draft, tpot=Target(tpot, f"the TPOT p95 SLO of {tpot * 1000:.0f} ms"))
    return replace(draft, tpot=Target(DEFAULT_TPOT_SECONDS, (
        f"a default TPOT target of {DEFAULT_TPOT_SECONDS * 1000:.0f} ms (no SLO set)"
    )))


def bandwidth_seqs(
    run: PlanRun, dtype: str, block_size: int, batched_tokens: int, max_model_len: int,
    tpot: float,
) -> int:
    """Median sessions whose decode step stays within ``tpot`` (0: not even one)."""
    per_seq = run.request_bytes(
        dtype, block_size, min(run.p50_session, max_model_len), batched_tokens,
        max_model_len,
    )
    # A calibrated step k times slower meets ``tpot`` where the model's meets ``tpot / k``.
    return decode.max_seqs_within(
        run.model, run.gpu, run.tp, run.weights_bytes, per_seq, tpot / run.decode_time_scale,
        run.layout,
    )


def decide(run: PlanRun, draft: Draft) -> Draft:
    """The draft with max-num-seqs: the bandwidth model at the chosen dtype, capped by what
    fits; memory is figured at the probe block size (the block size is decided last)."""
    dtype = need(draft.kv_cache_dtype, "kv-cache-dtype")
    batched = need(draft.batched_tokens, "max-num-batched-tokens")
    max_model_len = need(draft.max_model_len, "max-model-len").tokens
    bs = run.pins.block_size or run.backends.smallest_block(dtype)
    mem = run.memory(dtype, bs, run.seqs_for_memory, batched,
                     need(draft.gpu_memory_utilization, "gpu-memory-utilization"))
    fit_p50 = run.sessions(mem, dtype, bs, run.p50_session, batched, max_model_len)
    draft = replace(draft, probe_block_size=bs, probe_memory=mem, fit_p50_sessions=fit_p50)
    if run.pins.max_num_seqs is not None:
        return replace(draft.pinned("max-num-seqs", str(run.pins.max_num_seqs)),
                       max_num_seqs=run.pins.max_num_seqs)
    tpot = need(draft.tpot, "the TPOT target")
    bw = bandwidth_seqs(run, dtype, bs, batched, max_model_len, tpot.seconds)
    if bw == 0:
        draft = draft.warn(
            f"even one sequence misses {tpot.why}: reading "
            f"{run.gib(run.weights_bytes)} of weights per step takes longer; more "
            "tensor parallel or lower-precision weights would help"
        )
    seqs = max(1, min(bw, fit_p50, MAX_NUM_SEQS_CEILING, batched))
    if seqs >= 16:
        seqs = seqs // 8 * 8  # CUDA-graph capture sizes are multiples of 8
    # The limit that binds, named: vLLM refuses max-num-batched-tokens < max-num-seqs, so
    # a small (pinned) step budget caps the batch whatever the bandwidth and KV allow.
    limit, code = min(
        (bw, 0, "bandwidth", "DecodeBandwidth"), (fit_p50, 1, "KV capacity", "KVCapacity"),
        (batched, 2, f"max-num-batched-tokens ({batched})", "BatchedTokens"),
        (MAX_NUM_SEQS_CEILING, 3, f"ceiling of {MAX_NUM_SEQS_CEILING}", "Ceiling"))[2:]
    return replace(draft.reason(Reason(
        knob="max-num-seqs", choice=str(seqs), code=code,
        message=(
            f"{bw} sequences of the median session keep a decode step within "
            f"{tpot.why}; {fit_p50} median sessions fit in the KV cache; the "
            f"{limit} limit binds"
            + (" (vLLM needs max-num-batched-tokens >= max-num-seqs)"
               if code == "BatchedTokens" else "")
        ),
    )), max_num_seqs=seqs)
