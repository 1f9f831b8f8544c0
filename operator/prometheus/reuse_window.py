"""KV reuse in one profiling window: vLLM 0.33's ``--kv-cache-metrics`` histograms and its
prompt tokens by source, read into the profile's reuse fields and the observed hit rate of
each tier.

What vLLM exports (``vllm/v1/core/kv_cache_metrics.py``, ``vllm/v1/metrics/loggers.py``):

- ``vllm:kv_block_reuse_gap_seconds``: for a sample of the GPU pool's blocks (``--kv-cache-
  metrics-sample``), the seconds between consecutive prefix-cache hits on the block, recorded
  when the block is evicted. A block's history ends at its eviction, so every gap here is one
  the GPU cache *caught*: the distribution is cut off at the GPU's retention and says nothing
  of the reuses that came back after eviction, which are the ones a CPU tier would catch.
- ``vllm:kv_block_idle_before_evict_seconds``: how long an evicted block sat unused, the GPU
  cache's retention under this traffic.
- ``vllm:prompt_tokens_cached_by_source{source=device|host|disk|p2p|external_unspecified}``
  and ``vllm:prompt_tokens_by_source{source=local_compute|local_cache_hit|
  external_kv_transfer}``: where each prompt token's KV came from.

**No reuse distance from these gaps.** A gap becomes a distance (distinct tokens in between)
at the rate new blocks enter the cache, but the gaps are censored at the GPU's retention: the
distances made from them are all within the GPU cache, which the tier sizing already skips
(``tuner/planner/decide_offload_size.py``), and their quantiles are lower bounds that would
read as the full distribution. So a profile from Prometheus carries the gaps and the idle
time (in ``notes`` too, with the censoring said), and no ``prefix_reuse_distance_tokens``:
the operator's tier stays at the policy's budget unless a trace gives the distances, and the
observed host hit rate (below) shows whether the tier it runs pays.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from kvtune.operator.prometheus import histograms
from kvtune.operator.prometheus import prom_replies as replies
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.tuner.workload import SecondsQuantiles

Buckets = list[tuple[float, float]]

# vLLM's own default (``ObservabilityConfig.kv_cache_metrics_sample``): 1 % of the GPU pool's
# blocks are followed, enough for quantiles over a profiling window (a pool evicting 100
# blocks a second gives ~3,600 samples an hour) at a cost the vLLM authors chose as default.
KV_CACHE_METRICS_SAMPLE = 0.01


def vllm_flags() -> list[str]:
    """The ``vllm serve`` flags that turn the residency histograms on (every pool the
    operator renders: its profiling reads them)."""
    return ["--kv-cache-metrics", f"--kv-cache-metrics-sample={KV_CACHE_METRICS_SAMPLE:g}"]


class TierHitRates(BaseModel):
    """Observed: the share of prompt tokens whose KV each tier supplied (None: no prompt
    tokens counted). ``device``: the GPU's prefix cache; ``host``: the CPU tier; ``disk``,
    ``p2p`` and ``external`` (a connector that does not say which tier)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: float
    device: float
    host: float
    disk: float
    p2p: float
    external: float


def queries(series: str, window: str) -> dict[str, str]:
    """The window's reuse queries, by name (``series``: a PromQL label selector)."""

    def buckets(hist: str) -> str:
        return vm.window_buckets(hist, series, window)

    def by_source(counter: str) -> str:
        return f"sum by (source) (increase({vm.counter(counter)}{series}[{window}]))"

    return {
        "reuse_gap_buckets": buckets(vm.KV_BLOCK_REUSE_GAP),
        "idle_before_evict_buckets": buckets(vm.KV_BLOCK_IDLE_BEFORE_EVICT),
        "prompt_tokens_by_source": by_source(vm.PROMPT_TOKENS_BY_SOURCE),
        "prompt_tokens_cached_by_source": by_source(vm.PROMPT_TOKENS_CACHED_BY_SOURCE),
    }


def by_source(samples: list[replies.Sample], name: str) -> dict[str, float]:
    """``sum by (source)`` samples -> {source: tokens} (NaN: 0)."""
    out: dict[str, float] = {}
    for s in samples:
        source = s.metric.get("source")
        if source is None:
            raise replies.PrometheusDataInvalid(f"query {name}: a sample without its source")
        if s.value < 0:
            raise replies.PrometheusDataInvalid(f"query {name}: a negative count")
        out[source] = 0.0 if math.isnan(s.value) else s.value
    return out


def seconds_quantiles(buckets: Buckets) -> SecondsQuantiles | None:
    """p50, p90, p99 and the largest value's bound of a residency histogram (None: empty).
    In the +Inf bucket a quantile reads as the last finite bound (at least that long)."""
    if not buckets or histograms.total_count(buckets) <= 0:
        return None
    top = max(b for b, _ in buckets if math.isfinite(b))
    est = [histograms.estimate_quantile(q, buckets).estimate for q in (0.5, 0.9, 0.99)]
    highest = histograms.highest_nonempty_bound(buckets)
    p50, p90, p99 = (round(min(e, top), 3) for e in est)
    return SecondsQuantiles(p50=p50, p90=max(p50, p90), p99=max(p50, p90, p99),
                            max=max(p99, round(min(highest, top), 3)),
                            count=round(histograms.total_count(buckets)))


def tier_hit_rates(prompt_by_source: dict[str, float], cached_by_source: dict[str, float]
                   ) -> TierHitRates | None:
    """The observed share of prompt tokens each tier supplied (None: no prompt tokens)."""
    prompt = sum(prompt_by_source.get(s, 0.0) for s in vm.PROMPT_TOKEN_SOURCES)
    if prompt <= 0:
        return None

    def share(source: str) -> float:
        return round(min(1.0, cached_by_source.get(source, 0.0) / prompt), 4)

    return TierHitRates(prompt_tokens=round(prompt), device=share("device"),
                        host=share("host"), disk=share("disk"), p2p=share("p2p"),
                        external=share("external_unspecified"))


def notes(gap: SecondsQuantiles | None, idle: SecondsQuantiles | None) -> tuple[str, ...]:
    """What the profile's reuse figures are, for its notes."""
    out: list[str] = []
    if gap is not None:
        out.append(f"prefix reuse gaps (vllm:kv_block_reuse_gap_seconds, {gap.count} sampled): "
                   f"p50 {gap.p50:g}s, p90 {gap.p90:g}s, p99 {gap.p99:g}s; only reuses the "
                   f"GPU cache caught (a block's history ends at its eviction), so no reuse "
                   f"distance is made from them and a CPU tier is sized at the budget")
    if idle is not None:
        out.append(f"GPU cache retention (vllm:kv_block_idle_before_evict_seconds): p50 "
                   f"{idle.p50:g}s, p90 {idle.p90:g}s idle before eviction")
    return tuple(out)


__all__ = ["KV_CACHE_METRICS_SAMPLE", "TierHitRates", "by_source", "notes", "queries",
           "seconds_quantiles", "tier_hit_rates", "vllm_flags"]
