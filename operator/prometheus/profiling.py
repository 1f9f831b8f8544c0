"""What the traffic really is: PromQL over vLLM's own metrics in a window -> WorkloadProfile.

Two halves: ``query_window`` (the edge: instant queries, guarded and checked) reads
a ``RawWindow`` of plain numbers; ``build_profile`` (pure) turns it into a ``ProfileResult``:
the ``WorkloadProfile`` the planner takes (``source="prometheus"``), the observed figures
around it, and whether it can be trusted. A window with fewer than ``min_requests`` finished
requests is not trusted: the caller keeps the declared workload and says so in status.

Context length is vLLM's ``vllm:request_prompt_tokens`` (the prompt, what the KV cache holds
before the first output token); output is ``vllm:request_generation_tokens``. Both have coarse
1-2-5 buckets, so every quantile comes with the bucket it lies in
(``operator/prometheus/histograms.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvtune.operator.prometheus import histograms, prom_http, reuse_window
from kvtune.operator.prometheus import prom_replies as replies
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.operator.prometheus.histograms import QuantileEstimate
from kvtune.operator.prometheus.prom_http import PrometheusAccess
from kvtune.operator.prometheus.selectors import SeriesSelector
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)

Buckets = list[tuple[float, float]]


class ProfilingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    window_seconds: float = Field(gt=0)
    # Fewer finished requests than this in the window: the profile is not trusted.
    min_requests: int = Field(default=200, ge=1)
    # Label matchers selecting the series, e.g. {"model_name": "llama"} (label="value") and
    # {"pod": "llama-h200-.*"} (label=~"regex"); operator/prometheus/selectors.py builds them.
    selector: dict[str, str] = Field(default_factory=dict)
    selector_regex: dict[str, str] = Field(default_factory=dict)
    # The running max_model_len: values in the +Inf bucket are at most this.
    max_model_len_tokens: int | None = Field(default=None, gt=0)

    @classmethod
    def for_series(cls, series: SeriesSelector, **kw: object) -> ProfilingSettings:
        return cls.model_validate({"selector": series.equal, "selector_regex": series.regex,
                                   **kw})

    def series(self) -> SeriesSelector:
        return SeriesSelector(equal=self.selector, regex=self.selector_regex)


class RawWindow(BaseModel):
    """The numbers one window of PromQL returns; NaN/None where there was no data."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_seconds: float
    at_unix_seconds: float
    requests: float
    prompt_buckets: Buckets
    output_buckets: Buckets
    ttft_buckets: Buckets
    tpot_buckets: Buckets
    prefix_cache_queries: float
    prefix_cache_hits: float
    kv_cache_usage_mean: float | None
    kv_cache_usage_max: float | None
    preemptions: float
    waiting_mean: float | None
    num_gpu_blocks: tuple[int, ...] = ()
    block_size: int | None = None
    # ``--kv-cache-metrics`` and prompt tokens by source (``reuse_window``): [] / {} when the
    # pods export none.
    reuse_gap_buckets: Buckets = []
    idle_before_evict_buckets: Buckets = []
    prompt_tokens_by_source: dict[str, float] = {}
    prompt_tokens_cached_by_source: dict[str, float] = {}


