"""The capacity search's reuse summary (``search.reuse``) as pool status, priced: the GPU's
price comes with ``planner/cost.priced`` (``gpu_prices``), the host memory's from the chart's
``hostMemoryPriceUsdPerGiBHour`` (``kvtune operator --host-memory-price``), as ``kvtune plan
--host-memory-price`` does (``tuner/planner/reuse_money.py``). kvtune ships no host-memory
price fact, so without the chart value the CPU tier's cost is not shown."""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.operator.api import ReuseStatus, TierSizeStatus
from kvtune.tuner.plan import PoolPlan

# The plan's reason for the CPU tier's size (tuner/planner/decide_offload_size.explain).
OFFLOAD_SIZE_KNOB = "kv-offloading-size"
# The plan's reason for the tier kind (tuner/simulator/tier_choice.explain).
TIER_KIND_KNOB = "kv-tier"


@dataclass
class HostPriceConfig:
    """Set by ``kvtune operator`` before kopf starts (None: not priced)."""

    usd_per_gib_hour: float | None = None


CONFIG = HostPriceConfig()
SOURCE = "chart hostMemoryPriceUsdPerGiBHour"


def with_host_price(pool_plan: PoolPlan) -> PoolPlan:
    """``pool_plan`` with its CPU tier priced at the chart's host-memory price (no change
    without one or without reuse figures)."""
    from kvtune.tuner.planner.reuse_money import with_host_price as priced

    price = CONFIG.usd_per_gib_hour
    if price is None:
        return pool_plan
    return priced(pool_plan, price, f"{SOURCE} {price:g} USD/GiB-hour")


def _sig(x: float | None) -> float | None:
    # Compared before written (as gpu_prices._round): float noise must not rewrite status.
    return None if x is None else float(f"{x:.4g}")


def reuse_status(pool_plan: PoolPlan) -> ReuseStatus | None:
    """``search.reuse`` as status (None: no capacity search, or nothing reused)."""
    from kvtune.tuner.planner.decide_offload_size import capacity_text

    s = pool_plan.search
    r = s.reuse if s is not None else None
    if r is None:
        return None
    why = next((x.message for x in reversed(pool_plan.reasons) if x.knob == OFFLOAD_SIZE_KNOB),
               "")
    status = ReuseStatus(
        gpu_prefix_hit_rate=r.gpu_prefix_hit_rate, cpu_prefix_hit_rate=r.cpu_prefix_hit_rate,
        cached_prompt_tokens_per_day=_sig(r.cached_prompt_tokens_per_day) or 0.0,
        prefill_gpu_seconds_saved_per_day=_sig(r.prefill_gpu_seconds_saved_per_day) or 0.0,
        usd_saved_per_day=_sig(r.usd_saved_per_day), gpu_price_source=r.gpu_price_source,
        cpu_tier_gib_per_replica=r.cpu_tier_gib_per_replica,
        cpu_tier_usd_per_day=_sig(r.cpu_tier_usd_per_day),
        cpu_tier_price_source=r.cpu_tier_price_source,
        tier_reason=why if r.tier_sizes else "",
        tier_sizes=[TierSizeStatus(size_gib=t.size_gib, basis=t.basis,
                                   capacity=capacity_text(t),
                                   gpu_prefix_hit_rate=t.gpu_prefix_hit_rate,
                                   cpu_prefix_hit_rate=t.cpu_prefix_hit_rate, chosen=t.chosen)
                    for t in r.tier_sizes],
    )
    return with_tier_kind(status, pool_plan)


def with_tier_kind(status: ReuseStatus, pool_plan: PoolPlan) -> ReuseStatus:
    """The tier kind chosen (spec.tuning.kvTiers), its reason, its GiB and its hit rates
    (the plan's expected figures at that tier); ``status`` as is when no kind was weighed.
    The savings stay the search's (at its native tier size)."""
    kind = next((x for x in reversed(pool_plan.reasons) if x.knob == TIER_KIND_KNOB), None)
    if kind is None:
        return status
    tier, e = pool_plan.kv_tier, pool_plan.expected
    host_gib = (tier.cpu_gib() if tier is not None
                else pool_plan.plan.kv_offloading_size_gib or 0.0)
    # The tier's dollars follow its host GiB (the price per GiB-day over the replicas is the
    # search's); unknown when the search priced no tier.
    was, usd = status.cpu_tier_gib_per_replica, status.cpu_tier_usd_per_day
    usd = (None if usd is None or (was <= 0 and host_gib > 0)
           else 0.0 if host_gib <= 0 else _sig(usd * host_gib / was))
    return status.model_copy(update={
        "tier": kind.choice, "cpu_tier_usd_per_day": usd, "tier_reason": kind.message,
        "gpu_prefix_hit_rate": e.prefix_hit_rate if e.prefix_hit_rate is not None
        else status.gpu_prefix_hit_rate,
        "cpu_prefix_hit_rate": e.cpu_prefix_hit_rate or 0.0,
        "cpu_tier_gib_per_replica": host_gib,
        "tier_disk_gib_per_replica": tier.disk_gib() if tier is not None else 0.0})


__all__ = ["CONFIG", "HostPriceConfig", "reuse_status", "with_host_price", "with_tier_kind"]
