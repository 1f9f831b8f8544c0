"""What the planner returns: the knobs (``KVPlan``), the figures it expects
(``ExpectedFigures``) and why (``Reason``), per pool (``PoolPlan``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from kvtune.tuner import knobs
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan_fields import KVPlanFields
from kvtune.tuner.plan_reuse import ReuseFigures
from kvtune.tuner.plan_tier import KVTier, transfer_config_flag


class KVPlan(KVPlanFields):
    """The vLLM KV-cache configuration of one pool. Field names follow vLLM's flags; the fields
    are the knob table's (``tuner/knobs.py``, generated into ``plan_fields.py``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def vllm_args(self) -> list[str]:
        """The exact ``vllm serve`` flags for this plan (no model argument, no TP flag),
        rendered from the knob table (``tuner/knobs.py``)."""
        return knobs.plan_args(self.model_dump())

    def with_offload(self, size_gib: float | None) -> KVPlan:
        """This plan with ``size_gib`` of CPU KV offload (GiB across TP ranks; None or 0:
        off) on the backend ``offload_backend`` names."""
        size = size_gib or None
        return self.model_copy(update={"kv_offloading_size_gib": size,
                                       "kv_offloading_backend": offload_backend(size)})


def offload_backend(size_gib: float | None) -> str | None:
    """The ``--kv-offloading-backend`` kvtune renders: vLLM's native CPU offload whenever
    offload is on (the one the simulator's CPU tier, ``simulator/offload.py``, follows)."""
    return "native" if size_gib else None


class CandidateVerdict(BaseModel):
    """One candidate value of a knob and the check that kept or ruled it out."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: str
    ok: bool
    # CamelCase constant naming the check, e.g. "Fits", "BelowQualityFloor",
    # "UnsupportedByBackend", "TooFewSequences", "Pinned".
    check: str
    detail: str


class Reason(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: str  # vLLM flag name without dashes' prefix, e.g. "kv-cache-dtype"
    choice: str
    code: str  # CamelCase, e.g. "WidestThatMeetsConcurrency", "Pinned"
    message: str  # one human sentence with the numbers
    candidates: tuple[CandidateVerdict, ...] = ()


class ExpectedFigures(BaseModel):
    """What the plan should produce once running; compared with observed figures later."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_bytes_per_token: int  # per GPU (one TP rank), all layers, at the chosen dtype
    kv_cache_bytes: int  # per GPU
    kv_cache_tokens: int  # tokens the KV cache holds (num_blocks * block_size)
    num_gpu_blocks: int
    weights_bytes_per_gpu: int
    non_kv_bytes_per_gpu: int  # weights + activations + CUDA graphs + other overheads
    # Sequences that fit at the profile's high-percentile context (prompt + output).
    concurrent_sequences: int
    concurrent_sequences_context_tokens: int  # the context length that figure assumes
    decode_step_seconds: float | None = None  # at max_num_seqs, from the bandwidth model
    prefix_hit_rate: float | None = None  # from the simulator, when it scored the plan
    # Of prompt tokens loaded from the CPU tier (the figure above is the GPU's), when scored.
    cpu_prefix_hit_rate: float | None = None
    # From the capacity search (the simulator on the pool's traffic), when it ran: one
    # replica's capacity at SLO (the highest arrival rate of this traffic at which 95 % of
    # requests meet both targets), the fraction that do at the observed rate, and the p95
    # latencies there.
    capacity_requests_per_second: float | None = None
    slo_attainment: float | None = None
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    # ceil(the pool's observed rate / capacity): replicas all of its traffic needs at SLO.
    replicas_needed: int | None = None


