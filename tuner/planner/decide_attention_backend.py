"""``--attention-backend``: left to vLLM unless pinned, but reported.

Inputs: the final dtype and block size. Rule: kvtune never pins a backend itself (a vLLM
upgrade keeps its own choice); the reason names the one vLLM will pick, and a warning says
when the block size makes vLLM fall back from its preferred backend to a slower one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtune.tuner.plan import Reason
from kvtune.tuner.planner.draft import need

if TYPE_CHECKING:
    from kvtune.tuner.planner.draft import Draft
    from kvtune.tuner.planner.planrun import PlanRun


def report(run: PlanRun, draft: Draft) -> Draft:
    """The draft with the backend vLLM will pick for its plan (a reason) and a warning when
    the block size makes vLLM fall back from its preferred backend."""
    plan = need(draft.plan, "the assembled plan")
    cc = run.cc
    backend = run.backends.backend_for(plan.kv_cache_dtype, plan.block_size)
    preferred = run.backends.backend_for(plan.kv_cache_dtype)
    if backend is not None and preferred is not None and backend.name != preferred.name:
        draft = draft.warn(
            f"block size {plan.block_size} makes vLLM fall back from {preferred.name} to "
            f"{backend.name} for {plan.kv_cache_dtype} KV ({preferred.name} accepts "
            f"{preferred.block_size_rule(cc)})"
        )
    if backend is not None and plan.attention_backend is None:
        draft = draft.reason(Reason(
            knob="attention-backend", choice=f"auto ({backend.name})", code="RuntimePicks",
            message=f"vLLM picks {backend.name} for {plan.kv_cache_dtype} KV on compute "
            f"capability {cc[0]}.{cc[1]}; not pinned so upgrades keep their "
            "choice",
        ))
    return draft
