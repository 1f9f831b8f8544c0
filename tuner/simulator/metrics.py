"""What one simulated configuration did: raw per-request times and a sampled time series,
and the summary figures the CLI, the planner and the README quote."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The first tenth of the arrival window is warm-up: requests there meet an empty engine.
WARMUP_FRACTION = 0.1
# A replica keeps up with a rate when its backlog of requests waiting for a first token grows
# by at most 2.5 % of the window's arrivals from the window's first half to its second
# (``SimResult.keeps_up``): overload is then overstated by at most ~5 %, whatever the
# stream's length.
KEEP_UP_SLACK = 0.025
_BACKLOG_SAMPLES = 64


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

    def _window(self, warmup_fraction: float) -> tuple[np.ndarray, float, float]:
        """The arrivals, and the steady-state window: after the warm-up, to the last
        arrival (the drain after it is left out)."""
        arr = np.asarray(self.arrival_seconds, dtype=float)
        first, last = float(arr.min()), float(arr.max())
        return arr, first + warmup_fraction * (last - first), last

    def judged(self, warmup_fraction: float = WARMUP_FRACTION) -> np.ndarray:
        """Which requests the attainment judges: those arriving after the warm-up."""
        arr, start, _ = self._window(warmup_fraction)
        return arr >= start

    def attainment(self, slo: SLOTargets, warmup_fraction: float = WARMUP_FRACTION
                   ) -> float:
        """The fraction of the steady-state requests that met ``slo`` (DistServe's SLO
        attainment): those arriving after the first ``warmup_fraction`` of the arrival window
        (an empty engine flatters the first requests); refused and unfinished requests are
        misses. A rate over first arrival to last finish is not the objective: a short
        stream's drain tail would count, and refusing long prompts would raise it."""
        if not self.arrival_seconds:
            return 0.0
        judged = self.judged(warmup_fraction)
        return float(self.per_request(slo).met_slo[judged].sum()) / int(judged.sum())

    def keeps_up(self, warmup_fraction: float = WARMUP_FRACTION,
                 slack: float = KEEP_UP_SLACK) -> bool:
        """Whether the engine keeps up with the arrivals in the steady-state window: the
        requests waiting for their first token do not pile up. A finite stream replayed
        faster than a replica serves it is a burst its queue absorbs: with a loose TTFT
        target the requests may still meet it, while on a longer stream the wait would grow
        without bound. Under overload the backlog grows linearly; the test compares its
        mean over the window's second half with its first half, and allows ``slack`` of the
        window's arrivals: (1 - service rate / arrival rate) / 2 <= slack, so a rate up to
        1 / (1 - 2 slack) of what the replica serves passes (5 % at the default)."""
        if not self.arrival_seconds:
            return False
        arr, start, end = self._window(warmup_fraction)
        if end <= start:
            return True  # one instant: no rate to keep up with
        first = np.asarray(self.first_token_seconds, dtype=float)
        served = ~np.isnan(first)  # refused requests never wait: they are misses already
        arrivals = np.sort(arr[served])
        firsts = np.sort(first[served])
        times = np.linspace(start, end, _BACKLOG_SAMPLES)
        backlog = (np.searchsorted(arrivals, times, side="right")
                   - np.searchsorted(firsts, times, side="right"))
        half = _BACKLOG_SAMPLES // 2
        growth = float(backlog[half:].mean() - backlog[:half].mean())
        arrived = int(((arr > start) & (arr <= end)).sum())
        return growth <= slack * max(arrived, 1)

    def summary(self, slo: SLOTargets | None = None) -> dict[str, Any]:
        """The figures per configuration (``kvtune simulate -o json``); seconds and rates.

        TTFT: arrival to the end of the step that computed the last prompt token (queueing
        included). TPOT: per request, (finish - first token) / (output tokens - 1), as vLLM's
        ``vllm:request_time_per_output_token_seconds``; percentiles are over requests.
        Throughput: completed requests (tokens) over first arrival to last finish. With
        ``slo``: ``slo_attainment``, in steady state (``attainment``)."""
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
        return {
            "slo": {"ttft_seconds": slo.ttft_seconds, "tpot_seconds": slo.tpot_seconds},
            "slo_attainment": self.attainment(slo),
        }

    def ttft_seconds(self) -> np.ndarray:
        fin = np.asarray(self.finish_seconds)
        done = ~np.isnan(fin)
        ttft: np.ndarray = (np.asarray(self.first_token_seconds)
                            - np.asarray(self.arrival_seconds))[done]
        return ttft
