"""``--enable-prefix-caching`` and ``--kv-offloading-size`` (with its backend).

Inputs: the workload profile's sharing (shared prefix, observed prefix hit rate, multi-turn)
and the policy's CPU budget for KV. Prefix caching stays on (vLLM's default; a miss costs
only a hash) unless the profile shows no sharing at all. KV offload to CPU is on only when
blocks would be read back (multi-turn, or prefix hit rate >= 0.3) and the budget across TP
ranks is at least 1 GiB. Pins win.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from kvtune.tuner.plan import Reason
from kvtune.tuner.units import GiB

if TYPE_CHECKING:
    from kvtune.tuner.planner.draft import Draft
    from kvtune.tuner.planner.planrun import PlanRun

# The prefix hit rate from which offloaded blocks are read back often enough to keep.
REUSE_HIT_RATE = 0.3


def prefix_caching(run: PlanRun, draft: Draft) -> Draft:
    """The draft with enable-prefix-caching decided."""
    pin = run.pins.enable_prefix_caching
    if pin is not None:
        return replace(draft.pinned("enable-prefix-caching", str(pin).lower()),
                       enable_prefix_caching=pin)
    p = run.req.profile
    if p.prefix_hit_rate is not None and p.prefix_hit_rate < 0.01 and (
        p.shared_prefix_tokens == 0 and not p.multi_turn
    ):
        return replace(draft.reason(Reason(
            knob="enable-prefix-caching", choice="false", code="NoSharing",
            message=f"observed prefix hit rate {p.prefix_hit_rate:.3f} and no shared "
            "prefix: hashing every block would cost CPU for no hits",
        )), enable_prefix_caching=False)
    why = []
    if p.shared_prefix_tokens:
        why.append(f"a shared prefix of {p.shared_prefix_tokens} tokens")
    if p.prefix_hit_rate is not None:
        why.append(f"prefix hit rate {p.prefix_hit_rate:.2f}")
    if p.multi_turn:
        why.append("multi-turn requests re-send their history")
    if not why:
        why.append("sharing unknown; vLLM's default, and a miss costs only a hash")
    return replace(draft.reason(Reason(
        knob="enable-prefix-caching", choice="true", code="PrefixSharing",
        message="; ".join(why),
    )), enable_prefix_caching=True)


def budget_size_gib(run: PlanRun) -> int:
    """The policy's CPU budget as vLLM's ``--kv-offloading-size``: whole GiB across all TP
    ranks (0: below 1 GiB, or no budget)."""
    return math.floor(run.req.policy.cpu_offload_budget_bytes * run.tp / GiB)


def shares_prefixes(run: PlanRun) -> bool:
    """Whether the profile shows any reuse a CPU tier could serve (the capacity search asks
    the simulator about offload only then)."""
    p = run.req.profile
    return bool(p.multi_turn or p.shared_prefix_tokens or (p.prefix_hit_rate or 0.0) >= 0.01)


def offload(run: PlanRun, draft: Draft) -> Draft:
    """The draft with kv-offloading-size decided: GiB of CPU memory across TP ranks for
    offloaded KV (None: off)."""
    pin = run.pins.kv_offloading_size_gib
    if pin is not None:
        return replace(draft.pinned("kv-offloading-size", f"{pin:g}" if pin else "off"),
                       kv_offloading_size_gib=pin if pin > 0 else None)
    cpu_budget = run.req.policy.cpu_offload_budget_bytes
    p = run.req.profile
    reusable = p.multi_turn or (p.prefix_hit_rate or 0.0) >= REUSE_HIT_RATE
    if cpu_budget <= 0 or not reusable:
        return replace(draft.reason(Reason(
            knob="kv-offloading-size", choice="off", code="NoOffload",
            message="no CPU memory budget for KV in the policy" if cpu_budget <= 0 else
            "little prefix reuse: offloaded blocks would rarely be read back",
        )), kv_offloading_size_gib=None)
    size = budget_size_gib(run)
    if size < 1:
        return replace(draft.reason(Reason(
            knob="kv-offloading-size", choice="off", code="NoOffload",
            message=f"the CPU budget ({run.gib(cpu_budget)} per GPU) is below 1 GiB",
        )), kv_offloading_size_gib=None)
    return replace(draft.reason(Reason(
        knob="kv-offloading-size", choice=f"{size}", code="ReusableKV",
        message=f"{size} GiB of CPU memory across {run.tp} rank(s) keeps evicted prefix "
        "blocks for later turns (multi-turn or prefix reuse)",
    )), kv_offloading_size_gib=float(size))
