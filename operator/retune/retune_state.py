"""The retune timer's state and figures as typed status, and back.

The dwell and min-interval clocks (``retune.RetuneState``) live in
``status.profile.retune.pools[].state``; being typed (``api.RetuneStateStatus``), every
status write keeps them, so a reconcile or a rollout cannot reset them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kvtune.operator.api import (
    CandidateProfileStatus,
    InferenceDeploymentStatus,
    ObservedStatus,
    QuantileEstimateStatus,
    RetuneStateStatus,
    TokenQuantilesStatus,
)
from kvtune.operator.api.workloads import reuse_from_status, reuse_status_fields
from kvtune.operator.prometheus.histograms import QuantileEstimate
from kvtune.operator.prometheus.profiling import ObservedFigures
from kvtune.operator.retune import reuse_observed
from kvtune.operator.retune.decide import RetuneState
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile


def finite(x: float | None) -> float | None:
    """JSON has no infinities; a figure that is not finite is left out."""
    return None if x is None or not math.isfinite(x) else round(x, 6)


def _quantiles(estimates: Iterable[QuantileEstimate]) -> list[QuantileEstimateStatus]:
    return [QuantileEstimateStatus(q=e.q, estimate=round(e.estimate), lower=finite(e.lower),
                                   upper=finite(e.upper),
                                   histogram_quantile=finite(e.histogram_quantile))
            for e in estimates if math.isfinite(e.estimate)]


def observed_status(obs: ObservedFigures) -> ObservedStatus:
    """The window's figures as status."""
    return ObservedStatus(
        window_seconds=obs.window_seconds, requests=obs.requests,
        request_rate_per_second=finite(obs.request_rate_per_second),
        prefix_hit_rate=finite(obs.prefix_hit_rate),
        kv_cache_usage_mean=finite(obs.kv_cache_usage_mean),
        kv_cache_usage_max=finite(obs.kv_cache_usage_max),
        preemptions_per_second=finite(obs.preemptions_per_second),
        waiting_mean=finite(obs.waiting_mean),
        ttft_p95_seconds=finite(obs.ttft.p95_seconds),
        tpot_p95_seconds=finite(obs.tpot.p95_seconds),
        num_gpu_blocks=list(obs.num_gpu_blocks),
        context_tokens=_quantiles(obs.context_quantiles),
        output_tokens=_quantiles(obs.output_quantiles),
        tier_hit_rates=reuse_observed.rates_status(obs.tier_hit_rates),
    )


def _tokens_status(q: TokenQuantiles) -> TokenQuantilesStatus:
    return TokenQuantilesStatus.model_validate(q.model_dump())


def state_status(state: RetuneState) -> RetuneStateStatus:
    cand = state.candidate
    return RetuneStateStatus(
        drift_since_seconds=state.drift_since_seconds,
        stable_since_seconds=state.stable_since_seconds,
        last_rollout_seconds=state.last_rollout_seconds,
        candidate=None if cand is None else CandidateProfileStatus(
            context_tokens=_tokens_status(cand.context_tokens),
            output_tokens=_tokens_status(cand.output_tokens),
            prefix_hit_rate=cand.prefix_hit_rate,
            shared_prefix_tokens=cand.shared_prefix_tokens,
            request_rate_per_second=cand.request_rate_per_second, requests=cand.requests,
            arrival_cv=cand.arrival_cv, window_seconds=cand.window_seconds,
            notes=list(cand.notes), **reuse_status_fields(cand)),
    )


def state_from_status(status: InferenceDeploymentStatus, pool: str,
                      declared: WorkloadProfile) -> RetuneState:
    """The pool's clocks as stored (a pool not yet decided on starts with none); the
    candidate comes back as it was observed, its kind and multi-turn the declared ones
    (metrics cannot tell them)."""
    retune = status.profile.retune if status.profile else None
    kept = next((p.state for p in (retune.pools if retune else []) if p.name == pool), None)
    if kept is None:
        return RetuneState()
    cand = kept.candidate
    return RetuneState(
        drift_since_seconds=kept.drift_since_seconds,
        stable_since_seconds=kept.stable_since_seconds,
        last_rollout_seconds=kept.last_rollout_seconds,
        candidate=None if cand is None else declared.model_copy(update={
            "source": "prometheus",
            "context_tokens": TokenQuantiles.model_validate(cand.context_tokens.model_dump()),
            "output_tokens": TokenQuantiles.model_validate(cand.output_tokens.model_dump()),
            "prefix_hit_rate": cand.prefix_hit_rate,
            "shared_prefix_tokens": cand.shared_prefix_tokens
            if cand.shared_prefix_tokens is not None else declared.shared_prefix_tokens,
            "request_rate_per_second": cand.request_rate_per_second,
            "requests": cand.requests, "arrival_cv": cand.arrival_cv,
            "window_seconds": cand.window_seconds, "notes": tuple(cand.notes or ()),
            **reuse_from_status(cand)}),
    )
