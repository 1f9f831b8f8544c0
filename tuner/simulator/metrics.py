"""What one simulated configuration did: raw per-request times and a sampled time series,
and the summary figures the CLI, the planner and the README quote."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class SLOTargets:
    """Per-request targets (DistServe's goodput: a request counts when it meets both).
    ``None``: that target does not constrain."""

    ttft_seconds: float | None = None
    tpot_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class PerRequest:
    """Each request's outcome, in request order (NaN: never finished or not defined)."""

    arrival_seconds: np.ndarray
    ttft_seconds: np.ndarray  # NaN: rejected or never finished
    # (finish - first token) / (output tokens - 1); NaN with one output token (no gap).
    tpot_seconds: np.ndarray
    met_slo: np.ndarray  # bool: finished, TTFT and TPOT within their targets


@dataclass(slots=True)
class TimeSeries:
    """Sampled after every simulated step or run of decode steps (``time_seconds`` rises)."""

    time_seconds: list[float] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)  # fraction of usable blocks held
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    prefix_hit_rate: list[float] = field(default_factory=list)  # cumulative, tokens


@dataclass(slots=True)
class SimResult:
    """Raw outcome of one run. Times are simulated seconds since the first arrival."""

    name: str
    num_requests: int
    arrival_seconds: list[float]
    first_token_seconds: list[float]  # NaN: never finished (rejected)
    finish_seconds: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    rejected: int  # longer than max-model-len or than the whole KV cache
    preemptions: int
    # Tokens preempted requests found still cached when they resumed (not recomputed).
    resume_hit_tokens: int
    prefix_query_tokens: int  # prompt tokens looked up at first admission
    prefix_hit_tokens: int
    peak_running: int
    # Time-weighted means over the busy period (something running).
    mean_running: float
    mean_kv_usage: float
    # Allocated token slots that hold no token (paged: each sequence's last block's tail;
    # contiguous: the unused rest of each max-model-len reservation), time-weighted mean
    # and as a fraction of the allocated slots.
    mean_fragmented_tokens: float
    fragmentation_fraction: float
    kv_cache_tokens: int
    series: TimeSeries
    config: dict[str, Any] = field(default_factory=dict)
    # Prompt tokens loaded from the CPU tier (``--kv-offloading-size``) instead of computed.
    cpu_hit_tokens: int = 0

    def per_request(self, slo: SLOTargets | None = None) -> PerRequest:
        """Per request: TTFT, TPOT and whether it met ``slo`` (a request with one output
        token has no TPOT and meets that target; an unfinished one meets nothing)."""
        arr = np.asarray(self.arrival_seconds, dtype=float)
        first = np.asarray(self.first_token_seconds, dtype=float)
        fin = np.asarray(self.finish_seconds, dtype=float)
        outs = np.asarray(self.output_tokens)
        done = ~np.isnan(fin)
        ttft = np.where(done, first - arr, np.nan)
        gaps = np.maximum(outs - 1, 1)
        tpot = np.where(done & (outs > 1), (fin - first) / gaps, np.nan)
        met = done.copy()
        if slo is not None and slo.ttft_seconds is not None:
            met &= ttft <= slo.ttft_seconds
        if slo is not None and slo.tpot_seconds is not None:
            met &= np.isnan(tpot) | (tpot <= slo.tpot_seconds)
        return PerRequest(arrival_seconds=arr, ttft_seconds=ttft, tpot_seconds=tpot,
                          met_slo=met)

    def goodput(self, slo: SLOTargets) -> tuple[float, float]:
        """(requests per second that met ``slo``, fraction of requests that did). The rate
        is over the same span as the throughput (first arrival to last finish), so it is
        the arrival rate when every request meets its targets and the system keeps up."""
        met = int(self.per_request(slo).met_slo.sum())
        fin = np.asarray(self.finish_seconds, dtype=float)
        done = ~np.isnan(fin)
        span = float(fin[done].max() - min(self.arrival_seconds)) if done.any() else 0.0
        rate = met / span if span > 0 else 0.0
        return rate, (met / self.num_requests if self.num_requests else 0.0)

    def summary(self, slo: SLOTargets | None = None) -> dict[str, Any]:
        """The figures per configuration (``kvtune simulate -o json``); seconds and rates.

        TTFT: arrival to the end of the step that computed the last prompt token (queueing
        included). TPOT: per request, (finish - first token) / (output tokens - 1), as vLLM's
        ``vllm:request_time_per_output_token_seconds``; percentiles are over requests.
        Throughput: completed requests (tokens) over first arrival to last finish. With
        ``slo``: ``goodput_requests_per_second`` and ``slo_attainment`` (``goodput``)."""
        arr = np.asarray(self.arrival_seconds)
        first = np.asarray(self.first_token_seconds)
        fin = np.asarray(self.finish_seconds)
        outs = np.asarray(self.output_tokens)
        prompts = np.asarray(self.prompt_tokens)
        done = ~np.isnan(fin)
        n_done = int(done.sum())
        ttft = (first - arr)[done]
        multi = done & (outs > 1)
        tpot = ((fin - first)[multi] / (outs[multi] - 1)) if multi.any() else np.zeros(0)
        span = float(fin[done].max() - arr.min()) if n_done else 0.0

        def pct(x: np.ndarray, q: float) -> float:
            return float(np.percentile(x, q)) if x.size else float("nan")

        return {
            "name": self.name,
            "requests": self.num_requests,
            "completed": n_done,
            "rejected": self.rejected,
            "duration_seconds": span,
            "throughput_requests_per_second": n_done / span if span > 0 else 0.0,
            "throughput_output_tokens_per_second":
                float(outs[done].sum()) / span if span > 0 else 0.0,
            "throughput_tokens_per_second":
                float(outs[done].sum() + prompts[done].sum()) / span if span > 0 else 0.0,
            "ttft_p50_seconds": pct(ttft, 50),
            "ttft_p95_seconds": pct(ttft, 95),
            "ttft_p99_seconds": pct(ttft, 99),
            "tpot_p50_seconds": pct(tpot, 50),
            "tpot_p95_seconds": pct(tpot, 95),
            "tpot_p99_seconds": pct(tpot, 99),
            "preemptions": self.preemptions,
            "resume_hit_tokens": self.resume_hit_tokens,
            "prefix_hit_rate": (self.prefix_hit_tokens / self.prefix_query_tokens
                                if self.prefix_query_tokens else 0.0),
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "cpu_hit_tokens": self.cpu_hit_tokens,
            "peak_concurrent_sequences": self.peak_running,
            "mean_concurrent_sequences": self.mean_running,
            "mean_kv_usage": self.mean_kv_usage,
            "peak_kv_usage": max(self.series.kv_usage, default=0.0),
            "mean_fragmented_tokens": self.mean_fragmented_tokens,
            "fragmentation_fraction": self.fragmentation_fraction,
            "kv_cache_tokens": self.kv_cache_tokens,
            **(self._slo_figures(slo) if slo is not None else {}),
            **({"config": self.config} if self.config else {}),
        }

    def _slo_figures(self, slo: SLOTargets) -> dict[str, Any]:
        rate, attainment = self.goodput(slo)
        return {
            "slo": {"ttft_seconds": slo.ttft_seconds, "tpot_seconds": slo.tpot_seconds},
            "goodput_requests_per_second": rate,
            "slo_attainment": attainment,
        }

    def ttft_seconds(self) -> np.ndarray:
        fin = np.asarray(self.finish_seconds)
        done = ~np.isnan(fin)
        ttft: np.ndarray = (np.asarray(self.first_token_seconds)
                            - np.asarray(self.arrival_seconds))[done]
        return ttft
