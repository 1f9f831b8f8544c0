"""Per pool, the share of prompt tokens each KV tier supplied over the retune timer's window
(vLLM's prompt tokens by source, ``operator/prometheus/reuse_window.py``), beside what the
plan's capacity search predicted (``status.pools[].reuse``). Pure.

A pool without its own series is read on the deployment's series only when it is the only
pool (as the observed SLO): another pool's traffic would be counted as its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvtune.operator.api import ObservedReuseStatus, PoolStatus, ProfileScope, TierHitRatesStatus
from kvtune.operator.prometheus.profiling import ProfileResult
from kvtune.operator.prometheus.reuse_window import TierHitRates


def rates_status(rates: TierHitRates | None) -> TierHitRatesStatus | None:
    if rates is None:
        return None
    return TierHitRatesStatus(prompt_tokens=round(rates.prompt_tokens), device=rates.device,
                              host=rates.host, disk=rates.disk, p2p=rates.p2p,
                              external=rates.external)


def observed_reuse(pools: Sequence[str], previous: Sequence[PoolStatus],
                   own: Mapping[str, ProfileResult], wide: ProfileResult, at: str
                   ) -> dict[str, ObservedReuseStatus]:
    """Each pool's observed tier shares (absent: no by-source counts for it)."""
    prev = {p.name: p for p in previous}
    out: dict[str, ObservedReuseStatus] = {}
    for name in pools:
        source = own.get(name) or (wide if len(pools) == 1 else None)
        seen = rates_status(source.observed.tier_hit_rates) if source is not None else None
        if source is None or seen is None:
            continue
        scope: ProfileScope = "pool" if name in own else "deployment"
        predicted = prev[name].reuse if name in prev else None
        out[name] = ObservedReuseStatus(
            at=at, window_seconds=source.observed.window_seconds, scope=scope, observed=seen,
            predicted_gpu_prefix_hit_rate=predicted.gpu_prefix_hit_rate if predicted else None,
            predicted_cpu_prefix_hit_rate=predicted.cpu_prefix_hit_rate if predicted else None)
    return out


__all__ = ["observed_reuse", "rates_status"]
