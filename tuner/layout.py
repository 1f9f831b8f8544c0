"""The parallel layout of one replica: tensor parallel (TP) x data-parallel attention (DP)
x pipeline parallel (PP: each engine's layers in stages), with or without expert parallelism
(EP) for MoE models, and decode context parallel (DCP: each sequence's tokens split among the
TP ranks), as vLLM 0.33 runs it.

A replica of ``tensor_parallel * data_parallel`` GPUs runs ``data_parallel`` engines (one per
DP rank, each with its own scheduler, KV cache and sequences), each over ``tensor_parallel``
GPUs. The MoE layers of all ranks together are split over all ``tp * dp`` GPUs: by experts
with ``--enable-expert-parallel`` (EP size = tp * dp, vllm/config/parallel.py), else by tensor
slices of every expert (vLLM flattens TP across DP for MoE). Attention and dense weights are
split by TP and copied on every DP rank. With pipeline parallel each engine is ``pp``
stages in sequence, each stage ``tensor_parallel`` GPUs holding its own layers (a replica of
``tp * dp * pp`` GPUs; the MoE split above is per stage).

Plain data and flags only (the vocabulary); the KV and weight arithmetic per layout is in
``facts/layouts.py``, the choice among layouts in ``planner/layout_choice.py``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.knobs import TENSOR_PARALLEL_FLAG

# vLLM 0.33's spellings (vllm/engine/arg_utils.py, the ParallelConfig group).
DATA_PARALLEL_FLAG = "--data-parallel-size"
EXPERT_PARALLEL_FLAG = "--enable-expert-parallel"
DECODE_CONTEXT_PARALLEL_FLAG = "--decode-context-parallel-size"
PIPELINE_PARALLEL_FLAG = "--pipeline-parallel-size"


class ParallelLayout(BaseModel):
    """TP x DP x PP (+EP, +DCP) of one replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor_parallel: int = Field(default=1, gt=0)
    data_parallel: int = Field(default=1, gt=0)
    expert_parallel: bool = False
    # Decode context parallel: the TP ranks split each sequence's tokens among DCP groups
    # (vLLM: tp % dcp == 0, DCP reuses the TP ranks); 1: off.
    decode_context_parallel: int = Field(default=1, gt=0)
    # Pipeline parallel: each engine's layers split into this many stages in sequence, each
    # stage on its own TP group (vLLM --pipeline-parallel-size); 1: off.
    pipeline_parallel: int = Field(default=1, gt=0)
    # Nodes one replica spans (spec.pools[].nodesPerReplica): above 1, what passes between
    # them (a pipeline's stage-to-stage sends) goes over the RDMA NIC, even when the
    # replica's GPUs would fit one node.
    nodes_per_replica: int = Field(default=1, gt=0)

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tensor_parallel * self.data_parallel * self.pipeline_parallel

    @property
    def stage_gpus(self) -> int:
        """GPUs of one pipeline stage over all DP ranks (tp * dp): the ranks the MoE layers'
        collectives span (vLLM's EP group is per PP stage)."""
        return self.tensor_parallel * self.data_parallel

    @property
    def expert_parallel_size(self) -> int:
        """Ranks the experts are divided among (vLLM: tp * dp with EP on; 1 without)."""
        return self.stage_gpus if self.expert_parallel else 1

    @property
    def label(self) -> str:
        """``TP8``, ``DP8+EP``, ``TP2xDP4+EP``."""
        parts = []
        if self.tensor_parallel > 1 or self.data_parallel == 1:
            parts.append(f"TP{self.tensor_parallel}")
        if self.data_parallel > 1:
            parts.append(f"DP{self.data_parallel}")
        dcp = f"+DCP{self.decode_context_parallel}" if self.decode_context_parallel > 1 else ""
        pp = f"+PP{self.pipeline_parallel}" if self.pipeline_parallel > 1 else ""
        return "x".join(parts) + ("+EP" if self.expert_parallel else "") + dcp + pp

    def vllm_args(self) -> list[str]:
        """The layout's ``vllm serve`` flags: TP always (kvtune's lines always carry it), DP and
        EP when set (vLLM's defaults are DP 1 and EP off)."""
        args = [f"--{TENSOR_PARALLEL_FLAG}={self.tensor_parallel}"]
        if self.data_parallel > 1:
            args.append(f"{DATA_PARALLEL_FLAG}={self.data_parallel}")
        if self.expert_parallel:
            args.append(EXPERT_PARALLEL_FLAG)
        if self.decode_context_parallel > 1:
            args.append(f"{DECODE_CONTEXT_PARALLEL_FLAG}={self.decode_context_parallel}")
        if self.pipeline_parallel > 1:
            args.append(f"{PIPELINE_PARALLEL_FLAG}={self.pipeline_parallel}")
        return args
