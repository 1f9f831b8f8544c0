"""GPU classes and node-label discovery."""

from __future__ import annotations

import pytest

from kvtune.tuner.errors import UnknownName
from kvtune.tuner.facts.gpus import GPU_CLASSES, get_gpu_class, gpu_class_for_node_labels


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("H100", "H100"), ("h100", "H100"), ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA-H100-80GB-HBM3", "H100"), ("nvidia-h100-80gb", "H100"),
        ("NVIDIA H100 NVL", "H100-NVL"), ("h100-nvl", "H100-NVL"),
        ("NVIDIA-H200", "H200"), ("nvidia-h200-141gb", "H200"), ("h200", "H200"),
        ("NVIDIA B200", "B200"), ("nvidia-b200", "B200"), ("b200", "B200"),
    ],
)
def test_aliases(name: str, expected: str) -> None:
    assert get_gpu_class(name).name == expected


def test_unknown_gpu_lists_close_matches() -> None:
    with pytest.raises(UnknownName) as info:
        get_gpu_class("H2000")  # H20 is a class of its own now
    assert "H200" in info.value.close_matches


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "H100"),
        ({"cloud.google.com/gke-accelerator": "nvidia-h200-141gb"}, "H200"),
        ({"karpenter.k8s.aws/instance-gpu-name": "b200"}, "B200"),
        ({"node.kubernetes.io/instance-type": "p5e.48xlarge"}, "H200"),
        # An explicit class label wins over what GPU feature discovery says.
        ({"kvtune.io/gpu-class": "H100-NVL", "nvidia.com/gpu.product": "NVIDIA-H200"}, "H100-NVL"),
        ({"kubernetes.io/os": "linux"}, None),
        ({"nvidia.com/gpu.product": "NVIDIA-T4"}, None),
    ],
)
def test_gpu_class_for_node_labels(labels: dict[str, str], expected: str | None) -> None:
    gpu = gpu_class_for_node_labels(labels)
    assert (gpu.name if gpu else None) == expected


def test_memory_and_generation_facts() -> None:
    for gpu in GPU_CLASSES:
        # vLLM budgets from the CUDA total, which is below NVML's.
        assert gpu.cuda_total_bytes < gpu.nvml_total_bytes
    h100, h200, b200 = (get_gpu_class(n) for n in ("H100", "H200", "B200"))
    assert h100.compute_capability == h200.compute_capability == (9, 0)
    assert b200.compute_capability == (10, 0)
    assert h200.supports_fp8 and not h200.supports_fp4 and b200.supports_fp4
    assert h100.cuda_total_bytes < h200.cuda_total_bytes < b200.cuda_total_bytes
    assert h200.hbm_bandwidth_bytes_per_second > h100.hbm_bandwidth_bytes_per_second
