"""What the node really has: the visible GPUs as NVML reports them, behind a thin boundary.

``read_gpus()`` is the only function that talks to the driver; everything else takes a list
of ``GpuInfo`` so the checks run (and are tested) on a machine without a GPU.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from kvtune.tuner.units import GiB as GIB


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str  # NVML product name, e.g. "NVIDIA H100 80GB HBM3"
    total_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int]
    mig: bool = False

    def describe(self) -> str:
        major, minor = self.compute_capability
        return (
            f"GPU {self.index} '{self.name}' (SM {major}.{minor}, "
            f"{self.total_bytes / GIB:.1f} GiB total, {self.free_bytes / GIB:.1f} GiB free"
            f"{', MIG' if self.mig else ''})"
        )


@dataclass(frozen=True)
class GpuClass:
    """How a GPU class of the plan shows up in NVML."""

    name: str
    # NVML product names of the class, exactly as nvmlDeviceGetName returns them
    # ("NVIDIA H100 NVL" is the class H100-NVL, not H100; "NVIDIA GH200 480GB" is none).
    nvml_names: tuple[str, ...]
    compute_capability: tuple[int, int]

    @property
    def compute_capability_major(self) -> int:
        return self.compute_capability[0]


def _load_classes() -> dict[str, GpuClass]:
    """The GPU classes from the tuner's one data file (shipped in the same wheel), read as
    JSON so that the runtime needs nothing but its standard library and pydantic."""
    text = resources.files("kvtune.tuner.facts").joinpath("data", "gpus.json").read_text("utf-8")
    return {
        str(g["name"]).upper(): GpuClass(
            str(g["name"]), tuple(str(n) for n in g["nvml_names"]),
            (int(g["compute_capability"][0]), int(g["compute_capability"][1])))
        for g in json.loads(text)["gpu_classes"]
    }


GPU_CLASSES: dict[str, GpuClass] = _load_classes()
_BY_NVML_NAME: dict[str, str] = {
    n.lower(): cls.name for cls in GPU_CLASSES.values() for n in cls.nvml_names}


def class_of(gpu: GpuInfo) -> str | None:
    """The plan's GPU class name this GPU belongs to, or None when it is none of them. A MIG
    instance is named after its parent ("NVIDIA H100 80GB HBM3 MIG 3g.40gb")."""
    product = gpu.name.split(" MIG ")[0].strip().lower()
    return _BY_NVML_NAME.get(product)


def _visible_indices(count: int) -> list[int]:
    """NVML sees every GPU on the node; the container's runtime says which are ours.

    The NVIDIA container toolkit exposes only the allotted devices, but a pod that sets
    CUDA_VISIBLE_DEVICES (or a shared node) must still be honoured, as CUDA would.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        return list(range(count))
    indices: list[int] = []
    for part in visible.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count:
            indices.append(int(part))
    # UUID forms (GPU-…, MIG-…) are resolved by the container toolkit; fall back to all.
    return indices or list(range(count))


def read_gpus(nvml: Any | None = None) -> list[GpuInfo]:
    """Every visible GPU as NVML reports it. ``nvml`` defaults to ``pynvml``."""
    if nvml is None:
        nvml = _import_pynvml()
    nvml.nvmlInit()
    try:
        gpus: list[GpuInfo] = []
        for index in _visible_indices(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):  # older bindings return bytes
                name = name.decode()
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            # On a MIG GPU the parent's memory is the whole card; what a process gets is
            # its MIG instance's, so read the instances.
            mig_handles = _mig_devices(nvml, handle) if _mig_enabled(nvml, handle) else []
            for sub in mig_handles or [handle]:
                sub_name = nvml.nvmlDeviceGetName(sub) if mig_handles else name
                if isinstance(sub_name, bytes):
                    sub_name = sub_name.decode()
                memory = nvml.nvmlDeviceGetMemoryInfo(sub)
                gpus.append(
                    GpuInfo(
                        index=index,
                        name=str(sub_name),
                        total_bytes=int(memory.total),
                        free_bytes=int(memory.free),
                        compute_capability=(int(major), int(minor)),
                        mig=bool(mig_handles),
                    )
                )
        return gpus
    finally:
        nvml.nvmlShutdown()


def _import_pynvml() -> Any:
    """pynvml (nvidia-ml-py), imported only at the real boundary; vLLM's vendored copy when
    the image lacks the package (vLLM ships ``vllm/third_party/pynvml.py``)."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return importlib.import_module("vllm.third_party.pynvml")


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    getter: Callable[[Any], tuple[int, int]] | None = getattr(
        nvml, "nvmlDeviceGetMigMode", None
    )
    if getter is None:
        return False
    try:
        current, _pending = getter(handle)
    except Exception:  # NVMLError_NotSupported on GPUs without MIG
        return False
    return bool(current)


def _mig_devices(nvml: Any, handle: Any) -> list[Any]:
    handles: list[Any] = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
        except Exception:  # NVMLError_NotFound: an empty MIG slot
            continue
    return handles
