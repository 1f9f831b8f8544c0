"""``--kv-cache-dtype``: the precision of the KV cache.

Inputs: the concurrency target (the policy's ``target_concurrent_sequences``, else the
decode bandwidth model at 16-bit KV), the p95 session, max-model-len, the quality floor
(``policy.lowest_kv_precision``) and the dtypes vLLM runs for this attention on this GPU.
Rule: in ``kv_dtype_options.DTYPE_PREFERENCE`` order (widest first), the first dtype that
passes pre-flight and holds the target at the p95 session; if none does, the one that holds
the most. Each candidate gets a verdict (``checks``). If none passes pre-flight, max-model-len
is shrunk for the narrowest allowed dtype and the choice made again. A pin wins (max-model-len
may still shrink to fit it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvtune.tuner import kv_quality
from kvtune.tuner.errors import NoFeasiblePlan
from kvtune.tuner.facts.capabilities import KVCacheDType
from kvtune.tuner.plan import CandidateVerdict, Reason
from kvtune.tuner.planner import decide_max_model_len, decide_max_num_seqs, infeasible
from kvtune.tuner.planner.checks import (
    BELOW_QUALITY_FLOOR,
    CHOSEN,
    FITS,
    MAX_MODEL_LEN_DOES_NOT_FIT,
    NOT_MODELED,
    PINNED,
    TOO_FEW_SEQUENCES,
    UNSUPPORTED_BY_BACKEND,
    WIDER_MEETS_TARGET,
)
from kvtune.tuner.planner.draft import need

# The candidate dtypes live below the decision (``infeasible`` asks them too).
from kvtune.tuner.planner.kv_dtype_options import (
    PRECISION_FLOOR_BITS,
    aliases,
    allowed,
    narrowest,
    options,
    sixteen_bit,
)

if TYPE_CHECKING:
    from kvtune.tuner.planner.draft import Draft
    from kvtune.tuner.planner.planrun import PlanRun


def quality_gate(run: PlanRun, name: str) -> kv_quality.DtypeGate:
    return kv_quality.gate_one(name, run.req.kv_quality_evidence, run.req.policy.kv_quality,
                               kv_quality.checkpoint_scheme(run.model.quantization, name))


def quality_note(run: PlanRun, draft: Draft, name: str) -> tuple[str, Draft]:
    """What the evidence says of a chosen dtype, for its reason ("" for 16-bit); an
    unverified narrow dtype is also a warning (in the draft returned)."""
    verdict = quality_gate(run, name)
    if verdict.code == kv_quality.REFERENCE:
        return "", draft
    if verdict.code == kv_quality.UNVERIFIED:
        draft = draft.warn(f"kv-cache-dtype {name} is {verdict.detail}: run `kvtune quality` "
                           "or let the operator's calibration Job measure it")
    return f"; quality: {verdict.detail}", draft


def decide(run: PlanRun, draft: Draft) -> Draft:
    """The draft with the dtype, and max-model-len lowered by pre-flight if need be."""
    seqs_for_memory = run.seqs_for_memory
    batched = need(draft.batched_tokens, "max-num-batched-tokens")
    max_model_len = need(draft.max_model_len, "max-model-len").tokens
    kv16 = sixteen_bit(run)
    base_dtype = kv16 if run.backends.dtype_unusable(run.runtime.dtype(kv16)) is None else (
        run.pins.kv_cache_dtype or kv16
    )
    bs_probe = run.pins.block_size or run.backends.smallest_block(base_dtype)
    if run.req.policy.target_concurrent_sequences is not None:
        target = run.req.policy.target_concurrent_sequences
        target_why = "the policy's target_concurrent_sequences"
    else:
        tpot = need(draft.tpot, "the TPOT target")
        target = max(1, min(seqs_for_memory, decide_max_num_seqs.bandwidth_seqs(
            run, base_dtype, bs_probe, batched, max_model_len, tpot.seconds)))
        target_why = (
            f"the decode bandwidth model: {target} sequences of the median session "
            f"({run.p50_session} tokens) at 16-bit KV keep a decode step within {tpot.why}"
        )
    if run.pins.kv_cache_dtype is not None:
        return _pinned(run, draft, run.pins.kv_cache_dtype)
    return _choose_with_preflight(run, draft, bs_probe, seqs_for_memory, target, target_why)


def _pinned(run: PlanRun, draft: Draft, dtype: str) -> Draft:
    """The pinned dtype; pre-flight may shrink an unpinned max-model-len to what it fits,
    but never below the policy's floor or the p95 session."""
    batched = need(draft.batched_tokens, "max-num-batched-tokens")
    bs0 = run.pins.block_size or run.backends.smallest_block(dtype)
    mem = run.memory(dtype, bs0, run.seqs_for_memory, batched,
                     need(draft.gpu_memory_utilization, "gpu-memory-utilization"))
    if not run.preflight_ok(mem, dtype, bs0, batched,
                            need(draft.max_model_len, "max-model-len").tokens):
        draft = decide_max_model_len.shrink(run, draft, mem, dtype, bs0)
    max_model_len = need(draft.max_model_len, "max-model-len").tokens
    sessions = run.sessions(mem, dtype, bs0, run.p95_session, batched, max_model_len)
    note, draft = quality_note(run, draft, dtype)
    return replace(draft.reason(Reason(
        knob="kv-cache-dtype", choice=dtype, code=PINNED,
        message=f"pinned by the policy; {sessions} sequences of {run.p95_session} "
        f"tokens (p95) fit{note}",
    )), kv_cache_dtype=dtype)


