"""GPU hourly prices as data (``tuner/facts/data/gpu_prices.json``): the defaults the cost
figures of the capacity search use, each with where it comes from, and the overrides a user
gives (``--gpu-price H100=2.5``, the chart value ``gpuPrices``, a pool's
``gpuPriceUsdPerHour``). A class with no default and no override has no price: its cost is
not shown (never a guessed figure)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import cache

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts import data_files


class GPUPrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_class: str
    usd_per_gpu_hour: float = Field(gt=0)
    source: str  # where the figure comes from (a URL and date, or who overrode it)


@cache
def default_prices() -> dict[str, GPUPrice]:
    """The shipped list prices by GPU class name."""
    doc = data_files.read_json("data", "gpu_prices.json")
    return {p["gpu_class"]: GPUPrice.model_validate(p) for p in doc["prices"]}


def parse_overrides(items: Iterable[str], field: str) -> dict[str, float]:
    """``CLASS=USD`` items (each may hold several, comma-separated) as a mapping; a malformed
    one is a one-line error naming ``field``."""
    out: dict[str, float] = {}
    for item in items:
        for part in (p.strip() for p in item.split(",")):
            if not part:
                continue
            name, sep, value = part.partition("=")
            try:
                usd = float(value) if sep else math.nan
            except ValueError:
                usd = math.nan
            if not name.strip() or not math.isfinite(usd) or usd <= 0:
                raise InvalidInput(field, part, "give CLASS=USD per GPU-hour, a positive "
                                   "number, e.g. H100=2.49")
            out[name.strip()] = usd
    return out


def price_for(gpu_class: str, overrides: Mapping[str, float] | None = None,
              override_source: str = "--gpu-price") -> GPUPrice | None:
    """The price of one GPU of ``gpu_class`` per hour: an override (matched by class name,
    case-insensitive), else the shipped default, else None."""
    for name, usd in (overrides or {}).items():
        if name.lower() == gpu_class.lower():
            return GPUPrice(gpu_class=gpu_class, usd_per_gpu_hour=usd,
                            source=f"{override_source} {name}={usd:g}")
    for name, price in default_prices().items():
        if name.lower() == gpu_class.lower():
            return price
    return None


__all__ = ["GPUPrice", "default_prices", "parse_overrides", "price_for"]
