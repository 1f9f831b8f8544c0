"""GPU classes as data (``tuner/facts/data/gpus.json``): memory as NVML and as the CUDA runtime
report it, bandwidth, dense FLOPs, compute capability, native low-precision formats, and the
names that identify a class on a node (NVML names, GPU feature discovery's
``nvidia.com/gpu.product``, GKE's ``cloud.google.com/gke-accelerator``, Karpenter's
``karpenter.k8s.aws/instance-gpu-name``, instance types).

vLLM budgets ``gpu_memory_utilization`` from the CUDA runtime's total
(``torch.cuda.mem_get_info``), which is a few hundred MiB below NVML's: the planner uses
``cuda_total_bytes``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.errors import UnknownName

LowPrecision = Literal["fp8", "fp4"]

# Node labels that name the GPU, most specific first. ``kvtune.io/gpu-class`` lets a
# platform team state the class outright.
GPU_CLASS_LABEL = "kvtune.io/gpu-class"
NODE_GPU_LABELS: tuple[str, ...] = (
    GPU_CLASS_LABEL,
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
    "node.kubernetes.io/instance-type",
)


class GPUClass(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    nvml_total_bytes: int = Field(gt=0)
    cuda_total_bytes: int = Field(gt=0)
    memory_source: str
    hbm_bandwidth_bytes_per_second: int = Field(gt=0)
    dense_bf16_flops_per_second: int = Field(gt=0)
    dense_fp8_flops_per_second: int | None = None
    dense_fp4_flops_per_second: int | None = None
    compute_capability: tuple[int, int]
    native_low_precision: tuple[LowPrecision, ...]
    spec_source: str
    nvml_names: tuple[str, ...]
    gpu_product_labels: tuple[str, ...]
    gke_accelerators: tuple[str, ...]
    karpenter_gpu_names: tuple[str, ...]
    instance_types: tuple[str, ...]

    @property
    def supports_fp8(self) -> bool:
        return "fp8" in self.native_low_precision

    @property
    def supports_fp4(self) -> bool:
        return "fp4" in self.native_low_precision

    def identifiers(self) -> tuple[str, ...]:
        """Every name that identifies this class (for lookups)."""
        return (
            self.name, *self.nvml_names, *self.gpu_product_labels, *self.gke_accelerators,
            *self.karpenter_gpu_names, *self.instance_types,
        )


@cache
def _load() -> tuple[GPUClass, ...]:
    text = resources.files("kvtune.tuner.facts").joinpath("data", "gpus.json").read_text("utf-8")
    return tuple(GPUClass.model_validate(g) for g in json.loads(text)["gpu_classes"])


def _key(name: str) -> str:
    # "NVIDIA H100 80GB HBM3" == "NVIDIA-H100-80GB-HBM3" == "nvidia_h100_80gb_hbm3"
    return re.sub(r"[\s_\-]+", "-", name.strip().lower())


@cache
def _index() -> dict[str, GPUClass]:
    out: dict[str, GPUClass] = {}
    for gpu in _load():
        for ident in gpu.identifiers():
            out.setdefault(_key(ident), gpu)
    return out


GPU_CLASSES: tuple[GPUClass, ...] = _load()


def list_gpu_classes() -> list[str]:
    return [g.name for g in GPU_CLASSES]


def find_gpu_class(name: str) -> GPUClass | None:
    """The class a name identifies (class name, NVML name, label value), or None."""
    return _index().get(_key(name))


def get_gpu_class(name: str) -> GPUClass:
    """A GPU class by name or alias, case-insensitive. Raises ``UnknownName`` with the close
    matches."""
    gpu = find_gpu_class(name)
    if gpu is not None:
        return gpu
    names = [g.name for g in GPU_CLASSES]
    close = difflib.get_close_matches(name.upper(), names, n=4, cutoff=0.4)
    if not close:
        close = [
            _index()[k].name
            for k in difflib.get_close_matches(_key(name), list(_index()), n=4, cutoff=0.5)
        ]
    raise UnknownName(
        "gpu", name, list(dict.fromkeys(close)),
        f"Known GPU classes: {', '.join(names)}.",
    )


def gpu_class_for_node_labels(labels: Mapping[str, str]) -> GPUClass | None:
    """The GPU class of a Kubernetes Node from its labels, or None when no label names a
    known GPU. Labels are tried most specific first (``NODE_GPU_LABELS``)."""
    for label in NODE_GPU_LABELS:
        value = labels.get(label)
        if not value:
            continue
        gpu = find_gpu_class(value)
        if gpu is not None:
            return gpu
    return None