def _choose_with_preflight(
    run: PlanRun, draft: Draft, bs: int, seqs: int, target: int, target_why: str,
) -> Draft:
    """The draft with the dtype, and max-model-len lowered to what fits when no allowed
    dtype passes pre-flight at the target length (and it is not pinned)."""
    try:
        return choose(run, draft, bs, seqs, target, target_why)
    except NoFeasiblePlan:
        if run.pins.max_model_len is not None:
            raise
    # Shrink for the allowed dtype with the fewest bytes per token, then choose again.
    batched = need(draft.batched_tokens, "max-num-batched-tokens")
    utilization = need(draft.gpu_memory_utilization, "gpu-memory-utilization")
    names = allowed(run)
    if not names:
        raise infeasible.no_fit(
            run, need(draft.max_model_len, "max-model-len").tokens, batched, utilization, ())
    thinnest = narrowest(run, names)
    nbs = run.backends.smallest_block(thinnest)
    mem = run.memory(thinnest, nbs, seqs, batched, utilization)
    draft = decide_max_model_len.shrink(run, draft, mem, thinnest, nbs)
    return choose(run, draft, bs, seqs, target, target_why)


def choose(
    run: PlanRun, draft: Draft, block_size: int, seqs_for_memory: int, target: int,
    target_why: str,
) -> Draft:
    """The draft with the widest dtype meeting ``target`` at the p95 session
    (``NoFeasiblePlan``: none passes pre-flight at the draft's max-model-len)."""
    batched_tokens = need(draft.batched_tokens, "max-num-batched-tokens")
    utilization = need(draft.gpu_memory_utilization, "gpu-memory-utilization")
    max_model_len = need(draft.max_model_len, "max-model-len").tokens
    verdicts, feasible = _judge_dtypes(run, block_size, batched_tokens, seqs_for_memory,
                                       utilization, max_model_len, target)
    if not feasible:
        raise infeasible.no_fit(run, max_model_len, batched_tokens, utilization, verdicts)
    chosen, code, message, warning = _pick(run, feasible, target, target_why)
    if warning is not None:
        draft = draft.warn(warning)
    verdicts = [
        v.model_copy(update={"check": CHOSEN}) if v.value == chosen.name
        else v.model_copy(update={"check": WIDER_MEETS_TARGET})
        if v.ok and _narrower(run, v.value, chosen) else v
        for v in verdicts
    ]
    note, draft = quality_note(run, draft, chosen.name)
    return replace(draft.reason(Reason(
        knob="kv-cache-dtype", choice=chosen.name, code=code,
        message=message + note + gated_out(verdicts),
        candidates=tuple(verdicts),
    )), kv_cache_dtype=chosen.name)


