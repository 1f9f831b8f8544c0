"""What one pool's plan is asked for: ``PlanRequest`` (pure data), the ``CandidateScorer``
hook the simulator implements, and ``session_tokens``, the session length at a quantile that
several decisions read. ``planning`` re-exports all three."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.facts.capabilities import PINNED_VLLM_VERSION
from kvtune.tuner.facts.gpus import GPUClass
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.kv_quality import KVQualityEvidence
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.model_calibration import ModelCalibration
from kvtune.tuner.plan import CandidateScore, KVPlan
from kvtune.tuner.planner.policy import PlanPolicy
from kvtune.tuner.workload import WorkloadProfile


class PlanRequest(BaseModel):
    """Everything one pool's plan depends on (pure data)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelArchitecture
    gpu: GPUClass
    tensor_parallel: int = Field(default=1, gt=0)
    # Data-parallel attention ranks (engines) per replica and expert parallel for MoE layers
    # (tuner/layout.py): the plan is one engine's; each DP rank runs it on its share.
    data_parallel: int = Field(default=1, gt=0)
    expert_parallel: bool = False
    # Decode context parallel (MLA models): tokens of a sequence split among DCP TP ranks.
    decode_context_parallel: int = Field(default=1, gt=0)
    # Pipeline-parallel stages per engine (each stage holds its own layers' weights and KV).
    pipeline_parallel: int = Field(default=1, gt=0)
    # Nodes a replica spans (tuner/layout.py): the link between pipeline stages.
    nodes_per_replica: int = Field(default=1, gt=0)
    # "auto": the checkpoint's own (DeepSeek-V3: fp8), else the model's 16-bit dtype.
    weights_dtype: str = "auto"
    profile: WorkloadProfile
    policy: PlanPolicy = PlanPolicy()
    # A KV-quality measurement of this model revision (kvtune quality / the calibration Job);
    # None: none exists, narrower dtypes are "unverified".
    kv_quality_evidence: KVQualityEvidence | None = None
    vllm_version: str = PINNED_VLLM_VERSION
    # The closed loop's correction terms for this model on this GPU class, vLLM version and
    # layout (the operator's ConfigMap, or ``kvtune plan --calibration FILE``); None: the
    # models as they are (docs/calibration-loop.md).
    calibration: ModelCalibration | None = None

    # The request's fields a ParallelLayout holds (the same names): one mapping both ways.
    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(**{name: getattr(self, name)
                                 for name in ParallelLayout.model_fields})

    def with_layout(self, layout: ParallelLayout) -> PlanRequest:
        """This request at ``layout`` (every layout field replaced)."""
        return self.model_copy(update=layout.model_dump())


class CandidateScorer(Protocol):
    """Scores candidate plans on the request's workload (the simulator implements it).
    Must return one score per candidate, in the same order."""

    def __call__(
        self, request: PlanRequest, candidates: Sequence[KVPlan]
    ) -> Sequence[CandidateScore]: ...


def session_tokens(profile: WorkloadProfile, quantile: str) -> int:
    """Prompt + output at one quantile (``p50``, ``p95``, ``p99``, ``max``)."""
    ctx = getattr(profile.context_tokens, quantile)
    out = getattr(profile.output_tokens, quantile)
    return max(1, int(ctx) + int(out))