class SearchAlternative(BaseModel):
    """A configuration the capacity search ranked below the chosen one, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vllm_args: tuple[str, ...]
    # The highest rate per replica its ladder saw it meet the SLO at (a lower bound; 0: not
    # at any rate tried, e.g. it missed at the observed rate where the chosen one met it).
    capacity_requests_per_second: float
    slo_attainment: float  # at the observed rate
    ttft_p95_seconds: float
    tpot_p95_seconds: float
    why_lost: str


class FrontPoint(BaseModel):
    """A configuration the search scored on the full stream that no other one beats on
    every axis at once: more capacity at SLO, more output tokens served per second at the
    observed rate (so a lower cost per token on the same GPUs), less latency against the SLO
    targets (``planner/search_front.py``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vllm_args: tuple[str, ...]
    chosen: bool  # the configuration the search chose
    on_front: bool  # False only for the chosen one when a point dominates it (a tie rule)
    capacity_requests_per_second: float  # per replica (a lower bound but for the chosen)
    slo_attainment: float
    output_tokens_per_second: float
    ttft_p95_seconds: float
    tpot_p95_seconds: float
    # The worse of TTFT p95 / its target and TPOT p95 / its target (1.0: on the target).
    latency_vs_slo: float
    # Set once a price is known (tuner/planner/cost.py): one replica's GPUs for an hour over
    # its output tokens at the observed rate, and over its capacity at SLO.
    cost_per_million_output_tokens_usd: float | None = None
    cost_per_million_good_requests_usd: float | None = None
    # Set on the front across tensor-parallel degrees (``TPChoice.front``): the point's TP;
    # None on a search's own front (all of its points share the pool's TP).
    tensor_parallel: int | None = None


class CostFigures(BaseModel):
    """What the chosen configuration costs: one replica (tensor-parallel GPUs) for an hour,
    over its output tokens at the observed rate and over its capacity at SLO."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd_per_gpu_hour: float
    price_source: str
    gpus_per_replica: int
    usd_per_replica_hour: float
    cost_per_million_output_tokens_usd: float | None  # None: nothing served
    # Over the capacity at SLO (a replica run at capacity); None: no rate meets the SLO.
    cost_per_million_good_requests_usd: float | None


class SearchSummary(BaseModel):
    """What the capacity search found (``tuner/planner/search.py``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    observed_rate_per_second: float  # all of the pool's traffic
    # The replicas sharing it, and one replica's share (what the search replayed).
    replicas: int = 1
    rate_per_replica_per_second: float = 0.0
    # The concurrency the traffic needs (arrival rate x time in the engine at the SLO).
    littles_law_sequences: int
    # One replica's capacity at SLO: the highest arrival rate of the pool's traffic at which
    # 95 % of the requests meet both targets in steady state (to within 2 %; 0: none).
    capacity_requests_per_second: float
    # At the observed rate (one replica's share): the fraction meeting both targets in
    # steady state, and the p95 latencies.
    slo_attainment: float
    ttft_p95_seconds: float
    tpot_p95_seconds: float
    slo_met: bool  # at least 95% of requests meet both targets at the observed rate
    slo_set: bool  # False: the default targets were used
    # ceil(observed rate / capacity): the replicas all of the traffic needs within the SLO.
    replicas_needed: int | None = None
    candidates: int  # configurations that passed pre-flight and were scored
    simulated_requests: int
    requests_per_candidate: int  # the finalists' stream length
    # The requests the reported capacity was measured on: the full stream, unless a budget
    # stop left no time to measure the chosen plan on it (then a short stream's figure,
    # which overstates capacity; the plan's warnings say so). 0: not recorded.
    capacity_measured_requests: int = 0
    changed_from: str  # "running plan" or "rules' plan"
    changed_knobs: tuple[str, ...] = ()
    alternatives: tuple[SearchAlternative, ...] = ()
    # The chosen configuration's output tokens per second at the observed rate.
    output_tokens_per_second: float = 0.0
    # Capacity against cost and latency over the configurations scored on the full stream.
    front: tuple[FrontPoint, ...] = ()
    cost: CostFigures | None = None  # set when the GPU class has a price
    # What prefix reuse saves and the CPU tier costs (None: no prompt token was cached).
    reuse: ReuseFigures | None = None
    # Set when the search's budget (CPU seconds, memory) stopped it before its last stage:
    # why; the plan is the best of what was scored by then (``planner/search_budget.py``).
    stopped_by: str | None = None


class SLOUnreachable(BaseModel):
    """No configuration meets the SLO at any rate, from a closed-form bound taken before any
    simulation (``simulator/slo_bound.py``): the best latency attainable, served alone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The fastest TTFT of the p95 prompt (its uncached tokens in one step, nothing else
    # running) and the fastest TPOT (one sequence decoding alone).
    ttft_floor_seconds: float
    tpot_floor_seconds: float
    ttft_target_seconds: float
    tpot_target_seconds: float
    prompt_tokens: int  # the uncached prompt tokens the TTFT floor prefills
    message: str


class LayoutOption(BaseModel):
    """One layout the planner weighed: its KV capacity per replica, and the plan's figures
    on it, or why it does not fit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layout: ParallelLayout
    # Copies of each token's KV among one engine's TP ranks (MLA under TP: tp; vLLM's
    # kv_tp_replicas).
    kv_copies: int
    weights_bytes_per_gpu: int
    # Tokens one engine (DP rank) holds: blocks per GPU x block size (x DCP).
    kv_cache_tokens_per_engine: int = 0
    # Tokens the replica holds: its engines' (DP ranks') caches together.
    kv_cache_tokens_per_replica: int = 0
    concurrent_sequences_per_replica: int = 0
    decode_step_seconds: float | None = None
    # The objective the choice ranked by (capacity at SLO, req/s per replica, or concurrent
    # sequences).
    score: float = 0.0
    chosen: bool = False
    refused: str | None = None  # why it does not fit (then the figures are 0)
    vllm_args: tuple[str, ...] = ()
    # Set once the GPU class has a price (``planner/cost.py: priced``): the replica's GPUs
    # (TP x DP x PP) for an hour, and over its capacity at SLO (capacity search only).
    usd_per_replica_hour: float | None = None
    cost_per_million_good_requests_usd: float | None = None


class TPOption(BaseModel):
    """One tensor-parallel degree weighed for ``tensorParallel: auto``
    (``planner/tp_choice.py``): what one replica of it serves, the replicas the rate needs
    and what they cost, or why it is ruled out."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor_parallel: int  # GPUs per replica
    weights_bytes_per_gpu: int
    kv_cache_tokens_per_replica: int = 0
    # With a rate: requests/s one replica serves within the SLO; without one: sequences one
    # replica runs at once within the TPOT target (``TPChoice.by`` says which).
    capacity_per_replica: float = 0.0
    replicas_needed: int | None = None  # None: no rate, or not even a trickle meets the SLO
    gpus_needed: int | None = None  # replicas_needed x tensor_parallel
    usd_per_replica_hour: float | None = None  # None: no price for the class
    # GPUs per replica x price / (capacity x 3600) x 10^6: a million good requests at capacity.
    cost_per_million_good_requests_usd: float | None = None
    # The replicas the rate needs for an hour over the rate: what the traffic costs as served.
    cost_per_million_requests_at_rate_usd: float | None = None
    slo_met: bool | None = None  # at the whole rate on one replica
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    chosen: bool = False
    refused: str | None = None  # why it cannot serve (then the figures are 0/None)
    vllm_args: tuple[str, ...] = ()


class TPChoice(BaseModel):
    """The tensor-parallel degree and replicas chosen for a pool (``tensorParallel: auto``):
    every degree weighed, what decided, and cost against latency across the degrees."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # "capacity": with a rate, the fewest GPUs that serve it within the SLO, then the lowest
    # cost per good request at capacity; "sequences": without one, the fewest GPUs per
    # sequence within the TPOT target.
    by: str
    rate_per_second: float | None = None  # the traffic the pool serves
    replicas: int | None = None  # chosen; None without a rate
    max_replicas: int | None = None  # the bound (the spec's replicas); None: unbounded
    usd_per_gpu_hour: float | None = None
    options: tuple[TPOption, ...] = ()
    # Search front points of every degree (each at one replica carrying the whole rate), not
    # dominated on cost per good request (GPUs over goodput) and latency against the SLO.
    front: tuple[FrontPoint, ...] = ()


class PoolPlan(BaseModel):
    """The planner's answer for one pool."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str
    gpu_class: str
    tensor_parallel: int
    vllm_version: str
    plan: KVPlan
    expected: ExpectedFigures
    reasons: tuple[Reason, ...]
    warnings: tuple[str, ...] = ()
    search: SearchSummary | None = None  # set when the capacity search chose the plan
    # Set instead of a search when no configuration can meet the SLO at any rate.
    slo_unreachable: SLOUnreachable | None = None
    # Data-parallel attention / expert parallel (``tuner/layout.py``); None: TP alone, as
    # ``tensor_parallel`` says. Left out of the dump when None, so plans without it (and what
    # reads them: the runtime's KVTUNE_PLAN, status) are unchanged.
    layout: ParallelLayout | None = None
    # The layouts the planner weighed for this replica's GPUs (``planner/layout_choice.py``).
    layouts_considered: tuple[LayoutOption, ...] = ()
    # ``tensorParallel: auto``: the degrees weighed and the replicas chosen
    # (``planner/tp_choice.py``); dropped from the dump when None, like ``layout``.
    tp_choice: TPChoice | None = None
    # An LMCache tier (``tuner/plan_tier.py``); dropped from the dump when None, like ``layout``.
    kv_tier: KVTier | None = None

    @model_serializer(mode="wrap")
    def _drop_unset_layout(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.layout is None:
            data.pop("layout", None)
        if not self.layouts_considered:
            data.pop("layouts_considered", None)
        if self.tp_choice is None:
            data.pop("tp_choice", None)
        if self.kv_tier is None:
            data.pop("kv_tier", None)
        return data

    def vllm_args(self) -> list[str]:
        """Everything after ``vllm serve MODEL`` this pool's plan sets: the layout's flags (TP,
        then DP and EP when set), then the plan's. The one rendering path of ``kvtune plan -o
        json|args`` and the operator's Deployment (``tuner/knobs.py``)."""
        if self.layout is None:
            args = knobs.serve_args(self.tensor_parallel, self.plan.model_dump())
        else:
            args = [*self.layout.vllm_args(), *knobs.plan_args(self.plan.model_dump())]
        # LMCache's connector is not a knob: its sizes live in its config file, not a flag.
        return args if self.kv_tier is None else [*args, transfer_config_flag()]


class CandidateScore(BaseModel):
    """What the simulator (or any scorer) says a candidate plan would do on the workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: KVPlan
    ttft_p95_seconds: float
    tpot_p95_seconds: float
    throughput_requests_per_second: float
    prefix_hit_rate: float
    preemptions: int
    peak_concurrent_sequences: int
    summary: str  # one line with the figures, quoted in the planner's reasons