class LatencyQuantiles(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    p50_seconds: float | None = None
    p95_seconds: float | None = None
    p99_seconds: float | None = None


class ObservedFigures(BaseModel):
    """Everything the window showed, for status and for comparing with the plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_seconds: float
    at_unix_seconds: float
    requests: int
    request_rate_per_second: float
    prefix_hit_rate: float | None
    kv_cache_usage_mean: float | None
    kv_cache_usage_max: float | None
    preemptions_per_second: float
    waiting_mean: float | None
    ttft: LatencyQuantiles
    tpot: LatencyQuantiles
    num_gpu_blocks: tuple[int, ...] = ()
    block_size: int | None = None
    context_quantiles: tuple[QuantileEstimate, ...] = ()
    output_quantiles: tuple[QuantileEstimate, ...] = ()
    # The latency histograms themselves: the share within an SLO target is read from them
    # (operator/retune/slo_observed.py).
    ttft_buckets: Buckets = []
    tpot_buckets: Buckets = []
    # The share of prompt tokens each KV tier supplied (None: no by-source counts).
    tier_hit_rates: reuse_window.TierHitRates | None = None


class ProfileResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    trusted: bool
    reason: str  # CamelCase: "Observed", "TooFewRequests", "NoData"
    message: str
    profile: WorkloadProfile | None
    observed: ObservedFigures


def _quantiles(buckets: Buckets, cap: float | None) -> tuple[QuantileEstimate, ...]:
    return tuple(histograms.estimate_quantile(q, buckets, cap) for q in QUANTILES)


def _latency(buckets: Buckets) -> LatencyQuantiles:
    if not buckets or histograms.total_count(buckets) <= 0:
        return LatencyQuantiles()
    est = {q: histograms.estimate_quantile(q, buckets).estimate for q in (0.5, 0.95, 0.99)}
    return LatencyQuantiles(p50_seconds=est[0.5], p95_seconds=est[0.95], p99_seconds=est[0.99])


def _token_quantiles(est: tuple[QuantileEstimate, ...], max_tokens: float) -> TokenQuantiles:
    by_q = {e.q: max(0, round(e.estimate)) for e in est}
    top = max(by_q.values())
    return TokenQuantiles(p50=by_q[0.5], p90=by_q[0.9], p95=by_q[0.95], p99=by_q[0.99],
                          max=max(top, round(max_tokens)) if math.isfinite(max_tokens) else top)


def _describe(name: str, est: tuple[QuantileEstimate, ...]) -> str:
    parts = []
    for e in est:
        upper = "inf" if math.isinf(e.upper) else f"{e.upper:.0f}"
        parts.append(f"p{round(e.q * 100)}~{e.estimate:.0f} in [{e.lower:.0f}, {upper}] "
                     f"(histogram_quantile {e.histogram_quantile:.0f})")
    return f"{name}: " + ", ".join(parts)


def _describe_series(settings: ProfilingSettings) -> str:
    return settings.series().promql() if settings.selector or settings.selector_regex \
        else "all series"


def build_profile(raw: RawWindow, settings: ProfilingSettings) -> ProfileResult:
    """The pure half: a RawWindow -> trusted profile or a reason why not."""
    cap = float(settings.max_model_len_tokens) if settings.max_model_len_tokens else None
    requests = max(0, round(raw.requests))
    hit_rate = (raw.prefix_cache_hits / raw.prefix_cache_queries
                if raw.prefix_cache_queries > 0 else None)
    have_lengths = (bool(raw.prompt_buckets) and histograms.total_count(raw.prompt_buckets) > 0
                    and bool(raw.output_buckets)
                    and histograms.total_count(raw.output_buckets) > 0)
    ctx = _quantiles(raw.prompt_buckets, cap) if have_lengths else ()
    out = _quantiles(raw.output_buckets, cap) if have_lengths else ()
    observed = ObservedFigures(
        window_seconds=raw.window_seconds, at_unix_seconds=raw.at_unix_seconds,
        requests=requests, request_rate_per_second=raw.requests / raw.window_seconds,
        prefix_hit_rate=None if hit_rate is None else min(1.0, max(0.0, hit_rate)),
        kv_cache_usage_mean=raw.kv_cache_usage_mean, kv_cache_usage_max=raw.kv_cache_usage_max,
        preemptions_per_second=raw.preemptions / raw.window_seconds,
        waiting_mean=raw.waiting_mean, ttft=_latency(raw.ttft_buckets),
        tpot=_latency(raw.tpot_buckets), num_gpu_blocks=raw.num_gpu_blocks,
        block_size=raw.block_size, context_quantiles=ctx, output_quantiles=out,
        ttft_buckets=raw.ttft_buckets, tpot_buckets=raw.tpot_buckets,
        tier_hit_rates=reuse_window.tier_hit_rates(raw.prompt_tokens_by_source,
                                                   raw.prompt_tokens_cached_by_source),
    )
    window = f"{raw.window_seconds:.0f}s"
    if not have_lengths:
        return ProfileResult(
            trusted=False, reason="NoData", profile=None, observed=observed,
            message=f"no finished requests in the last {window} for "
                    f"{_describe_series(settings)}; the declared workload stays",
        )
    if requests < settings.min_requests:
        return ProfileResult(
            trusted=False, reason="TooFewRequests", profile=None, observed=observed,
            message=f"{requests} requests in the last {window}, fewer than "
                    f"min_requests={settings.min_requests}; the declared workload stays",
        )
    gap = reuse_window.seconds_quantiles(raw.reuse_gap_buckets)
    idle = reuse_window.seconds_quantiles(raw.idle_before_evict_buckets)
    notes = (
        _describe("context tokens", ctx),
        _describe("output tokens", out),
        "quantiles interpolated log-linearly inside vLLM's 1-2-5 buckets; the true value "
        "lies in the bracket",
        *reuse_window.notes(gap, idle),
    )
    mean_cached = raw.prefix_cache_hits / requests if requests else 0.0
    profile = WorkloadProfile(
        source="prometheus",
        context_tokens=_token_quantiles(
            ctx, histograms.highest_nonempty_bound(raw.prompt_buckets, cap)),
        output_tokens=_token_quantiles(
            out, histograms.highest_nonempty_bound(raw.output_buckets, cap)),
        # vLLM does not export the shared prefix itself; the mean cached tokens per request
        # is what the prefix cache actually saved, a lower bound on what is shared.
        shared_prefix_tokens=max(0, round(mean_cached)),
        prefix_hit_rate=observed.prefix_hit_rate,
        request_rate_per_second=observed.request_rate_per_second,
        requests=requests, window_seconds=raw.window_seconds, notes=notes,
        # Reuse gaps the GPU caught and its retention; no distance (reuse_window's doc).
        prefix_reuse_gap_seconds=gap, kv_block_idle_before_evict_seconds=idle,
    )
    return ProfileResult(
        trusted=True, reason="Observed", profile=profile, observed=observed,
        message=f"{requests} requests in the last {window}: context p50 "
                f"{profile.context_tokens.p50}, p99 {profile.context_tokens.p99} tokens; "
                f"prefix hit rate {'n/a' if hit_rate is None else f'{hit_rate:.2f}'}",
    )


class PoolProfile(BaseModel):
    """The profile one pool is planned on: its own series' when trusted, else the
    deployment-wide one (``scope`` says which), else none (the plan stays)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: WorkloadProfile | None
    scope: Literal["pool", "deployment"]
    requests: int | None  # behind the pool's own series (None: not queried)
    message: str


def choose_for_pool(pool: str, own: ProfileResult | None,
                    deployment: ProfileResult) -> PoolProfile:
    """Pure: the pool's own profile if it can be trusted, else the deployment-wide one."""
    wide = deployment.profile if deployment.trusted else None
    if own is None:
        return PoolProfile(profile=wide, scope="deployment", requests=None,
                           message=f"pool {pool}: no per-pool series (poolSelector: none); "
                                   f"deployment-wide: {deployment.message}")
    if own.trusted and own.profile is not None:
        return PoolProfile(profile=own.profile, scope="pool", requests=own.observed.requests,
                           message=f"pool {pool}: {own.message}")
    why = own.message.removesuffix("; the declared workload stays")
    if wide is not None:
        return PoolProfile(profile=wide, scope="deployment", requests=own.observed.requests,
                           message=f"pool {pool}: {why}; planned on the deployment-wide "
                                   f"profile ({wide.requests} requests)")
    return PoolProfile(profile=None, scope="deployment", requests=own.observed.requests,
                       message=f"pool {pool}: {why}; deployment-wide: {deployment.message}")


# --- the edge: PromQL over HTTP (operator/prometheus/prom_http.py), every reply checked -----------


def render_selector(labels: Mapping[str, str],
                    regex: Mapping[str, str] | None = None) -> str:
    return SeriesSelector(equal=dict(labels), regex=dict(regex or {})).promql()


def queries(selector: Mapping[str, str] | SeriesSelector,
            window_seconds: float) -> dict[str, str]:
    """The PromQL behind one window, by name (shown in docs and used by the tests)."""
    series = selector if isinstance(selector, SeriesSelector) \
        else SeriesSelector(equal=dict(selector))
    s, w = series.promql(), f"{int(window_seconds)}s"
    # vllm:cache_config_info has no model_name label (its labels are CacheConfig's fields
    # and engine), so only the target labels (namespace, pod ...) can select it.
    info_s = series.without("model_name").promql()

    def inc(counter: str) -> str:
        return f"sum(increase({vm.counter(counter)}{s}[{w}]))"

    def buckets(hist: str) -> str:
        return vm.window_buckets(hist, s, w)

    return {
        "requests": inc(vm.REQUEST_SUCCESS),
        "prompt_buckets": buckets(vm.REQUEST_PROMPT_TOKENS),
        "output_buckets": buckets(vm.REQUEST_GENERATION_TOKENS),
        "ttft_buckets": buckets(vm.TIME_TO_FIRST_TOKEN),
        "tpot_buckets": buckets(vm.TIME_PER_OUTPUT_TOKEN),
        "prefix_cache_queries": inc(vm.PREFIX_CACHE_QUERIES),
        "prefix_cache_hits": inc(vm.PREFIX_CACHE_HITS),
        "kv_cache_usage_mean": f"avg(avg_over_time({vm.KV_CACHE_USAGE_PERC}{s}[{w}]))",
        "kv_cache_usage_max": f"max(max_over_time({vm.KV_CACHE_USAGE_PERC}{s}[{w}]))",
        "preemptions": inc(vm.NUM_PREEMPTIONS),
        "waiting_mean": f"avg(avg_over_time({vm.NUM_REQUESTS_WAITING}{s}[{w}]))",
        "cache_config": f"max by (num_gpu_blocks, block_size) "
                        f"(last_over_time({vm.CACHE_CONFIG_INFO}{info_s}[{w}]))",
        **reuse_window.queries(s, w),
    }


def query_window(url: str, settings: ProfilingSettings,
                 at_unix_seconds: float | None = None,
                 access: PrometheusAccess | None = None) -> RawWindow:
    """Run the window's queries against Prometheus at ``url`` (allow-listed, TLS verified,
    bounded: ``operator/prometheus/prom_http.py``), every reply checked
    (``operator/prometheus/prom_replies.py``).
    PrometheusUnavailable on any failure; PrometheusDataInvalid (a subclass) when the
    replies are not data kvtune trusts."""
    access = access if access is not None else access_from_env()
    at = time.time() if at_unix_seconds is None else at_unix_seconds
    samples: dict[str, list[replies.Sample]] = {}
    for name, promql in queries(settings.series(), settings.window_seconds).items():
        data = prom_http.query(url, promql, at_unix_seconds=at, access=access, name=name)
        samples[name] = replies.vector(data, name)
    blocks: list[int] = []
    block_size: int | None = None
    for sample in samples["cache_config"]:
        try:
            blocks.append(int(sample.metric["num_gpu_blocks"]))
            block_size = int(sample.metric["block_size"])
        except (KeyError, ValueError):
            continue  # "None" before the engine sized its cache
    try:
        return RawWindow(
            window_seconds=settings.window_seconds, at_unix_seconds=at,
            requests=replies.scalar(samples["requests"], "requests") or 0.0,
            prompt_buckets=replies.buckets(samples["prompt_buckets"], "prompt_buckets"),
            output_buckets=replies.buckets(samples["output_buckets"], "output_buckets"),
            ttft_buckets=replies.buckets(samples["ttft_buckets"], "ttft_buckets"),
            tpot_buckets=replies.buckets(samples["tpot_buckets"], "tpot_buckets"),
            prefix_cache_queries=replies.scalar(samples["prefix_cache_queries"],
                                                "prefix_cache_queries") or 0.0,
            prefix_cache_hits=replies.scalar(samples["prefix_cache_hits"],
                                             "prefix_cache_hits") or 0.0,
            kv_cache_usage_mean=replies.scalar(samples["kv_cache_usage_mean"],
                                               "kv_cache_usage_mean"),
            kv_cache_usage_max=replies.scalar(samples["kv_cache_usage_max"],
                                              "kv_cache_usage_max"),
            preemptions=replies.scalar(samples["preemptions"], "preemptions") or 0.0,
            waiting_mean=replies.scalar(samples["waiting_mean"], "waiting_mean"),
            num_gpu_blocks=tuple(sorted(blocks)), block_size=block_size,
            reuse_gap_buckets=_residency(samples, "reuse_gap_buckets"),
            idle_before_evict_buckets=_residency(samples, "idle_before_evict_buckets"),
            prompt_tokens_by_source=reuse_window.by_source(
                samples["prompt_tokens_by_source"], "prompt_tokens_by_source"),
            prompt_tokens_cached_by_source=reuse_window.by_source(
                samples["prompt_tokens_cached_by_source"], "prompt_tokens_cached_by_source"),
        )
    except replies.PrometheusDataInvalid as exc:
        raise replies.PrometheusDataInvalid(f"prometheus {prom_http.shown_url(url)}: {exc}"
                                            ) from exc


def _residency(samples: dict[str, list[replies.Sample]], name: str) -> Buckets:
    """A ``--kv-cache-metrics`` histogram's buckets; [] when the pods export none or it
    counted nothing (an engine that evicted no sampled block yet)."""
    if not samples[name]:
        return []
    got = replies.buckets(samples[name], name)
    return got if histograms.total_count(got) > 0 else []


def access_from_env() -> PrometheusAccess:
    try:
        return PrometheusAccess.from_env()
    except ValueError as exc:  # the operator's own configuration is wrong
        raise prom_http.PrometheusNotAllowed(f"the operator's Prometheus configuration: {exc}"
                                             ) from exc


def profile_from_prometheus(url: str, settings: ProfilingSettings,
                            at_unix_seconds: float | None = None,
                            access: PrometheusAccess | None = None) -> ProfileResult:
    raw = query_window(url, settings, at_unix_seconds, access)
    try:
        return build_profile(raw, settings)
    except ValueError as exc:  # figures no profile can be made of (pydantic's checks)
        first = str(exc).splitlines()[0][:160]
        raise replies.PrometheusDataInvalid(f"prometheus {prom_http.shown_url(url)}: the "
                                            f"window's figures make no profile ({first})"
                                            ) from exc
