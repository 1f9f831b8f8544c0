"""``--block-size`` (tokens per KV page); with a scorer, together with ``--max-num-seqs``.

Inputs: the chosen dtype, the sizes its preferred backend accepts (``backend_choice``;
other sizes make vLLM fall back to a slower backend), the sequences that fit at the p95
session and whether prefix caching is on. Closed form (``closed_form``): the size with the
least waste, half a block per running sequence plus the shared prefix's partial tail that
prefix caching cannot reuse. With a ``CandidateScorer`` (``scored``): block size x
max-num-seqs candidates that pass pre-flight are simulated and ``scored.pick_scored`` takes
the best that meets the SLOs. A pin wins.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.kvmemory import hybrid_block_size
from kvtune.tuner.plan import CandidateVerdict, KVPlan, Reason
from kvtune.tuner.planner import scored as scoring
from kvtune.tuner.planner.backend_choice import BLOCK_SIZE_CANDIDATES
from kvtune.tuner.planner.checks import (
    CHOSEN,
    FITS,
    MORE_WASTE,
    PINNED,
    SWITCHES_BACKEND,
    UNSUPPORTED_BY_BACKEND,
)
from kvtune.tuner.planner.draft import need

if TYPE_CHECKING:
    from kvtune.tuner.planner.draft import Draft
    from kvtune.tuner.planner.planrun import PlanRun
    from kvtune.tuner.planner.request import CandidateScorer


def hybrid_forced(run: PlanRun, dtype_name: str, block_size: int) -> int | None:
    """The block size vLLM forces on a hybrid Mamba model (its attention page must hold one
    Mamba state: ``kvmemory.hybrid_block_size``); None for other models."""
    if run.model.mamba is None:
        return None
    return hybrid_block_size(run.model, dtype_name, run.tp, block_size,
                             model_dtype=run.model_dtype)


def candidates(run: PlanRun, dtype_name: str) -> list[int]:
    """Sizes the preferred backend accepts (the pin alone when pinned; on a hybrid Mamba
    model the size vLLM forces, which it would raise any smaller choice to)."""
    forced = hybrid_forced(run, dtype_name, run.pins.block_size or 16)
    if forced is not None:
        return [forced]
    if run.pins.block_size is not None:
        return [run.pins.block_size]
    return [bs for bs in BLOCK_SIZE_CANDIDATES if run.backends.preferred_ok(dtype_name, bs)] or [
        run.backends.smallest_block(dtype_name)]


def closed_form(
    run: PlanRun, dtype_name: str, sessions: int, prefix_caching: bool
) -> tuple[int, Reason]:
    forced = hybrid_forced(run, dtype_name, run.pins.block_size or 16)
    if forced is not None:
        return forced, Reason(
            knob="block-size", choice=str(forced), code="HybridMambaPage",
            message=f"{forced} tokens: vLLM raises a hybrid model's attention block until "
            "one page holds a Mamba state (and pads the state to that page)",
        )
    if run.pins.block_size is not None:
        return run.pins.block_size, Reason(
            knob="block-size", choice=str(run.pins.block_size), code=PINNED,
            message=f"pinned by the policy to {run.pins.block_size}",
        )
    cc = run.cc
    backend = run.backends.backend_for(dtype_name)
    verdicts: list[CandidateVerdict] = []
    wastes: list[tuple[float, int]] = []
    shared = run.req.profile.shared_prefix_tokens
    for bs in BLOCK_SIZE_CANDIDATES:
        if not run.backends.preferred_ok(dtype_name, bs):
            fallback = run.backends.backend_for(dtype_name, bs)
            verdicts.append(CandidateVerdict(
                value=str(bs), ok=False,
                check=SWITCHES_BACKEND if fallback else UNSUPPORTED_BY_BACKEND,
                detail=f"{backend.name if backend else 'the backend'} accepts "
                f"{backend.block_size_rule(cc) if backend else 'none'}"
                + (f"; vLLM would fall back to {fallback.name}" if fallback else ""),
            ))
            continue
        # Half a block per running sequence is allocated but empty on average; only
        # full blocks are prefix-cached, so a shared prefix loses its partial tail.
        frag = max(1, sessions) * bs / 2
        prefix_loss = (shared % bs if shared else bs / 2) if prefix_caching else 0.0
        waste = frag + prefix_loss * max(1, sessions)
        wastes.append((waste, bs))
        verdicts.append(CandidateVerdict(
            value=str(bs), ok=True, check=FITS,
            detail=f"~{frag:.0f} tokens fragmented across {max(1, sessions)} sequences"
            + (f", ~{prefix_loss:.0f} prefix tokens per request not cacheable"
               if prefix_caching else ""),
        ))
    if not wastes:
        bs = run.backends.smallest_block(dtype_name)
        return bs, Reason(
            knob="block-size", choice=str(bs), code="BackendRequires",
            message=f"{backend.name if backend else 'the backend'} accepts only "
            f"{backend.block_size_rule(cc) if backend else bs}",
            candidates=tuple(verdicts),
        )
    waste, bs = min(wastes)
    verdicts = [
        v.model_copy(update={"check": CHOSEN}) if v.value == str(bs)
        else (v.model_copy(update={"check": MORE_WASTE}) if v.ok else v)
        for v in verdicts
    ]
    return bs, Reason(
        knob="block-size", choice=str(bs), code="LeastWaste",
        message=(
            f"{bs} tokens: the least fragmentation and prefix-granularity loss among the "
            f"sizes {backend.name if backend else 'the backend'} accepts "
            f"({backend.block_size_rule(cc) if backend else ''}); about {waste:.0f} "
            "tokens of KV held but unused"
        ),
        candidates=tuple(verdicts),
    )


def decide(run: PlanRun, draft: Draft, scorer: CandidateScorer | None) -> Draft:
    """The draft's plan with its block size: scored together with max-num-seqs when there is
    a scorer, else the closed form at the sequences of the p95 session that fit."""
    plan = need(draft.plan, "the assembled plan")
    if scorer is not None:
        return scored(run, draft, plan, scorer)
    mem = need(draft.probe_memory, "the probe memory")
    sessions_p95 = run.sessions(
        mem, plan.kv_cache_dtype, plan.block_size, run.p95_session,
        need(draft.batched_tokens, "max-num-batched-tokens"), plan.max_model_len)
    bs, reason = closed_form(run, plan.kv_cache_dtype, sessions_p95,
                             plan.enable_prefix_caching)
    return replace(draft.reason(reason), plan=plan.model_copy(update={"block_size": bs}))


def scored(run: PlanRun, draft: Draft, plan: KVPlan, scorer: CandidateScorer) -> Draft:
    """Block size x max-num-seqs (0.5x to 1.5x the bandwidth model's) scored on the
    workload; a changed max-num-seqs gets its own reason."""
    fit_p50 = need(draft.fit_p50_sessions, "the median sessions that fit")
    base = plan.max_num_seqs
    seq_options = sorted({
        max(1, s) for s in (base // 2, base * 3 // 4, base, base * 5 // 4, base * 3 // 2)
        if s <= max(base, fit_p50)
    } | ({run.pins.max_num_seqs} if run.pins.max_num_seqs else set()))
    if run.pins.max_num_seqs is not None:
        seq_options = [run.pins.max_num_seqs]
    offered = [
        c for c in (
            plan.model_copy(update={
                "block_size": bs, "max_num_seqs": s,
                "max_num_batched_tokens": max(plan.max_num_batched_tokens, s),
            })
            for bs in candidates(run, plan.kv_cache_dtype)
            for s in seq_options
        )
        # Larger blocks round a request up further: offer only what passes pre-flight.
        if run.preflight_ok(
            run.memory(c.kv_cache_dtype, c.block_size, c.max_num_seqs,
                       c.max_num_batched_tokens, c.gpu_memory_utilization),
            c.kv_cache_dtype, c.block_size, c.max_num_batched_tokens, c.max_model_len)
    ] or [plan]
    scores = list(scorer(run.req, offered))
    if len(scores) != len(offered):
        raise InvalidInput(
            "scorer", type(scorer).__name__,
            f"returned {len(scores)} scores for {len(offered)} candidates",
        )
    picked = scoring.pick_scored(scores, run.req.policy.slo)
    best, code, verdicts = picked.best, picked.code, picked.verdicts
    if picked.warning is not None:
        draft = draft.warn(picked.warning)
    chosen = best.plan
    reason = Reason(
        knob="block-size", choice=str(chosen.block_size), code=code,
        message=(
            f"scored {len(scores)} candidates (block size x max-num-seqs) on the workload; "
            f"block {chosen.block_size} with {chosen.max_num_seqs} sequences: "
            f"{best.summary}"
        ),
        candidates=verdicts,
    )
    if chosen.max_num_seqs != plan.max_num_seqs:
        draft = draft.reason(Reason(
            knob="max-num-seqs", choice=str(chosen.max_num_seqs), code=code,
            message=f"the scorer preferred {chosen.max_num_seqs} over the bandwidth "
            f"model's {plan.max_num_seqs}: {best.summary}",
        ))
    return replace(draft.reason(reason), plan=chosen, score=best)
