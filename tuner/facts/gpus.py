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
import re
from collections.abc import Mapping
from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.errors import InvalidInput, UnknownName
from kvtune.tuner.facts import data_files

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
    # GPU <-> host memory, one direction, in bytes/s (KV offload to CPU loads over it);
    # None: not known (a declared class), offload is then not simulated.
    host_link_bytes_per_second: int | None = Field(default=None, gt=0)
    host_link_source: str = ""
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
    doc = data_files.read_json("data", "gpus.json")
    return tuple(GPUClass.model_validate(g) for g in doc["gpu_classes"])


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


# A GPU kvtune has no data for, declared by its facts: memory as the CUDA runtime reports it,
# memory bandwidth, dense BF16 (and FP8) FLOPs, compute capability.
#   NAME:memory=48GiB,bandwidth=960GB/s,bf16=364TFLOPS[,fp8=733TFLOPS],cc=8.9
_UNITS: dict[str, dict[str, float]] = {
    "memory": {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
               "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12},
    "bandwidth": {"gb/s": 1e9, "tb/s": 1e12, "gbps": 1e9, "tbps": 1e12},
    "bf16": {"tflops": 1e12, "pflops": 1e15},
    "fp8": {"tflops": 1e12, "pflops": 1e15},
}
CUSTOM_GPU_SPEC = "NAME:memory=48GiB,bandwidth=960GB/s,bf16=364TFLOPS[,fp8=733TFLOPS],cc=8.9"


def custom_gpu_class(
    name: str, *, memory_bytes: int, bandwidth_bytes_per_second: int,
    dense_bf16_flops_per_second: int, compute_capability: tuple[int, int],
    dense_fp8_flops_per_second: int | None = None,
) -> GPUClass:
    """A GPU class from declared facts. ``memory_bytes`` is what the CUDA runtime reports
    (``torch.cuda.mem_get_info`` total, what vLLM budgets from). FP8 is native from compute
    capability 8.9 (Ada, Hopper), FP4 from 10.0 (Blackwell), as vLLM's kernels assume."""
    if find_gpu_class(name) is not None:
        raise InvalidInput("gpu", name, "is a known GPU class; give the custom class its own name")
    low: list[LowPrecision] = []
    if compute_capability >= (8, 9):
        low.append("fp8")
    if compute_capability >= (10, 0):
        low.append("fp4")
    try:
        return GPUClass(
            name=name, description=f"custom GPU class {name} (declared)",
            nvml_total_bytes=memory_bytes, cuda_total_bytes=memory_bytes,
            memory_source="declared by the user", hbm_bandwidth_bytes_per_second=(
                bandwidth_bytes_per_second),
            dense_bf16_flops_per_second=dense_bf16_flops_per_second,
            dense_fp8_flops_per_second=dense_fp8_flops_per_second if "fp8" in low else None,
            compute_capability=compute_capability, native_low_precision=tuple(low),
            spec_source="declared by the user", nvml_names=(), gpu_product_labels=(),
            gke_accelerators=(), karpenter_gpu_names=(), instance_types=(),
        )
    except ValueError as exc:
        raise InvalidInput("gpu", name, f"not a valid GPU declaration: {exc}") from exc


def _quantity(key: str, text: str, spec: str) -> float:
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z/]*)\s*", text)
    units = _UNITS[key]
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in units or float(match.group(1)) <= 0:
        raise InvalidInput(
            f"gpu.{key}", text,
            f"expected a positive number with a unit ({', '.join(units)}), e.g. {CUSTOM_GPU_SPEC}")
    return float(match.group(1)) * units[unit]


def parse_gpu_spec(spec: str) -> GPUClass:
    """A custom GPU class from ``NAME:memory=...,bandwidth=...,bf16=...,cc=M.m``."""
    name, _, body = spec.partition(":")
    name = name.strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", name):
        raise InvalidInput("gpu", spec, f"a custom GPU is declared as {CUSTOM_GPU_SPEC}")
    fields: dict[str, str] = {}
    for part in body.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in (*_UNITS, "cc"):
            raise InvalidInput("gpu", spec, f"unknown or malformed {part.strip()!r}: "
                               f"declare {CUSTOM_GPU_SPEC}")
        fields[key] = value.strip()
    missing = [k for k in ("memory", "bandwidth", "bf16", "cc") if k not in fields]
    if missing:
        raise InvalidInput("gpu", spec, f"missing {', '.join(missing)}: declare {CUSTOM_GPU_SPEC}")
    cc = re.fullmatch(r"(\d+)\.(\d)", fields["cc"])
    if cc is None:
        raise InvalidInput("gpu.cc", fields["cc"], "expected the compute capability as M.m, "
                           "e.g. 8.9 (nvidia-smi --query-gpu=compute_cap)")
    return custom_gpu_class(
        name,
        memory_bytes=int(_quantity("memory", fields["memory"], spec)),
        bandwidth_bytes_per_second=int(_quantity("bandwidth", fields["bandwidth"], spec)),
        dense_bf16_flops_per_second=int(_quantity("bf16", fields["bf16"], spec)),
        dense_fp8_flops_per_second=(int(_quantity("fp8", fields["fp8"], spec))
                                    if "fp8" in fields else None),
        compute_capability=(int(cc.group(1)), int(cc.group(2))),
    )


def get_gpu_class(name: str) -> GPUClass:
    """A GPU class by name or alias, case-insensitive, or a custom class declared as
    ``NAME:memory=...,bandwidth=...,bf16=...,cc=M.m``. Raises ``UnknownName`` with the close
    matches."""
    if ":" in name:
        return parse_gpu_spec(name)
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
        f"Known GPU classes: {', '.join(names)}; or declare another GPU as {CUSTOM_GPU_SPEC}.",
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