def _judge_dtypes(
    run: PlanRun, block_size: int, batched_tokens: int, seqs_for_memory: int,
    utilization: float, max_model_len: int, target: int,
) -> tuple[list[CandidateVerdict], list[tuple[KVCacheDType, int]]]:
    """Every dtype option's verdict, and those that pass pre-flight with the sequences of
    the p95 session each holds (preference order)."""
    floor_name = run.req.policy.lowest_kv_precision
    floor_bits = PRECISION_FLOOR_BITS[floor_name]
    verdicts: list[CandidateVerdict] = []
    feasible: list[tuple[KVCacheDType, int]] = []
    skip = aliases(run)
    for dtype in options(run):
        if dtype.name in skip:
            continue
        unusable = run.backends.dtype_unusable(dtype)
        if unusable is not None:
            check = NOT_MODELED if dtype.layout == "not_modeled" else UNSUPPORTED_BY_BACKEND
            verdicts.append(CandidateVerdict(
                value=dtype.name, ok=False, check=check, detail=unusable))
            continue
        if dtype.bits < floor_bits:
            verdicts.append(CandidateVerdict(
                value=dtype.name, ok=False, check=BELOW_QUALITY_FLOOR,
                detail=f"{dtype.bits}-bit is below the policy's lowest precision "
                f"{floor_name} ({floor_bits}-bit)",
            ))
            continue
        gate = quality_gate(run, dtype.name)
        if not gate.allowed:
            verdicts.append(CandidateVerdict(
                value=dtype.name, ok=False, check=gate.code, detail=gate.detail))
            continue
        bs = block_size if run.backends.block_size_ok(dtype.name, block_size) else (
            run.backends.smallest_block(dtype.name)
        )
        mem = run.memory(dtype.name, bs, seqs_for_memory, batched_tokens, utilization)
        if not run.preflight_ok(mem, dtype.name, bs, batched_tokens, max_model_len):
            need = run.request_bytes(dtype.name, bs, max_model_len, batched_tokens, max_model_len)
            verdicts.append(CandidateVerdict(
                value=dtype.name, ok=False, check=MAX_MODEL_LEN_DOES_NOT_FIT,
                detail=f"one {max_model_len}-token request needs {run.gib(need)}"
                f", the KV cache has {run.gib(max(0, mem.kv_budget_bytes))}",
            ))
            continue
        sessions = run.sessions(
            mem, dtype.name, bs, run.p95_session, batched_tokens, max_model_len
        )
        feasible.append((dtype, sessions))
        verdicts.append(CandidateVerdict(
            value=dtype.name, ok=sessions >= target,
            check=FITS if sessions >= target else TOO_FEW_SEQUENCES,
            detail=f"{sessions} sequences of {run.p95_session} tokens (p95) fit; "
            f"target {target}",
        ))
    return verdicts, feasible


def _pick(run: PlanRun, feasible: list[tuple[KVCacheDType, int]], target: int,
          target_why: str) -> tuple[KVCacheDType, str, str, str | None]:
    """The widest feasible dtype that holds ``target`` sequences, else the one that holds
    the most (with a warning): the dtype, the reason's code, its message and the warning."""
    floor_name = run.req.policy.lowest_kv_precision
    warning: str | None = None
    meeting = [(d, s) for d, s in feasible if s >= target]
    if meeting:
        chosen, sessions = meeting[0]  # the widest (preference order)
        code = "WidestThatMeetsConcurrency"
        message = (
            f"{chosen.name} ({chosen.bits}-bit) is the widest dtype that holds the target "
            f"{target} sequences at the p95 session of {run.p95_session} tokens "
            f"({sessions} fit); target from {target_why}"
        )
    else:
        chosen, sessions = max(feasible, key=lambda ds: ds[1])
        code = "MostSequencesAllowed"
        message = (
            f"no allowed dtype holds the target {target} sequences at {run.p95_session} "
            f"tokens; {chosen.name} holds the most ({sessions}) without going below "
            f"{floor_name}"
        )
        warning = (
            f"KV capacity limits concurrency: {sessions} sequences at the p95 session, "
            f"below the target {target}; a larger tensor parallel, a lower quality floor "
            "or a larger GPU would hold more"
        )
    return chosen, code, message, warning


def gated_out(verdicts: list[CandidateVerdict]) -> str:
    """The dtypes the KV-quality gate ruled out, for the chosen dtype's reason: measured ones
    with their figure, unverified ones by name."""
    exceeded = [v for v in verdicts if v.check == kv_quality.EXCEEDS_KL]
    required = [v for v in verdicts if v.check == kv_quality.UNVERIFIED_REQUIRED]
    parts = [f"{v.value} ruled out: {v.detail}" for v in exceeded]
    if required:
        parts.append(f"{', '.join(v.value for v in required)} ruled out: "
                     f"{required[0].detail.removeprefix('unverified: ')}")
    return "".join(f"; {p}" for p in parts)


def _narrower(run: PlanRun, name: str, chosen: KVCacheDType) -> bool:
    order = [d.name for d in options(run)]
    return name in order and order.index(name) > order.index(chosen.name)
