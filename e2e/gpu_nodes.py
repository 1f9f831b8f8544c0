"""Fake GPU node pools: Node objects that look like what NVIDIA's GPU feature discovery and
device plugin publish on real H100 / H200 / B200 machines, managed by kwok.

Labels are GFD's (``nvidia.com/gpu.product``, ``.memory`` in MiB, ``.count``, ``.present``,
``.family``, ``.compute.major/minor``); the GPUs are the extended resource ``nvidia.com/gpu``
in capacity and allocatable, as the device plugin reports them. Nodes must be *created* (not
applied or patched) with their status: the apiserver keeps a Node's status on create only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtune.tuner.facts import gpus as tuner_gpus
from kvtune.tuner.units import MiB

# The annotation kwok selects its nodes by (``--manage-nodes-with-annotation-selector``).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
POOL_LABEL = "kvtune.io/fake-gpu-pool"


@dataclass(frozen=True)
class GPUClass:
    """What GFD reports for one GPU model. ``memory_mib`` is nvidia-smi's total memory."""

    name: str
    product: str
    memory_mib: int
    family: str
    compute_major: int
    compute_minor: int


def _gfd_family(major: int, minor: int) -> str:
    """GFD's ``nvidia.com/gpu.family`` value for a compute capability."""
    if major == 8:
        return "ada-lovelace" if minor == 9 else "ampere"
    return {9: "hopper", 10: "blackwell"}.get(major, "unknown")


# Every GPU class of the tuner's one table (tuner/facts/data/gpus.json), as GFD labels it: the
# first product label, nvidia-smi's total MiB (NVML's bytes), the family and capability.
GPU_CLASSES: dict[str, GPUClass] = {
    g.name: GPUClass(g.name, g.gpu_product_labels[0], g.nvml_total_bytes // MiB,
                     _gfd_family(*g.compute_capability), *g.compute_capability)
    for g in tuner_gpus.GPU_CLASSES if g.gpu_product_labels
}


@dataclass(frozen=True)
class NodePool:
    gpu_class: str
    nodes: int
    gpus_per_node: int = 8
    cpu: str = "192"
    memory: str = "2Ti"
    pods: str = "110"

    def node_names(self) -> list[str]:
        return [f"{self.gpu_class.lower()}-{i}" for i in range(self.nodes)]


DEFAULT_POOLS: tuple[NodePool, ...] = (
    NodePool("H100", 4),
    NodePool("H200", 4),
    NodePool("B200", 2),
)


def parse_pools(spec: str) -> tuple[NodePool, ...]:
    """``"H100=4,H200=4,B200=2"`` (optionally ``H100=4x8`` for GPUs per node) -> pools."""
    pools = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition("=")
        name = name.strip().upper()
        if name not in GPU_CLASSES or not count:
            raise ValueError(
                f"node pool {item!r}: expected CLASS=NODES[xGPUS] with CLASS one of "
                f"{', '.join(GPU_CLASSES)}, e.g. H100=4x8"
            )
        nodes, _, gpus = count.partition("x")
        pools.append(NodePool(name, int(nodes), int(gpus) if gpus else 8))
    return tuple(pools)


def node_manifest(pool: NodePool, name: str) -> dict[str, Any]:
    gpu = GPU_CLASSES[pool.gpu_class]
    resources = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": pool.pods,
        "nvidia.com/gpu": str(pool.gpus_per_node),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                POOL_LABEL: pool.gpu_class,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": gpu.product,
                "nvidia.com/gpu.memory": str(gpu.memory_mib),
                "nvidia.com/gpu.count": str(pool.gpus_per_node),
                "nvidia.com/gpu.family": gpu.family,
                "nvidia.com/gpu.compute.major": str(gpu.compute_major),
                "nvidia.com/gpu.compute.minor": str(gpu.compute_minor),
            },
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def manifests(pools: tuple[NodePool, ...]) -> list[dict[str, Any]]:
    return [node_manifest(pool, name) for pool in pools for name in pool.node_names()]
