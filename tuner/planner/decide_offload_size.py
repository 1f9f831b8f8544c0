"""How large a CPU tier (``--kv-offloading-size``) pays, sized from the traffic's reuse.

The capacity search (``search.py``) asks this module which sizes to try and why the one it
chose pays. The sizes come from the profile's reuse distances (``tuner/reuse_profile.py``):
per reuse of a prefix block, the distinct prompt tokens used since its previous use. vLLM's
CPU tier (``OffloadingConnector``, native backend) stores every block it is offered and evicts
the least recently used, so a tier of C tokens still holds the block at its reuse when the
distance is below C: the distance's p50, p90 and p99 are the tiers that catch half, nine
tenths and nearly all of the reuses. A quantile the GPU's own prefix cache already covers
(distance below its KV tokens) adds no size; sizes at or above the policy's budget are the
budget (the most the policy gives). Without reuse figures (a profile from Prometheus or a
declaration) the budget is the one size, as before.

For agents (a profile of kind ``agent`` with session gaps, the article's pattern 2) one more
size is tried, sized from the **session gaps**: the tier keeps a session's KV across a tool
call when it holds every token touched while the session waits. Neither tier vLLM 0.33 runs
expires blocks by time (the native ``OffloadingConnector`` and LMCache's in-process CPU tier
evict least recently used; lmcache 0.5.6's ``CacheInterface.ttl`` is read only by its
separate multiprocess server), so the TTL is realised by the size: an LRU tier of C tokens
keeps a block for as long as the traffic takes to touch C other tokens, at most the request
rate x the prompt tokens per request per second. With the TTL at the p90 session gap, C =
rate x p90 gap x p50 prompt tokens keeps nine sessions in ten across their tool call.

The search tries every size on its leader (the budget alone on the runner-up) and ranks them
by capacity at SLO; within the capacity tie a smaller tier wins (``search._order``: host
memory costs money and a smaller tier pins less of the node), so the plan keeps the smallest
size whose capacity is within the tie of the best. ``explain`` says how many GiB pay and
why, with the figures of every size weighed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtune.tuner.facts.kvmemory import block_bytes
from kvtune.tuner.plan import KVPlan, Reason
from kvtune.tuner.plan_reuse import TierSize
from kvtune.tuner.planner.capacity import Standing
from kvtune.tuner.units import GiB
from kvtune.tuner.workload import WorkloadProfile

if TYPE_CHECKING:
    from kvtune.tuner.planner.planrun import PlanRun

# vLLM's CPU region rounds each chunk up to the host page (``engine.offload_tier``).
_HOST_PAGE_BYTES = 4096
# The reuse-distance quantiles a size is tried at.
QUANTILES = ("p50", "p90", "p99")
BUDGET_BASIS = "the policy's CPU budget"
# Quantile sizes within 10 % of each other are one size (the larger): each size tried is a
# full-stream capacity ladder, and 10 % more host memory is not worth a ladder.
MERGE_WITHIN = 0.10


@dataclass(frozen=True, slots=True)
class SizeOption:
    size_gib: float
    basis: str  # why this size: a reuse-distance quantile, or the policy's budget


def tier_bytes_per_token(run: PlanRun, plan: KVPlan) -> float:
    """Host bytes one token takes in the CPU tier, all TP ranks together (one copy for MLA
    under TP, as ``engine.offload_tier``)."""
    page = block_bytes(run.model, plan.kv_cache_dtype, run.tp, plan.block_size,
                       model_dtype=run.model_dtype)
    copies = 1 if run.model.is_mla and run.tp > 1 else run.tp
    chunk = -(-page * copies // _HOST_PAGE_BYTES) * _HOST_PAGE_BYTES
    return chunk / plan.block_size


def gpu_kv_tokens(run: PlanRun, plan: KVPlan) -> int:
    """Tokens the GPU's KV cache holds under ``plan``."""
    mem = run.memory(plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs,
                     plan.max_num_batched_tokens, plan.gpu_memory_utilization)
    return max(0, mem.num_gpu_blocks - 1) * plan.block_size


