"""The live figures of a canary and its stable revision, from vLLM's own metrics in Prometheus.

The PromQL is built here (pure, shown in docs and tested against a real Prometheus); the HTTP
call goes through the profiler's Prometheus client, so the same endpoint policy (allow-list,
TLS, bounded replies) applies. Shares within the SLO come from the histograms' bucket at or
below the SLO threshold (``alerts.slo_bucket``): ``increase(bucket{le=B}) / increase(count)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from kvtune.operator import vllm_metrics as vm
from kvtune.operator.alerts import le_string, slo_bucket
from kvtune.operator.canary_analysis import AnalysisSettings, RevisionFigures
from kvtune.operator.selectors import SeriesSelector

# A query function: PromQL in, the instant vector's samples out (Prometheus' JSON "result").
QueryFn = Callable[[str], list[dict[str, object]]]


def ttft_bound(ttft_seconds: float | None) -> float | None:
    if ttft_seconds is None:
        return None
    return slo_bucket(ttft_seconds, vm.TIME_TO_FIRST_TOKEN_BUCKETS)


def tpot_bound(tpot_seconds: float | None) -> float | None:
    if tpot_seconds is None:
        return None
    return slo_bucket(tpot_seconds, vm.INTER_TOKEN_LATENCY_BUCKETS)


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


def _scalar(result: list[dict[str, object]]) -> float | None:
    """The single sample of an aggregated instant vector; None when empty or not finite
    (a 0/0 share when no request finished)."""
    if len(result) != 1:
        return None
    value = result[0].get("value")
    if not isinstance(value, list) or len(value) != 2:
        return None
    try:
        number = float(value[1])
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def figures_from_results(results: Mapping[str, list[dict[str, object]]]) -> RevisionFigures:
    """One revision's figures from the answers to ``revision_queries``."""
    requests = max(0.0, _scalar(results.get("requests", [])) or 0.0)
    preemptions = max(0.0, _scalar(results.get("preemptions", [])) or 0.0)

    def share(name: str) -> float | None:
        v = _scalar(results.get(name, []))
        return None if v is None else min(1.0, max(0.0, v))

    return RevisionFigures(
        requests=requests,
        ttft_within_slo=share("ttft_within_slo"),
        tpot_within_slo=share("tpot_within_slo"),
        preemptions_per_request=preemptions / requests if requests > 0 else 0.0,
        kv_usage_mean=share("kv_usage_mean"),
        waiting_mean=_scalar(results.get("waiting_mean", [])),
    )


def read_revisions(query: QueryFn, stable: SeriesSelector, canary: SeriesSelector,
                   window_seconds: float,
                   settings: AnalysisSettings) -> tuple[RevisionFigures, RevisionFigures]:
    """(stable, canary) figures over the last ``window_seconds``."""

    def read(series: SeriesSelector) -> RevisionFigures:
        qs = revision_queries(series, window_seconds,
                              ttft_bound_seconds=settings.ttft_bound_seconds,
                              tpot_bound_seconds=settings.tpot_bound_seconds)
        return figures_from_results({name: query(promql) for name, promql in qs.items()})

    return read(stable), read(canary)
