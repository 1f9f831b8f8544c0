"""Status of prefix reuse: what the plan predicts each KV tier catches and saves
(``status.pools[].reuse``, from the capacity search's ``search.reuse``), and what vLLM's
counters showed (``status.pools[].observedReuse``, ``status.profile.observed.tierHitRates``).

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvtune.operator.api.schema_base import _Status


class TierHitRatesStatus(_Status):
    """Observed: the share of prompt tokens whose KV each tier supplied
    (``vllm:prompt_tokens_cached_by_source`` over ``vllm:prompt_tokens_by_source``).
    ``device``: the GPU's prefix cache; ``host``: the CPU tier; ``external``: a connector
    that does not say which tier."""

    prompt_tokens: int
    device: float
    host: float
    disk: float = 0.0
    p2p: float = 0.0
    external: float = 0.0


class TierSizeStatus(_Status):
    """One CPU tier size the capacity search weighed (``search.reuse.tier_sizes``)."""

    size_gib: float = Field(alias="sizeGiB")  # 0: no tier
    basis: str  # a reuse-distance quantile, or the policy's budget
    capacity: str  # req/s per replica at SLO, or "under X" (put out by the knockout)
    gpu_prefix_hit_rate: float
    cpu_prefix_hit_rate: float
    chosen: bool = False


class ReuseStatus(_Status):
    """Prefix reuse as the capacity search predicts it at the observed rate, and its money
    (``tuner/planner/reuse_money.py``): per day over all replicas."""

    gpu_prefix_hit_rate: float  # of prompt tokens, the GPU's prefix cache
    cpu_prefix_hit_rate: float  # loaded from the CPU tier (--kv-offloading-size)
    cached_prompt_tokens_per_day: float
    prefill_gpu_seconds_saved_per_day: float  # a floor: attention left out
    usd_saved_per_day: float | None = None  # None: the GPU class has no price
    gpu_price_source: str | None = None
    cpu_tier_gib_per_replica: float = Field(default=0.0, alias="cpuTierGiBPerReplica")
    cpu_tier_usd_per_day: float | None = None  # None: no host-memory price (chart value)
    cpu_tier_price_source: str | None = None
    # Why this tier size: the search's reason for --kv-offloading-size (empty: no tier
    # weighed), and the sizes it weighed.
    tier_reason: str = ""
    tier_sizes: list[TierSizeStatus] = []
    # The tier kind chosen and its GiB per replica ("lmcache-disk 256 GiB", "native-cpu 64
    # GiB", "no tier") when spec.tuning.kvTiers had the kinds weighed (tier_reason is then
    # that choice's reason, and the hit rates are at that tier); empty otherwise.
    tier: str = ""
    tier_disk_gib_per_replica: float = Field(default=0.0, alias="tierDiskGiBPerReplica")


class KVTierStatus(_Status):
    """The LMCache tier the pods run (``PoolPlan.kv_tier``; none: vLLM's native tier, in
    ``plan``, or no tier): kept so a plan in force is put back with its tier."""

    kind: str  # lmcache-cpu, lmcache-disk or lmcache-remote
    size_gib: float = Field(alias="sizeGiB")  # across TP ranks
    buffer_gib: float = Field(default=0.0, alias="bufferGiB")
    chunk_size_tokens: int
    remote_url: str | None = None


class ObservedReuseStatus(_Status):
    """The share of prompt tokens each tier supplied over the retune timer's last window,
    beside the plan's prediction (written by the retune timer, as ``observedSLO``)."""

    at: str
    window_seconds: float
    scope: Literal["pool", "deployment"]  # the pool's own series, or the deployment's
    observed: TierHitRatesStatus
    predicted_gpu_prefix_hit_rate: float | None = None
    predicted_cpu_prefix_hit_rate: float | None = None
