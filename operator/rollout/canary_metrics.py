"""The live figures of a canary and its stable revision, from vLLM's own metrics in Prometheus.

The PromQL is built here (pure, shown in docs and tested against a real Prometheus); the HTTP
call goes through the profiler's Prometheus client, so the same endpoint policy (allow-list,
TLS, bounded replies) applies. Shares within the SLO come from the histograms' bucket at the
SLO threshold where the pods render it (``slo_buckets``), else the bucket at or below it:
``increase(bucket{le=B}) / increase(count)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from kvtune.operator.prometheus import slo_buckets
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.operator.prometheus.alerts import le_string
from kvtune.operator.prometheus.selectors import SeriesSelector
from kvtune.operator.rollout.canary_analysis import AnalysisSettings, RevisionFigures

# A query function: (name, PromQL) -> the aggregate's one number, or None when there is no
# data (an empty vector, or NaN: 0/0 when no request finished). It raises
# PrometheusUnavailable when Prometheus cannot be asked or answers what kvtune does not trust.
QueryFn = Callable[[str, str], float | None]


def ttft_bound(ttft_seconds: float | None, rendered: bool = False) -> float | None:
    """The ``le`` the TTFT target is read at: itself where the pods render kvtune's SLO
    buckets (``slo_buckets``), else vLLM's default bound at or below it."""
    if ttft_seconds is None:
        return None
    return slo_buckets.slo_bound(ttft_seconds, slo_buckets.TTFT_FAMILY, rendered).bound_seconds


def tpot_bound(tpot_seconds: float | None, rendered: bool = False) -> float | None:
    if tpot_seconds is None:
        return None
    return slo_buckets.slo_bound(tpot_seconds, slo_buckets.TPOT_FAMILY, rendered).bound_seconds


def revision_queries(series: SeriesSelector, window_seconds: float, *,
                     ttft_bound_seconds: float | None,
                     tpot_bound_seconds: float | None) -> dict[str, str]:
    """The PromQL for one revision's window, by name."""
    s, w = series.promql(), f"{max(1, int(window_seconds))}s"

    def inc(name: str) -> str:
        return f"sum(increase({name}{s}[{w}]))"

    def within(hist: str, bound: float) -> str:
        # Prometheus' label matcher takes the le string exactly as the client wrote it.
        le = SeriesSelector(equal={**series.equal, "le": le_string(bound)},
                            regex=series.regex).promql()
        return (f"sum(increase({hist}_bucket{le}[{w}])) / "
                f"sum(increase({hist}_count{s}[{w}]))")

    out = {
        "requests": inc(vm.counter(vm.REQUEST_SUCCESS)),
        "preemptions": inc(vm.counter(vm.NUM_PREEMPTIONS)),
        "kv_usage_mean": f"avg(avg_over_time({vm.KV_CACHE_USAGE_PERC}{s}[{w}]))",
        "waiting_mean": f"avg(avg_over_time({vm.NUM_REQUESTS_WAITING}{s}[{w}]))",
    }
    if ttft_bound_seconds is not None:
        out["ttft_within_slo"] = within(vm.TIME_TO_FIRST_TOKEN, ttft_bound_seconds)
    if tpot_bound_seconds is not None:
        out["tpot_within_slo"] = within(vm.TIME_PER_OUTPUT_TOKEN, tpot_bound_seconds)
    return out


def figures(values: Mapping[str, float | None]) -> RevisionFigures:
    """One revision's figures from the answers to ``revision_queries``."""
    requests = max(0.0, values.get("requests") or 0.0)
    preemptions = max(0.0, values.get("preemptions") or 0.0)

    def share(name: str) -> float | None:
        v = values.get(name)
        return None if v is None or not math.isfinite(v) else min(1.0, max(0.0, v))

    return RevisionFigures(
        requests=requests,
        ttft_within_slo=share("ttft_within_slo"),
        tpot_within_slo=share("tpot_within_slo"),
        preemptions_per_request=preemptions / requests if requests > 0 else 0.0,
        kv_usage_mean=share("kv_usage_mean"),
        waiting_mean=values.get("waiting_mean"),
    )


def read_revisions(query: QueryFn, stable: SeriesSelector, canary: SeriesSelector,
                   window_seconds: float,
                   settings: AnalysisSettings) -> tuple[RevisionFigures, RevisionFigures]:
    """(stable, canary) figures over the last ``window_seconds``."""

    def read(series: SeriesSelector) -> RevisionFigures:
        qs = revision_queries(series, window_seconds,
                              ttft_bound_seconds=settings.ttft_bound_seconds,
                              tpot_bound_seconds=settings.tpot_bound_seconds)
        return figures({name: query(name, promql) for name, promql in qs.items()})

    return read(stable), read(canary)


def read_judgeable(query: QueryFn, stable: SeriesSelector, canary: SeriesSelector,
                   window_seconds: float, settings: AnalysisSettings
                   ) -> tuple[RevisionFigures, RevisionFigures, AnalysisSettings]:
    """``read_revisions`` at the SLO's own bucket bound; where a revision that served requests
    has no series at that bound (its pods were rendered before kvtune rendered the SLO
    buckets, or by a template that drops the flag), both revisions again at vLLM's default
    bound at or below the target: the two are judged at one bound, the stricter one, and the
    settings returned say which (the verdict's message names it)."""
    figs = read_revisions(query, stable, canary, window_seconds, settings)

    def missing(field: str) -> bool:
        return any(f.requests > 0 and getattr(f, field) is None for f in figs)

    fallback: dict[str, float | None] = {}
    if missing("ttft_within_slo") and settings.ttft_slo_seconds is not None:
        fallback["ttft_bound_seconds"] = ttft_bound(settings.ttft_slo_seconds)
    if missing("tpot_within_slo") and settings.tpot_slo_seconds is not None:
        fallback["tpot_bound_seconds"] = tpot_bound(settings.tpot_slo_seconds)
    fallback = {k: v for k, v in fallback.items() if v != getattr(settings, k)}
    if not fallback:
        return figs[0], figs[1], settings
    lower = settings.model_copy(update=fallback)
    again = read_revisions(query, stable, canary, window_seconds, lower)
    return again[0], again[1], lower
