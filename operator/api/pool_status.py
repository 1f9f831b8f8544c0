"""Status of the pools: conditions, the plan, expected and observed figures, canary,
runtime, cost, routing.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kvtune.operator.api.plan_status_fields import PlanStatusFields
from kvtune.operator.api.profile_status import ProfileStatus
from kvtune.operator.api.reuse_status import KVTierStatus, ObservedReuseStatus, ReuseStatus
from kvtune.operator.api.schema_base import _knob_docs, _Status


class Condition(_Status):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class PlanStatus(PlanStatusFields):
    """The knobs of a pool's plan, named as vLLM's flags (camelCase)."""

    # (The docstring is the CRD's description.) The fields are the knob table's
    # (kvtune.tuner.knobs), generated into plan_status_fields.py.

    model_config = ConfigDict(json_schema_extra=_knob_docs({}))


class ExpectedStatus(_Status):
    kv_cache_tokens: int
    kv_cache_bytes: int
    num_gpu_blocks: int
    kv_bytes_per_token: int
    concurrent_sequences: int
    concurrent_sequences_context_tokens: int
    decode_step_seconds: float | None = None
    prefix_hit_rate: float | None = None
    # Absent in a status an older kvtune wrote (the plan in force then takes the new plan's).
    weights_bytes_per_gpu: int | None = None
    non_kv_bytes_per_gpu: int | None = None
    # Predicted by the capacity search on the pool's observed traffic (tuner/planner/search):
    # one replica's capacity at SLO (the highest arrival rate of this traffic at which 95 %
    # of requests meet both targets), the fraction that do at the observed rate, and the p95
    # latencies there.
    capacity_requests_per_second: float | None = None
    slo_attainment: float | None = None
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    # ceil(the pool's observed rate / capacity): replicas all of its traffic needs at SLO.
    replicas_needed: int | None = None


PoolPhase = Literal["Applied", "Canary", "Recommended", "Unmanaged", "NoNodes", "Failed",
                    "Searching"]


class RevisionFiguresStatus(_Status):
    """One revision's live figures over the analysis window."""

    requests: float
    ttft_within_slo: float | None = None
    tpot_within_slo: float | None = None
    preemptions_per_request: float = 0.0
    kv_usage_mean: float | None = None
    waiting_mean: float | None = None


class CanaryAnalysisStatus(_Status):
    """The canary's last verdict on live metrics, with both revisions' figures as evidence."""

    verdict: str  # promote | rollback | inconclusive
    reason: str
    message: str
    at: str
    stable: RevisionFiguresStatus
    canary: RevisionFiguresStatus


class CanaryStatus(_Status):
    """A new plan running on ``canaryReplicas`` replicas beside the old one."""

    plan_hash: str
    revision: int
    started_at: str
    deployment: str
    analysis: CanaryAnalysisStatus | None = None


class UtilizationStatus(_Status):
    planned: float
    actual: float


class TokensStatus(_Status):
    expected: int
    actual: int


class RuntimeStatus(_Status):
    """What kvtune's runtime entrypoint found on the pool's pods running the current plan
    (their ``kvtune.io/runtime-report`` annotations; ``spec.runtime.entrypoint: kvtune``).
    Figures are the worst pod's: the smallest fraction and KV cache, the least free memory."""

    pods: int  # pods of the pool running the current plan
    reported_pods: int
    started_pods: int = 0
    refused_pods: int = 0
    gpu_product: str | None = None  # NVML's product name, e.g. "NVIDIA H200"
    gpu_memory_total_bytes: int | None = None
    gpu_memory_free_bytes: int | None = None  # when the entrypoint looked, before vLLM
    gpu_memory_utilization: UtilizationStatus | None = None
    kv_cache_tokens: TokensStatus | None = None
    refusal_reason: str | None = None
    refusal: str | None = None  # the entrypoint's message: expected, found, the fix
    message: str = ""
    last_report_time: str | None = None


class CostStatus(_Status):
    """What the chosen configuration costs (tuner/planner/cost.py): one replica's GPUs for an
    hour over what it serves of the pool's traffic at the observed rate."""

    usd_per_gpu_hour: float
    price_source: str
    gpus_per_replica: int
    cost_per_million_output_tokens_usd: float | None = None
    # Over the capacity at SLO: a replica run at capacity, the pool scaled to the traffic.
    cost_per_million_good_requests_usd: float | None = None


# status.pools[].layouts holds at most this many layouts (a status object is bounded; 64 GPUs
# per replica have 7 TP x DP splits, so the cap drops none today).
MAX_LAYOUTS_IN_STATUS = 8