def session_gap_size(profile: WorkloadProfile, bytes_per_token: float
                     ) -> SizeOption | None:
    """The tier that keeps an agent's session across its p90 tool-call gap (module doc), or
    None without session gaps and a request rate, or for a profile that is not an agent's."""
    gap, rate = profile.session_gap_seconds, profile.request_rate_per_second
    if profile.kind != "agent" or gap is None or not rate:
        return None
    tokens = rate * gap.p90 * profile.context_tokens.p50
    gib = float(math.ceil(tokens * bytes_per_token / GiB))
    return SizeOption(gib, f"session gaps: TTL p90 {gap.p90:g} s x {rate:.3g} req/s x "
                           f"{profile.context_tokens.p50:,} prompt tokens = {tokens:,.0f} tokens")


def _distance_options(run: PlanRun, plan: KVPlan, budget_gib: float) -> list[SizeOption]:
    """The reuse-distance quantile sizes below the budget, smallest first, near ones merged."""
    dist = run.req.profile.prefix_reuse_distance_tokens
    out: list[SizeOption] = []
    if dist is None:
        return out
    per_token = tier_bytes_per_token(run, plan)
    gpu_tokens = gpu_kv_tokens(run, plan)
    for q in QUANTILES:
        tokens = int(getattr(dist, q))
        if tokens <= gpu_tokens:
            continue  # the GPU's prefix cache already keeps reuses that close
        gib = float(math.ceil(tokens * per_token / GiB))
        if not 1 <= gib < budget_gib:
            continue
        if out and gib <= out[-1].size_gib * (1.0 + MERGE_WITHIN):
            out.pop()  # nearly the same memory: the larger catches more reuses
        out.append(SizeOption(gib, f"{q} reuse distance {tokens:,} tokens"))
    return out


def options(run: PlanRun, plan: KVPlan, budget_gib: float) -> tuple[SizeOption, ...]:
    """The sizes to try for ``plan``, smallest first, the budget last (module doc)."""
    out = _distance_options(run, plan, budget_gib)
    session = session_gap_size(run.req.profile, tier_bytes_per_token(run, plan))
    if session is not None and 1 <= session.size_gib < budget_gib:
        # A distance size within the merge band of it is the same memory: the session size
        # stays, named for its TTL.
        out = [o for o in out if abs(o.size_gib - session.size_gib)
               > session.size_gib * MERGE_WITHIN]
        out = sorted([*out, session], key=lambda o: o.size_gib)
    if out and budget_gib <= out[-1].size_gib * (1.0 + MERGE_WITHIN):
        out.pop()  # the budget is tried anyway
    out.append(SizeOption(float(budget_gib), BUDGET_BASIS))
    return tuple(out)


def tried(run: PlanRun, leaders: Sequence[KVPlan], budget_gib: float) -> list[KVPlan]:
    """The plans the search's offload stage scores: every size on the leader, the budget on
    the others (each size is a full-stream ladder; the runner-up rarely wins)."""
    out: list[KVPlan] = []
    for i, plan in enumerate(leaders):
        sizes = options(run, plan, budget_gib) if i == 0 else (
            SizeOption(float(budget_gib), BUDGET_BASIS),)
        out += [plan.with_offload(o.size_gib) for o in sizes]
    return out


def capacity_text(row: TierSize) -> str:
    """A size's capacity in req/s, or that it missed the SLO at the observed rate (its ladder
    went no lower: the capacity is below the observed rate, not measured)."""
    if row.capacity_under_requests_per_second is not None:
        return f"under {row.capacity_under_requests_per_second:.3g}"
    if row.capacity_requests_per_second <= 0 and not row.meets_slo_at_observed:
        return "below the observed rate"
    return f"{row.capacity_requests_per_second:.3g}"


def _label(basis: str) -> str:
    """A size's basis in a reason: its quantile, or "budget" (the full text is in
    ``search.reuse.tier_sizes``)."""
    if basis.startswith("session"):
        return "session gaps"
    return "budget" if basis == BUDGET_BASIS else basis.split()[0]


def _reuse_quote(run: PlanRun, plan: KVPlan) -> str:
    p = run.req.profile
    gap, dist = p.prefix_reuse_gap_seconds, p.prefix_reuse_distance_tokens
    if gap is not None and dist is None:
        # A profile from Prometheus: vLLM's reuse gaps end at a block's eviction, so they are
        # the reuses the GPU caught, not the ones a tier would (operator/prometheus/
        # reuse_window.py); no distance is made of them.
        return (f"vLLM's reuse gaps (p50 {gap.p50:g} s, p90 {gap.p90:g} s) count only reuses "
                "the GPU cache caught, so no reuse distance is known: only the budget is "
                "tried (a trace with prefix ids gives the distances)")
    if gap is None or dist is None or dist.p90 is None:
        return "no reuse figures in the profile (a trace with prefix ids gives them): only " \
            "the budget is tried"
    per_token = tier_bytes_per_token(run, plan)
    return (f"a prefix block comes back after p50 {gap.p50:.0f} s / p90 {gap.p90:.0f} s and "
            f"{dist.p50:,} / {dist.p90:,} distinct tokens ({dist.p50 * per_token / GiB:.0f} / "
            f"{dist.p90 * per_token / GiB:.0f} GiB); the GPU holds "
            f"{gpu_kv_tokens(run, plan):,} tokens")


