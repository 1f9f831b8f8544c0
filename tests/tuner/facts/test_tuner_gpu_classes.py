"""The GPU classes platform teams deploy (issue 14 item 6): real specs and the names that
identify them (NVML product names, GPU feature discovery, GKE, Karpenter), and a custom class
declared by its facts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.gpus import find_gpu_class, get_gpu_class, gpu_class_for_node_labels

GiB = 2**30

# class, NVML product name, nvidia-smi MiB, bandwidth TB/s, dense BF16 TFLOPS, compute cap.
CLASSES = [
    ("L4", "NVIDIA L4", 23034, 0.3, 121, (8, 9)),
    ("A10G", "NVIDIA A10G", 23028, 0.6, 125, (8, 6)),
    ("H20", "NVIDIA H20", 97871, 4.0, 148, (9, 0)),
    ("H100-PCIe", "NVIDIA H100 PCIe", 81559, 2.0, 756, (9, 0)),
    ("H800", "NVIDIA H800", 81559, 3.35, 989.4, (9, 0)),
    ("B300", "NVIDIA B300 SXM6 AC", 275040, 8.0, 2250, (10, 3)),
    ("GB200", "NVIDIA GB200", 189471, 8.0, 2500, (10, 0)),
]


@pytest.mark.parametrize(("name", "nvml", "mib", "tbps", "tflops", "cc"), CLASSES,
                         ids=[c[0] for c in CLASSES])
def test_gpu_class_specs(name: str, nvml: str, mib: int, tbps: float, tflops: float,
                         cc: tuple[int, int]) -> None:
    gpu = get_gpu_class(name)
    assert gpu.name == name and find_gpu_class(nvml) is gpu
    assert gpu.nvml_total_bytes == mib * 2**20
    # The CUDA runtime reports a few hundred MiB less than NVML.
    assert 0 < gpu.nvml_total_bytes - gpu.cuda_total_bytes < 1 * GiB
    assert gpu.hbm_bandwidth_bytes_per_second == pytest.approx(tbps * 1e12)
    assert gpu.dense_bf16_flops_per_second == pytest.approx(tflops * 1e12)
    assert gpu.compute_capability == cc
    assert gpu.supports_fp8 == (cc >= (8, 9))
    assert gpu_class_for_node_labels({"nvidia.com/gpu.product": nvml.replace(" ", "-")}) is gpu


def test_l4_is_l4_not_the_l40s() -> None:
    # Before: "did you mean L40S", a GPU with twice the memory.
    assert get_gpu_class("L4").cuda_total_bytes == pytest.approx(22.03 * GiB, rel=1e-3)
    assert get_gpu_class("nvidia-l4").name == "L4"  # GKE's accelerator label
    assert get_gpu_class("g5.xlarge").name == "A10G"


def test_custom_gpu_class_from_the_cli() -> None:
    spec = "RTX6000:memory=47.4GiB,bandwidth=960GB/s,bf16=364TFLOPS,fp8=728TFLOPS,cc=8.9"
    gpu = get_gpu_class(spec)
    assert gpu.name == "RTX6000" and gpu.cuda_total_bytes == int(47.4 * GiB)
    assert gpu.native_low_precision == ("fp8",) and gpu.compute_capability == (8, 9)
    result = CliRunner().invoke(cli, ["plan", "-m", "meta-llama/Llama-3.1-8B-Instruct",
                                      "-g", spec, "-o", "json"])
    assert result.exit_code == 0, result.output
    assert '"gpu_class": "RTX6000"' in result.output


@pytest.mark.parametrize(("spec", "field"), [
    ("X:memory=48,bandwidth=1TB/s,bf16=100TFLOPS,cc=9.0", "gpu.memory"),
    ("X:memory=48GiB,bandwidth=1TB/s,bf16=100TFLOPS,cc=nine", "gpu.cc"),
    ("X:memory=48GiB,bandwidth=1TB/s", "gpu"),
    ("H100:memory=48GiB,bandwidth=1TB/s,bf16=100TFLOPS,cc=9.0", "gpu"),
])
def test_bad_custom_gpu_is_one_line(spec: str, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        get_gpu_class(spec)
    assert err.value.field == field
    result = CliRunner().invoke(cli, ["plan", "-m", "meta-llama/Llama-3.1-8B-Instruct",
                                      "-g", spec])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
