"""How each vLLM version accounts for the GPU memory beside the KV cache, as data
(``data/vllm_memory.json``): which versions subtract their CUDA-graph estimate from the KV
budget, which sampler and non-torch generation each belongs to, and the coefficients of
kvtune's non-KV model fitted to published start-up logs (``data/vllm_startup_logs.json``).

vLLM sizes the KV cache at start (``vllm/v1/worker/gpu_worker.py``,
``determine_available_memory``)::

    requested    = ceil(cuda_total * gpu_memory_utilization)
    available_kv = requested - (weights + torch peak increase + non-torch increase)
                   - CUDA-graph estimate            (only where the version deducts it)

The versions differ in three ways the start-up logs show:

- CUDA graphs: 0.18-0.19 estimate their memory but leave it in the KV budget
  (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` off: "In v0.19, CUDA graph memory profiling
  will be enabled by default"); from 0.21.0 the estimate is subtracted ("CUDA graph memory
  profiling is enabled (default since v0.21.0)"; the 0.33.0 wheel's ``envs.py`` defaults it
  to "1").
- The sampler's dummy run (the activation peak): about 39 bytes per logit (max-num-seqs x
  vocab) up to 0.16, about 16 from 0.17 (Qwen3-14B on one H100: 5.64 GiB in 0.15/0.16,
  2.23 GiB in 0.17/0.18).
- Non-torch memory with TP = 1: 0.13 GiB up to 0.17, 0.25 GiB in 0.18-0.19 (cuBLAS handles
  created after the memory snapshot). The 0.33.0 wheel creates them before the snapshot
  ("so they count as baseline like the NCCL buffers"), so 0.33 is on the 0.13 GiB side.

Worked example (coefficients as shipped): Llama 3.1 8B on one H100, 8,192 batched tokens,
1,024 sequences, vLLM 0.19.0: activation -0.14 + 15.8 B x 1,024 x 128,256 (1.93 GiB) + 1.31 x
8,192 x 4,096 x 2 B (0.08 GiB) = 1.88 GiB (logged 1.89); non-torch 0.25 GiB (logged 0.25); no
CUDA graphs.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts import data_files

GiB = 1 << 30


class MemoryCoefficients(BaseModel):
    """kvtune's fitted non-KV model (``bench/memory_calibration.py --write`` refits it from the
    start-up log table; ``tests`` check the shipped numbers are that fit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    activation_base_gib: float
    # Bytes of the sampler's dummy run per logit (max_num_seqs x vocab), by sampler generation.
    sampler_bytes_per_logit: dict[str, float]
    # [batched tokens x hidden] activations alive at the peak, in copies.
    hidden_state_copies: float
    # Multiplier on the fused-MoE workspace tokens x top-k x (max(2 I, hidden) + I) x 2 bytes.
    moe_workspace_factor: float
    # Non-torch increase with TP = 1, by non-torch generation.
    non_torch_gib: dict[str, float]
    # Extra non-torch increase when tensor parallel > 1 (communication buffers): this at TP 2,
    # plus tensor_parallel_gib_per_peer for every further peer rank (the 0.19 logs: 2.07 GiB
    # median at TP 2, 2.17 at TP 4; NCCL and the custom all-reduce keep buffers per peer).
    tensor_parallel_gib: float
    tensor_parallel_gib_per_peer: float = 0.0
    # vLLM's CUDA-graph estimate: the first capture of each mode (a fixed base) plus, for every
    # further graph, a cost per layer.
    cuda_graph_base_gib: float
    cuda_graph_gib_per_layer_graph: float
    # The same for the pool the graphs really take (logged "CUDA graph pool memory: X GiB
    # (actual)"), which a version that captures every graph to measure them deducts.
    cuda_graph_pool_base_gib: float
    cuda_graph_pool_gib_per_layer_graph: float
    # Provenance: the table rows each part was fitted on, and how.
    fitted_on: dict[str, list[str]]
    method: str


def tensor_parallel_extra_gib(coefs: MemoryCoefficients, tensor_parallel: int) -> float:
    """The non-torch increase tensor parallelism adds on each rank (0 at TP 1)."""
    if tensor_parallel <= 1:
        return 0.0
    return coefs.tensor_parallel_gib + coefs.tensor_parallel_gib_per_peer * (tensor_parallel - 2)


class VersionMemory(BaseModel):
    """One vLLM version's memory accounting."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cuda_graph_deducted: bool
    # How the deducted figure is made: "sampled" (V1 model runner: the first two captures of
    # each mode, the second extrapolated to the rest) or "measured" (V2 model runner, 0.33:
    # every piecewise graph captured into a throwaway pool), which is close to the real pool.
    cuda_graph_estimator: Literal["sampled", "measured"] = "sampled"
    sampler: str
    non_torch: str
    # For versions without a capability file: the --kv-cache-dtype values kvtune plans with
    # (those every version since 0.11 has) and vLLM's default fraction. None: the pinned
    # version's capability file says.
    kv_cache_dtypes: tuple[str, ...] | None = None
    default_gpu_memory_utilization: float | None = None
    evidence: str


class MemoryData(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str
    versions: dict[str, VersionMemory]
    coefficients: MemoryCoefficients


@cache
def memory_data() -> MemoryData:
    return MemoryData.model_validate(data_files.read_json("data", "vllm_memory.json"))


def supported_versions() -> tuple[str, ...]:
    """The vLLM versions kvtune has memory data for (``--vllm-version`` accepts these)."""
    return tuple(sorted(memory_data().versions, key=_version_key))


def version_memory(version: str) -> VersionMemory:
    versions = memory_data().versions
    if version not in versions:
        raise InvalidInput(
            "vllm_version", version,
            f"kvtune's memory model is calibrated for vLLM {', '.join(supported_versions())}; "
            "pass one of them (--vllm-version, spec.runtime.vllmVersion) or the pinned "
            "0.33.0",
        )
    return versions[version]


def coefficients() -> MemoryCoefficients:
    return memory_data().coefficients


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def graph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, *,
                        blackwell: bool = False) -> tuple[int, int]:
    """How many CUDA graphs vLLM captures (``VllmConfig._set_cudagraph_sizes``): piecewise
    graphs for sizes ``[1, 2, 4] + range(8, 256, 8) + range(256, M + 1, 16)`` up to
    ``M = min(2 x max_num_seqs, 512)`` (1,024 on data-centre Blackwell) and the batch budget,
    and full decode graphs for the sizes up to ``max_num_seqs``. 1,024 sequences: 51 + 51;
    256: 51 + 35 (the logged "PIECEWISE=51 (largest=512), FULL=35 (largest=256)")."""
    ceiling = 1024 if blackwell else 512
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, ceiling + 1, 16)]
    piecewise_max = min(2 * max_num_seqs, ceiling, max_num_batched_tokens)
    full_max = min(max_num_seqs, piecewise_max)
    return (sum(1 for s in sizes if s <= piecewise_max),
            sum(1 for s in sizes if s <= full_max))

