"""A stand-in for nvidia-ml-py's ``pynvml`` in an image run without a GPU: the runtime
entrypoint's NVML read (``kvtune.runtime.gpus.read_gpus``) sees the GPUs listed in the
environment variable ``KVTUNE_FAKE_NVML``, a JSON list of
``{"name": "NVIDIA H200", "total_bytes": …, "free_bytes": …, "compute_capability": [9, 0]}``.

The same calls, with the same answers, as ``FakeNvml`` in tests/runtime/test_runtime_entrypoint.py;
put first on ``PYTHONPATH`` it shadows the real package the image installs.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    """What pynvml raises; here only for a GPU without MIG."""


def _devices() -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = json.loads(os.environ.get("KVTUNE_FAKE_NVML", "[]"))
    return devices


def nvmlInit() -> None:
    return None


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return len(_devices())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return str(_devices()[handle]["name"])


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    device = _devices()[handle]
    total, free = int(device["total_bytes"]), int(device["free_bytes"])
    return SimpleNamespace(total=total, free=free, used=total - free)


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:
    major, minor = _devices()[handle]["compute_capability"]
    return int(major), int(minor)


def nvmlDeviceGetMigMode(handle: int) -> tuple[int, int]:
    raise NVMLError("NVMLError_NotSupported")
