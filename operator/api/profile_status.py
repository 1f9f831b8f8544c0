"""Status of the workload profile, the retune timer and the KV-quality evidence.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from typing import Literal

from kvtune.operator.api.reuse_status import TierHitRatesStatus
from kvtune.operator.api.schema_base import _Status


class TokenQuantilesStatus(_Status):
    p50: int
    p90: int | None = None
    p95: int
    p99: int
    max: int


class SecondsQuantilesStatus(_Status):
    """Quantiles of a time distribution (reuse gaps, idle time before eviction), seconds."""

    p50: float
    p90: float
    p99: float
    max: float
    count: int = 0


ProfileScope = Literal["pool", "deployment"]


class ProfileStatus(_Status):
    """The workload profile a plan was made for, and where it came from. The profiling
    module fills this with ``source: prometheus``; until then it is the declared workload.
    ``scope`` (in ``pools[].profile``): ``pool`` when it was observed on the pool's own
    series, ``deployment`` when it is the deployment-wide (or declared) one."""

    source: str
    scope: ProfileScope | None = None
    kind: str | None = None
    window: str | None = None
    requests: int | None = None
    context_tokens: TokenQuantilesStatus | None = None
    output_tokens: TokenQuantilesStatus | None = None
    shared_prefix_tokens: int | None = None
    prefix_hit_rate: float | None = None
    request_rate_per_second: float | None = None
    observed_at: str | None = None
    # The rest of the exact profile the plan was made from (``workloads.profile_from_status``
    # gives it back whole, so the next reconcile recognises the plan in force): absent in a
    # status an older kvtune wrote.
    arrival_cv: float | None = None
    window_seconds: float | None = None
    notes: list[str] | None = None
    # Reuse (vLLM's --kv-cache-metrics, or a trace's): kept whole for the same reason.
    prefix_reuse_gap_seconds: SecondsQuantilesStatus | None = None
    prefix_reuse_distance_tokens: TokenQuantilesStatus | None = None
    session_gap_seconds: SecondsQuantilesStatus | None = None
    kv_block_idle_before_evict_seconds: SecondsQuantilesStatus | None = None


class DeploymentProfileStatus(ProfileStatus):
    """``status.profile``: the deployment-wide profile, and the retune timer's part: the
    last window's figures, whether they were trusted and why, its decisions and clocks."""

    observed: ObservedStatus | None = None
    trusted: bool | None = None
    profile_message: str | None = None
    retune: RetuneStatus | None = None


class QuantileEstimateStatus(_Status):
    """A length quantile read from a histogram: the estimate and the bucket holding it."""

    q: float
    estimate: int
    lower: float | None = None
    upper: float | None = None  # absent: in the +Inf bucket with no cap known
    histogram_quantile: float | None = None  # Prometheus' interpolation, for comparison


class ObservedStatus(_Status):
    """What the last profiling window showed (the retune timer writes it)."""

    window_seconds: float
    requests: int
    request_rate_per_second: float | None = None
    prefix_hit_rate: float | None = None
    kv_cache_usage_mean: float | None = None
    kv_cache_usage_max: float | None = None
    preemptions_per_second: float | None = None
    waiting_mean: float | None = None
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    num_gpu_blocks: list[int] = []
    context_tokens: list[QuantileEstimateStatus] = []
    output_tokens: list[QuantileEstimateStatus] = []
    # The share of prompt tokens each KV tier supplied (vLLM's prompt tokens by source).
    tier_hit_rates: TierHitRatesStatus | None = None


class CandidateProfileStatus(_Status):
    """The traffic a dwell started from (the retune timer compares the next windows with
    it): the figures drift is measured on."""

    context_tokens: TokenQuantilesStatus
    output_tokens: TokenQuantilesStatus
    prefix_hit_rate: float | None = None
    shared_prefix_tokens: int | None = None
    request_rate_per_second: float | None = None
    requests: int | None = None
    arrival_cv: float | None = None
    window_seconds: float | None = None
    notes: list[str] | None = None
    # Reuse (vLLM's --kv-cache-metrics, or a trace's): kept whole for the same reason.
    prefix_reuse_gap_seconds: SecondsQuantilesStatus | None = None
    prefix_reuse_distance_tokens: TokenQuantilesStatus | None = None
    session_gap_seconds: SecondsQuantilesStatus | None = None
    kv_block_idle_before_evict_seconds: SecondsQuantilesStatus | None = None


class RetuneStateStatus(_Status):
    """The retune timer's clocks for one pool (Unix seconds), kept in status so that a
    restart, a reconcile or a rollout keeps them: the dwell and the min interval hold."""

    drift_since_seconds: float | None = None
    candidate: CandidateProfileStatus | None = None
    stable_since_seconds: float | None = None
    last_rollout_seconds: float | None = None


class RetunePoolStatus(_Status):
    name: str
    scope: ProfileScope | None = None
    selector: str = ""
    requests: int | None = None
    profile_message: str = ""
    reason: str
    message: str = ""
    drift_score: float | None = None
    state: RetuneStateStatus = RetuneStateStatus()


class RetuneStatus(_Status):
    """The retune timer's last decision (the tick's reason: the pool furthest along)."""

    reason: str
    message: str = ""
    at: str | None = None
    drift_score: float | None = None
    drift_threshold: float | None = None
    dwell_seconds: float | None = None
    pools: list[RetunePoolStatus] = []


# Unverified: a narrower KV dtype is planned that no measurement covers and none can be made
# here (no calibration image, or calibration Jobs are forbidden in the namespace).
KVQualityPhase = Literal["Measured", "Calibrating", "Failed", "Disabled", "NotNeeded",
                         "Unverified"]
# Why none can run: calibration disabled in the spec, no image with kvtune, Jobs forbidden,
# the spec's calibration image off the chart's podPolicy.allowedImages.
UnverifiedCause = Literal["Disabled", "NoImage", "Forbidden", "ImageNotAllowed"]


class KVQualityDtypeStatus(_Status):
    dtype: str
    kl_mean: float  # nats vs 16-bit KV
    top1_agreement: float
    attention_error_max: float
    worst_layer: int
    allowed: bool  # within spec.quality.maxKVQuantizationKL


class KVQualityStatus(_Status):
    """The KV-quality evidence the plans were gated on (issue 15)."""

    model: str
    revision: str  # spec.model.revision, or "unpinned"
    phase: KVQualityPhase
    message: str = ""
    job: str | None = None  # the calibration Job, while it runs or when it failed
    config_map: str | None = None  # where the report is kept
    measured_at: str | None = None
    weights: str | None = None  # "checkpoint" | "random-init"
    checkpoint_kv_scales: str | None = None  # what the checkpoint says of its KV scales
    dtypes: list[KVQualityDtypeStatus] = []
    # Phase Unverified: "pool: dtype" per pool held at the wider dtype, and why no calibration
    # can run (UnverifiedCause). A later reconcile holds from these while the cause stands,
    # instead of planning the narrower dtype again only to be held again.
    unverified: list[str] = []
    unverified_cause: UnverifiedCause | None = None