def tier_sizes(sizes: Sequence[SizeOption], standings: Sequence[Standing], rate: float,
               chosen_gib: float, target: float, tie: float) -> tuple[TierSize, ...]:
    """``standings``: no tier first, then one per size; ``target``: the SLO attainment;
    ``tie``: the capacity tie (a size whose missed rate lies below the best's band was put
    out by the knockout: its capacity is quoted as under that rate)."""
    rows = [SizeOption(0.0, "no CPU tier"), *sizes]
    top = max(st.lower_scale for st in standings)

    def under(st: Standing) -> float | None:
        out = math.isfinite(st.upper_scale) and st.upper_scale <= top * (1.0 - tie)
        return round(rate * st.upper_scale, 4) if out else None

    return tuple(TierSize(
        size_gib=o.size_gib, basis=o.basis,
        capacity_requests_per_second=round(rate * st.lower_scale, 4),
        meets_slo_at_observed=st.meets_observed(target),
        capacity_under_requests_per_second=under(st),
        gpu_prefix_hit_rate=round(st.at_observed.prefix_hit_rate, 4),
        cpu_prefix_hit_rate=round(st.at_observed.cpu_hit_rate, 4),
        chosen=o.size_gib == chosen_gib,
    ) for o, st in zip(rows, standings, strict=True))


def explain(run: PlanRun, plan: KVPlan, rows: Sequence[TierSize], tie: float,
            requests: int) -> Reason:
    """How many GiB of CPU tier pay and why, with every size's figures (``rows``: from
    ``tier_sizes``; ``plan``: the chosen one)."""
    chosen = next(r for r in rows if r.chosen)
    off = rows[0]
    best = max(r.capacity_requests_per_second for r in rows)
    within = [r for r in rows if r.capacity_requests_per_second >= best * (1.0 - tie)]
    smallest = min(within, key=lambda r: r.size_gib)
    table = ", ".join(
        f"{'off' if r.size_gib == 0 else f'{r.size_gib:g} GiB ({_label(r.basis)})'} "
        f"{capacity_text(r)} (CPU hits {r.cpu_prefix_hit_rate:.0%})"
        for r in rows)
    rule = (f"the smallest within the {tie:.0%} capacity tie of the best ({best:.3g} req/s)"
            if chosen is smallest else "chosen by the search's ranking of all candidates "
            "(a smaller size's figures here are its own ladder's)")
    if chosen.size_gib == 0:
        head = ("no CPU tier pays: without one the capacity at SLO is "
                f"{off.capacity_requests_per_second:.3g} req/s per replica, {rule}")
    else:
        # Against a tierless plan the knockout put out, the gain is at least this much.
        off_cap = off.capacity_under_requests_per_second or off.capacity_requests_per_second
        gain = (chosen.capacity_requests_per_second / off_cap - 1.0
                if off_cap > 0 else math.inf)
        at_least = "at least " if off.capacity_under_requests_per_second else ""
        head = (f"{chosen.size_gib:g} GiB of CPU tier pays: capacity at SLO "
                f"{chosen.capacity_requests_per_second:.3g} req/s per replica against "
                f"{capacity_text(off)} without ({at_least}{gain:+.0%}), the tier "
                f"serving {chosen.cpu_prefix_hit_rate:.1%} of prompt tokens beside the GPU's "
                f"{chosen.gpu_prefix_hit_rate:.1%}; {rule}")
    return Reason(
        knob="kv-offloading-size", choice=f"{chosen.size_gib:g}" if chosen.size_gib else "off",
        code="BestCapacity",
        message=f"{head}. Sizes weighed over {requests} requests, req/s: {table}. From the "
        f"traffic's reuse: {_reuse_quote(run, plan)}",
    )


__all__ = ["SizeOption", "capacity_text", "explain", "gpu_kv_tokens", "options",
           "session_gap_size", "tier_bytes_per_token", "tier_sizes", "tried"]
