"""What the traffic looks like: the planner's view of a workload.

A profile comes from one of four places (``source``): a named preset (``preset``), the
InferenceDeployment's declared workload (``declared``), a request trace file (``trace``), or
Prometheus (``prometheus``). All lengths are in tokens.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

WorkloadKind = Literal["chat", "rag", "agent", "multi-tenant", "long-context", "custom"]
ProfileSource = Literal["preset", "declared", "trace", "prometheus"]


class TokenQuantiles(BaseModel):
    """Quantiles of a length distribution, in tokens. ``p90`` is optional (declared workloads
    rarely know it); ``max`` is the largest value seen or allowed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    p50: int = Field(ge=0)
    p90: int | None = Field(default=None, ge=0)
    p95: int = Field(ge=0)
    p99: int = Field(ge=0)
    max: int = Field(ge=0)

    @model_validator(mode="after")
    def _monotone(self) -> TokenQuantiles:
        chain = [("p50", self.p50)]
        if self.p90 is not None:
            chain.append(("p90", self.p90))
        chain += [("p95", self.p95), ("p99", self.p99), ("max", self.max)]
        for (lo_name, lo), (hi_name, hi) in pairwise(chain):
            if lo > hi:
                raise ValueError(
                    f"quantiles must not decrease: {lo_name}={lo} > {hi_name}={hi}; "
                    f"fix the larger quantile or the smaller one"
                )
        return self


class SecondsQuantiles(BaseModel):
    """Quantiles of a time distribution, in seconds (reuse gaps, session gaps, idle time)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    p50: float = Field(ge=0.0)
    p90: float = Field(ge=0.0)
    p99: float = Field(ge=0.0)
    max: float = Field(ge=0.0)
    count: int = Field(default=0, ge=0)  # how many gaps the quantiles are taken over

    @model_validator(mode="after")
    def _monotone(self) -> SecondsQuantiles:
        chain = [("p50", self.p50), ("p90", self.p90), ("p99", self.p99), ("max", self.max)]
        for (lo_name, lo), (hi_name, hi) in pairwise(chain):
            if lo > hi:
                raise ValueError(
                    f"quantiles must not decrease: {lo_name}={lo} > {hi_name}={hi}; "
                    f"fix the larger quantile or the smaller one"
                )
        return self


class WorkloadProfile(BaseModel):
    """The workload a plan is made for.

    ``context_tokens`` is the prompt length per request (what the KV cache holds before the
    first output token); ``output_tokens`` the generated length. A request's KV footprint at
    its end is prompt + output.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: ProfileSource
    kind: WorkloadKind = "custom"
    context_tokens: TokenQuantiles
    output_tokens: TokenQuantiles
    # Tokens of a prompt prefix shared by (nearly) all requests, e.g. a system prompt.
    shared_prefix_tokens: int = Field(default=0, ge=0)
    # Observed fraction of prompt tokens served from the prefix cache (0..1), if known.
    prefix_hit_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    # Requests continue a conversation whose history is re-sent (multi-turn chat, agents).
    multi_turn: bool = False
    request_rate_per_second: float | None = Field(default=None, ge=0.0)
    # Burstiness: the coefficient of variation of the gaps between arrivals (1: Poisson;
    # above 1: bursty); None: unknown (traffic made from the profile takes 1).
    arrival_cv: float | None = Field(default=None, ge=0.0)
    # How many requests the figures are based on, and over what window (observed profiles).
    requests: int | None = Field(default=None, ge=0)
    window_seconds: float | None = Field(default=None, gt=0.0)
    # Reuse (``tuner/reuse_profile.py``; None: not observed). Per reuse of a prefix block:
    # the seconds since its previous use, and the distinct prompt tokens used in between (the
    # LRU stack distance: a cache holding fewer tokens has evicted the block by then).
    prefix_reuse_gap_seconds: SecondsQuantiles | None = None
    prefix_reuse_distance_tokens: TokenQuantiles | None = None
    # Seconds between a request and the next one that re-sends its whole prompt (the next turn
    # of a conversation or an agent's next call after a tool ran).
    session_gap_seconds: SecondsQuantiles | None = None
    # vLLM's ``vllm:kv_block_idle_before_evict_seconds`` (``--kv-cache-metrics``), when observed.
    kv_block_idle_before_evict_seconds: SecondsQuantiles | None = None
    # Free-form notes on how the figures were estimated (e.g. quantile uncertainty).
    notes: tuple[str, ...] = ()
