"""GPU node pools: which Nodes belong to which of the planner's GPU classes.

The class of a node comes from its labels (NVIDIA GPU feature discovery, GKE, EKS/Karpenter),
read by ``kvtune.tuner.facts.gpus.gpu_class_for_node_labels``. This module groups nodes by class
and derives, for each class, the node affinity that selects exactly those nodes: one term per
label key that identified them (e.g. ``nvidia.com/gpu.product In [NVIDIA-H100-80GB-HBM3]``),
so a Deployment lands on the nodes the plan was made for, whichever labelling they carry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtune.tuner.facts.gpus import (
    GPU_CLASS_LABEL,
    NODE_GPU_LABELS,
    find_gpu_class,
    gpu_class_for_node_labels,
)

# Label keys that name a node's GPU, most specific first (the tuner's own list, so the key an
# affinity selects on is the one that classified the node).
GPU_LABEL_KEYS: tuple[str, ...] = NODE_GPU_LABELS
GPU_COUNT_LABELS: tuple[str, ...] = ("nvidia.com/gpu.count", "karpenter.k8s.aws/instance-gpu-count")
GPU_RESOURCE = "nvidia.com/gpu"

Classifier = Callable[[Mapping[str, str]], Any]


def _default_classifier(labels: Mapping[str, str]) -> Any:
    known = gpu_class_for_node_labels(labels)
    if known is not None:
        return known
    # A GPU kvtune has no data for: the platform team names its class on the node
    # (kvtune.io/gpu-class) and declares its facts in the pool's customGpu.
    return labels.get(GPU_CLASS_LABEL) or None


def _class_name(result: Any) -> str | None:
    if result is None:
        return None
    if isinstance(result, str):
        return result
    return str(result.name)


@dataclass(frozen=True)
class GPUNode:
    name: str
    gpu_class: str
    gpus: int  # GPUs on the node (allocatable, else the count label)
    selector_key: str | None  # the label that identified the class
    selector_value: str | None
    schedulable: bool
    labels: tuple[tuple[str, str], ...] = ()  # the node's labels (a pool's nodeSelector)
    memory_bytes: int = 0  # allocatable memory (0: not known)

    def matches(self, selector: Mapping[str, str]) -> bool:
        labels = dict(self.labels)
        return all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class GPUPool:
    """All nodes of one GPU class."""

    gpu_class: str
    nodes: tuple[GPUNode, ...] = field(default=())

    @property
    def schedulable_nodes(self) -> tuple[GPUNode, ...]:
        return tuple(n for n in self.nodes if n.schedulable)

    @property
    def max_gpus_per_node(self) -> int:
        return max((n.gpus for n in self.schedulable_nodes), default=0)

    def node_affinity(self) -> dict[str, Any] | None:
        """Required node affinity selecting this class's nodes; None when it has none.

        Terms are ORed by Kubernetes, so nodes labelled by different tools all match.
        """
        values: dict[str, set[str]] = {}
        for node in self.nodes:
            if node.selector_key and node.selector_value is not None:
                values.setdefault(node.selector_key, set()).add(node.selector_value)
        if not values:
            return None
        terms = [
            {"matchExpressions": [{"key": key, "operator": "In", "values": sorted(vals)}]}
            for key, vals in sorted(values.items(), key=lambda kv: GPU_LABEL_KEYS.index(kv[0]))
        ]
        return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}


def _gpu_count(node: Mapping[str, Any], labels: Mapping[str, str]) -> int:
    status = node.get("status") or {}
    for source in (status.get("allocatable") or {}, status.get("capacity") or {}):
        if GPU_RESOURCE in source:
            try:
                return int(str(source[GPU_RESOURCE]))
            except ValueError:
                pass
    for key in GPU_COUNT_LABELS:
        if key in labels:
            try:
                return int(labels[key])
            except ValueError:
                pass
    return 0


def classify_node(node: Mapping[str, Any], classify: Classifier | None = None) -> GPUNode | None:
    """The node as a GPUNode, or None when its labels name no known GPU class."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    gpu_class = _class_name((classify or _default_classifier)(labels))
    if gpu_class is None:
        return None
    # The label that named the class: its value identifies the same class.
    key = next((k for k in GPU_LABEL_KEYS if labels.get(k)
                and (_class_name(find_gpu_class(labels[k])) == gpu_class
                     or (k == GPU_CLASS_LABEL and labels[k] == gpu_class))), None)
    spec = node.get("spec") or {}
    return GPUNode(
        name=str(meta.get("name", "")),
        gpu_class=gpu_class,
        gpus=_gpu_count(node, labels),
        selector_key=key,
        selector_value=labels[key] if key else None,
        schedulable=not spec.get("unschedulable", False),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        memory_bytes=_memory_bytes(node),
    )


def _memory_bytes(node: Mapping[str, Any]) -> int:
    status = node.get("status") or {}
    for source in (status.get("allocatable") or {}, status.get("capacity") or {}):
        if "memory" in source:
            try:
                from kubernetes.utils import parse_quantity

                return int(parse_quantity(str(source["memory"])))  # type: ignore[no-untyped-call]
            except ValueError:
                pass
    return 0


def discover_pools(
    nodes: Iterable[Mapping[str, Any]], classify: Classifier | None = None
) -> dict[str, GPUPool]:
    """GPU class (upper-case, as the planner spells it) -> the pool of its nodes."""
    classified = (classify_node(node, classify) for node in nodes)
    return pools_of(n for n in classified if n is not None)


def pools_of(gpu_nodes: Iterable[GPUNode]) -> dict[str, GPUPool]:
    """GPU class (upper-case) -> the pool of these classified nodes."""
    grouped: dict[str, list[GPUNode]] = {}
    for gpu_node in gpu_nodes:
        grouped.setdefault(gpu_node.gpu_class.upper(), []).append(gpu_node)
    return {
        cls: GPUPool(gpu_class=cls, nodes=tuple(sorted(members, key=lambda n: n.name)))
        for cls, members in sorted(grouped.items())
    }


def inventory_digest(pools: Mapping[str, GPUPool]) -> str:
    """A short, stable summary (class=schedulable nodes) used to notice pool changes."""
    return ",".join(
        f"{cls}={len(pool.schedulable_nodes)}" for cls, pool in sorted(pools.items())
    )
