"""What prefix reuse saves, and what the CPU tier costs (``SearchSummary.reuse``).

At the observed traffic (all replicas together, per day):

- **cached prompt tokens** = requests per day x prompt tokens looked up per request x the
  predicted hit rate of the GPU's prefix cache plus the CPU tier's (the simulator on the
  pool's own traffic, at the observed rate, under the chosen plan);
- **prefill GPU-seconds saved** = cached tokens x the compute one prompt token takes
  (``decode.prefill_seconds_per_token``: 2 FLOPs per active parameter shared by the TP
  ranks, at the planner's prefill MFU) x the TP GPUs that compute it together. Attention over
  the cached context is left out, so the figure is a floor; a CPU hit's load rides the host
  link (DMA), not the GPU's compute;
- **dollars saved** = GPU-seconds / 3600 x the pool's GPU price (``tuner/facts/prices.py``,
  its source quoted), when the class has one;
- **the CPU tier's cost** = its GiB per replica x the replicas serving x 24 h x a host-memory
  price per GiB-hour. kvtune ships no host-memory price fact (no published per-GiB figure
  it could cite for the nodes a pool runs on): not priced unless the user gives one
  (``kvtune plan --host-memory-price``), quoted as its source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtune.tuner.facts.prices import GPUPrice
from kvtune.tuner.facts.weights import weight_bits
from kvtune.tuner.plan import KVPlan, PoolPlan
from kvtune.tuner.plan_reuse import ReuseFigures, TierSize
from kvtune.tuner.planner import decode
from kvtune.tuner.planner.capacity import GoodputScore

if TYPE_CHECKING:
    from kvtune.tuner.planner.planrun import PlanRun

SECONDS_PER_DAY = 86_400.0


def figures(run: PlanRun, plan: KVPlan, score: GoodputScore, observed_rate_per_second: float,
            tiers: Sequence[TierSize] = ()) -> ReuseFigures | None:
    """The reuse figures of the chosen plan (module doc); None when no prompt token was
    cached and no tier was weighed."""
    hit = score.prefix_hit_rate + score.cpu_hit_rate
    cached_per_request = hit * score.prompt_tokens_per_request
    if cached_per_request <= 0 and not tiers:
        return None
    tokens_per_day = cached_per_request * observed_rate_per_second * SECONDS_PER_DAY
    bits = weight_bits(run.model, run.req.weights_dtype)
    gpu_seconds_per_token = decode.prefill_seconds_per_token(
        run.model, run.gpu, run.tp, bits) * run.tp
    # Rounded: simulated figures, and the plan travels in a search Job's 4 kB answer.
    return ReuseFigures(
        gpu_prefix_hit_rate=round(score.prefix_hit_rate, 4),
        cpu_prefix_hit_rate=round(score.cpu_hit_rate, 4),
        cached_prompt_tokens_per_day=round(tokens_per_day),
        prefill_gpu_seconds_saved_per_day=round(tokens_per_day * gpu_seconds_per_token, 1),
        cpu_tier_gib_per_replica=plan.kv_offloading_size_gib or 0.0,
        tier_sizes=tuple(tiers),
    )


def priced(pool: PoolPlan, price: GPUPrice | None) -> PoolPlan:
    """``pool`` with the dollars its prefix reuse saves at ``price`` (no change without
    reuse figures or a price)."""
    s = pool.search
    if s is None or s.reuse is None or price is None:
        return pool
    usd = s.reuse.prefill_gpu_seconds_saved_per_day / 3600.0 * price.usd_per_gpu_hour
    reuse = s.reuse.model_copy(update={"usd_saved_per_day": usd,
                                       "gpu_price_source": price.source})
    return pool.model_copy(update={"search": s.model_copy(update={"reuse": reuse})})


def with_host_price(pool: PoolPlan, usd_per_gib_hour: float, source: str) -> PoolPlan:
    """``pool`` with its CPU tier priced: GiB per replica x the replicas serving (those the
    traffic needs at SLO, else those planned) x 24 h x ``usd_per_gib_hour``."""
    s = pool.search
    if s is None or s.reuse is None:
        return pool
    replicas = s.replicas_needed or s.replicas
    usd = s.reuse.cpu_tier_gib_per_replica * replicas * 24.0 * usd_per_gib_hour
    reuse = s.reuse.model_copy(update={
        "cpu_tier_usd_per_day": usd,
        "cpu_tier_price_source": f"{source} (x {replicas} replica(s) x 24 h)"})
    return pool.model_copy(update={"search": s.model_copy(update={"reuse": reuse})})


__all__ = ["SECONDS_PER_DAY", "figures", "priced", "with_host_price"]
