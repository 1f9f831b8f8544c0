"""What prefix reuse is worth in a plan (``SearchSummary.reuse``): the predicted hit rate of
each KV tier, the CPU tier sizes the search weighed, and the money (``planner/reuse_money``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TierSize(BaseModel):
    """One CPU tier size the capacity search scored on the chosen configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size_gib: float = Field(ge=0.0)  # --kv-offloading-size across TP ranks (0: no tier)
    basis: str  # where the size comes from (a reuse-distance quantile, the policy's budget)
    capacity_requests_per_second: float  # per replica at SLO (a lower bound; the chosen's: 2 %)
    # At the observed rate (False with capacity 0: missed there and not probed lower).
    meets_slo_at_observed: bool = True
    # Set when the capacity search's knockout put this size out of the tie band after one
    # replay (it missed the SLO at this rate): its capacity is under it, not measured closer.
    capacity_under_requests_per_second: float | None = None
    gpu_prefix_hit_rate: float  # of prompt tokens, at the observed rate
    cpu_prefix_hit_rate: float
    chosen: bool


class ReuseFigures(BaseModel):
    """Prefix reuse at the observed traffic, all replicas together, per day."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Of prompt tokens, predicted by the simulator at the observed rate: found in the GPU's
    # prefix cache, and loaded from the CPU tier (``--kv-offloading-size``).
    gpu_prefix_hit_rate: float = Field(ge=0.0, le=1.0)
    cpu_prefix_hit_rate: float = Field(ge=0.0, le=1.0)
    cached_prompt_tokens_per_day: float = Field(ge=0.0)
    # Prefill compute the cached tokens spare (2 FLOPs per active parameter per token at the
    # planner's prefill MFU, ``decode.prefill_seconds_per_token``; attention over the context
    # is left out, so this is a floor), in GPU-seconds (x tensor-parallel GPUs).
    prefill_gpu_seconds_saved_per_day: float = Field(ge=0.0)
    # The same at the pool's GPU price (None: the GPU class has no price), and its source.
    usd_saved_per_day: float | None = None
    gpu_price_source: str | None = None
    # The CPU tier: host memory per replica, and what it costs per day (None: not priced;
    # kvtune ships no host-memory price fact; ``kvtune plan --host-memory-price`` gives one).
    cpu_tier_gib_per_replica: float = Field(default=0.0, ge=0.0)
    cpu_tier_usd_per_day: float | None = None
    cpu_tier_price_source: str | None = None
    # The CPU tier sizes the search weighed (empty: none searched).
    tier_sizes: tuple[TierSize, ...] = ()