class LayoutOptionStatus(_Status):
    """One layout weighed for ``gpusPerReplica`` (tuner/planner/layout_choice.py): its KV
    capacity per replica and the figure it was ranked by, or why it does not fit."""

    layout: str  # as tuner/layout.py spells it: TP8, TP2xDP4+EP, DP8+EP, TP8+DCP8
    chosen: bool = False
    kv_copies: int  # ranks holding each token's KV (MLA under TP: the TP degree)
    weights_bytes_per_gpu: int
    kv_cache_tokens_per_replica: int = 0  # the DP engines' caches together
    concurrent_sequences_per_replica: int = 0  # at the p95 session
    # What it was ranked by, per replica: with the capacity search its capacity at SLO
    # (req/s), else the sequences it runs at once within the TPOT target.
    capacity_requests_per_second: float | None = None
    sequences_within_tpot: int | None = None
    # With a price and the capacity search: its GPUs for an hour, and a million requests
    # meeting the SLO at its capacity.
    usd_per_replica_hour: float | None = None
    cost_per_million_good_requests_usd: float | None = None
    refused: str | None = Field(default=None, max_length=200)  # why it does not fit


class ObservedSLOStatus(_Status):
    """The SLO attainment vLLM's histograms show for the pool over the retune timer's last
    window, beside the capacity search's prediction (operator/retune/slo_observed.py)."""

    at: str
    window_seconds: float
    requests: int
    scope: Literal["pool", "deployment"]  # the pool's own series, or the deployment's
    ttft_within_slo: float | None = None  # at the bucket at or below the target
    tpot_within_slo: float | None = None
    ttft_bound_seconds: float | None = None
    tpot_bound_seconds: float | None = None
    # The most that can have met both targets (each read at the bucket at or above it).
    attainment_upper_bound: float | None = None
    predicted_attainment: float | None = None
    verdict: str  # ObservedBelowPrediction, ObservedAsPredicted, InsufficientSample, ...
    message: str


class PoolRoutingStatus(_Status):
    """The pool's routing objects (spec.routing) as applied and as the cluster sees them.

    ``max_model_len`` is what the pool's InferencePool and endpoint picker were applied with:
    the plan its stable pods run. It moves only when the pool's main Deployment takes a plan,
    so during a canary the HTTPRoute's length rules keep the stable plan's length (status'
    ``plan`` is then the canary's). The rest is refreshed by the operator
    (operator/monitoring/routing_status.py)."""

    max_model_len: int
    endpoint_picker: str  # its Deployment and Service
    # Requests/s one replica of the applied plan sustains within the SLO (the capacity
    # search's capacity at SLO, when it ran): the HTTPRoute weighs pools by it x replicas
    # (operator/routing/http_route.py). None: not measured; the weights then follow replicas.
    capacity_requests_per_second_per_replica: float | None = None
    endpoint_picker_available: bool | None = None  # None: not read yet
    message: str = ""


class PoolStatus(_Status):
    name: str
    gpu_class: str
    tensor_parallel: int
    replicas: int
    nodes: int = 0
    phase: PoolPhase
    message: str = ""
    deployment: str | None = None
    plan: PlanStatus | None = None
    expected: ExpectedStatus | None = None
    reasons: list[str] = []
    warnings: list[str] = []
    vllm_args: list[str] = []
    plan_hash: str | None = None
    # Digest of what the plan in force was made from (rollout/plan.planning_inputs): while it
    # holds, the plan is kept as it is, even by a kvtune whose planner would now choose
    # otherwise (an operator upgrade never re-plans a running pool on its own).
    plan_inputs: str | None = None
    revision: int = 0
    canary: CanaryStatus | None = None
    # A plan that failed its canary; kvtune does not try it again (another plan will be).
    rejected_plan_hash: str | None = None
    runtime: RuntimeStatus | None = None
    profile: ProfileStatus | None = None  # what this pool's plan was made for
    # Set when the capacity search finds no configuration meeting the SLO at the observed
    # rate: the attainment, the rate one replica sustains and the replicas needed.
    slo_at_risk: str | None = None
    cost: CostStatus | None = None  # the chosen configuration's, when the class has a price
    # gpusPerReplica: the layouts weighed (the chosen one marked), at most
    # MAX_LAYOUTS_IN_STATUS; empty for a pinned layout.
    layouts: list[LayoutOptionStatus] = Field(default=[], max_length=MAX_LAYOUTS_IN_STATUS)
    # Prefix reuse the capacity search predicts (hit rate per tier, the CPU tier chosen and
    # why, what the reuse saves); the observed shares beside it are the retune timer's.
    reuse: ReuseStatus | None = None
    kv_tier: KVTierStatus | None = None  # the LMCache tier of the plan in force, if any
    observed_slo: ObservedSLOStatus | None = None  # written by the retune timer
    observed_reuse: ObservedReuseStatus | None = None  # written by the retune timer
    routing: PoolRoutingStatus | None = None  # spec.routing.enabled, once applied
