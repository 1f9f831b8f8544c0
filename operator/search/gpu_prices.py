"""The GPU prices the operator prices plans with: a pool's own
``spec.pools[].gpuPriceUsdPerHour``, else the chart's ``gpuPrices`` (``kvtune operator
--gpu-price CLASS=USD``), else kvtune's list prices (``tuner/facts/data/gpu_prices.json``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtune.operator.api import CostStatus, PoolSpec
from kvtune.tuner.facts.prices import GPUPrice, price_for
from kvtune.tuner.plan import PoolPlan


@dataclass
class PriceConfig:
    """Set by ``kvtune operator`` before kopf starts."""

    overrides: dict[str, float] = field(default_factory=dict)


CONFIG = PriceConfig()


def price_of(pool: PoolSpec, field_name: str) -> GPUPrice | None:
    if pool.gpu_price_usd_per_hour is not None:
        return GPUPrice(gpu_class=pool.gpu_class, usd_per_gpu_hour=pool.gpu_price_usd_per_hour,
                        source=f"{field_name}.gpuPriceUsdPerHour")
    return price_for(pool.gpu_class, CONFIG.overrides, override_source="chart gpuPrices")


def cost_status(pool_plan: PoolPlan) -> CostStatus | None:
    """The chosen configuration's cost, as status (None: no search or no price)."""
    s = pool_plan.search
    if s is None or s.cost is None:
        return None
    c = s.cost
    return CostStatus(
        usd_per_gpu_hour=c.usd_per_gpu_hour, price_source=c.price_source,
        gpus_per_replica=c.gpus_per_replica,
        cost_per_million_output_tokens_usd=_round(c.cost_per_million_output_tokens_usd),
        cost_per_million_good_requests_usd=_round(c.cost_per_million_good_requests_usd),
    )


def _round(x: float | None) -> float | None:
    # Status is compared before it is written: four significant digits keep a re-plan with
    # the same figures from rewriting it for float noise.
    return None if x is None else float(f"{x:.4g}")
