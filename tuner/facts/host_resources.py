"""Host memory, CPU and ``/dev/shm`` of one vLLM pod, beside its GPUs
(``data/vllm_host.json``: each figure with its source; ``docs/pod-resources.md``: the policy).

vLLM 0.33.0 runs an API server process, an EngineCore process and, with tensor parallel > 1,
one worker process per GPU rank (with TP = 1 the worker is inside the EngineCore)::

    shm_bytes    = kv_offloading_size GiB                      (the CPU KV tier is a /dev/shm mmap)
                 + (TP > 1: 160 MiB + TP x 240 MiB + 24 MiB    vLLM's shared-memory queues
                            + 1 GiB NCCL headroom)
                 | (TP = 1: 256 MiB)
    memory_bytes = processes x 1.2 GiB (torch + vllm imported, measured)
                 + 0.5 GiB API server + 0.5 GiB EngineCore + TP x 1.0 GiB CUDA context
                 + shm_bytes                                   (tmpfs is charged to the pod)
    cpu_cores    = 1 API server + 1 EngineCore + (TP > 1: TP workers)

Worked example: TP = 2 with 64 GiB of CPU KV offload: four processes (API server, EngineCore,
two workers), 4 x 1.2 + 0.5 + 0.5 + 2 x 1.0 = 7.8 GiB (7,988 MiB); /dev/shm 65,536 + 160 +
2 x 240 + 24 + 1,024 = 67,224 MiB; memory request 75,212 MiB (73.4 GiB); 4 cores. TP = 1
without offload: 2 x 1.2 + 0.5 + 0.5 + 1.0 = 4.4 GiB + 256 MiB of /dev/shm = 4,762 MiB, 2 cores.
"""

from __future__ import annotations

import math
from functools import cache

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.facts import data_files

GiB = 1 << 30
MiB = 1 << 20


class HostFacts(BaseModel):
    """``data/vllm_host.json``: the figures and, beside each, where it comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str
    vllm_version: str
    python_process_gib: float = Field(gt=0)
    python_process_source: str
    api_server_extra_gib: float = Field(ge=0)
    api_server_extra_source: str
    engine_core_extra_gib: float = Field(ge=0)
    engine_core_extra_source: str
    cuda_context_host_gib: float = Field(ge=0)
    cuda_context_host_source: str
    cpu_cores_api_server: int = Field(ge=0)
    cpu_cores_engine_core: int = Field(ge=0)
    cpu_cores_per_gpu_worker: int = Field(ge=0)
    cpu_source: str
    shm_executor_broadcast_mib: int = Field(ge=0)
    shm_executor_broadcast_source: str
    shm_worker_response_mib: int = Field(ge=0)
    shm_worker_response_source: str
    shm_tp_group_broadcast_mib: int = Field(ge=0)
    shm_tp_group_broadcast_source: str
    shm_nccl_headroom_mib: int = Field(ge=0)
    shm_nccl_headroom_source: str
    shm_single_gpu_mib: int = Field(gt=0)
    shm_single_gpu_source: str
    offload_source: str


class HostResources(BaseModel):
    """What one pod of a plan needs of its node besides the GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_bytes: int  # the container's memory request (and limit: docs/pod-resources.md)
    cpu_millicores: int  # the container's CPU request (no limit)
    shm_bytes: int  # the /dev/shm emptyDir's sizeLimit, within memory_bytes
    offload_bytes: int  # the CPU KV tier, within shm_bytes
    # LMCache's CPU tier or buffer (pinned host memory, not /dev/shm), within memory_bytes.
    pinned_bytes: int = 0


@cache
def host_facts() -> HostFacts:
    return HostFacts.model_validate(data_files.read_json("data", "vllm_host.json"))


def _mib_up(size_bytes: float) -> int:
    """Whole MiB, rounded up: what a Kubernetes quantity in Mi can say exactly."""
    return math.ceil(size_bytes / MiB) * MiB


def shm_bytes(tensor_parallel: int, offload_gib: float | None) -> int:
    """The ``/dev/shm`` a pod of this shape writes at most (see the module docstring)."""
    facts = host_facts()
    offload = (offload_gib or 0.0) * GiB
    if tensor_parallel > 1:
        queues_mib = (facts.shm_executor_broadcast_mib
                      + tensor_parallel * facts.shm_worker_response_mib
                      + facts.shm_tp_group_broadcast_mib + facts.shm_nccl_headroom_mib)
    else:
        queues_mib = facts.shm_single_gpu_mib
    return _mib_up(offload + queues_mib * MiB)


def host_resources(tensor_parallel: int, offload_gib: float | None,
                   pinned_gib: float = 0.0) -> HostResources:
    """The memory and CPU requests and the ``/dev/shm`` size of one pod with
    ``tensor_parallel`` GPUs, ``offload_gib`` of vLLM's native CPU KV offload (None: off) and
    ``pinned_gib`` of LMCache's pinned host memory (``tuner/plan_tier.py``)."""
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel={tensor_parallel}: a vLLM pod has at least 1 GPU")
    facts = host_facts()
    workers = tensor_parallel if tensor_parallel > 1 else 0  # TP = 1: inside the EngineCore
    processes = 2 + workers
    process_gib = (processes * facts.python_process_gib + facts.api_server_extra_gib
                   + facts.engine_core_extra_gib
                   + tensor_parallel * facts.cuda_context_host_gib)
    shm = shm_bytes(tensor_parallel, offload_gib)
    cores = (facts.cpu_cores_api_server + facts.cpu_cores_engine_core
             + workers * facts.cpu_cores_per_gpu_worker)
    pinned = _mib_up(pinned_gib * GiB)
    return HostResources(memory_bytes=_mib_up(process_gib * GiB) + shm + pinned,
                         cpu_millicores=1000 * cores, shm_bytes=shm,
                         offload_bytes=_mib_up((offload_gib or 0.0) * GiB), pinned_bytes=pinned)


def quantity_mib(size_bytes: int) -> str:
    """A Kubernetes quantity in Mi (``size_bytes`` is whole MiB)."""
    assert size_bytes % MiB == 0, size_bytes
    return f"{size_bytes // MiB}Mi"
