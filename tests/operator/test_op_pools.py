"""GPU nodes -> the planner's GPU classes, and the affinity that selects exactly them."""

from __future__ import annotations

from typing import Any

import pytest

from kvtune.operator.kube.pools import classify_node, discover_pools, inventory_digest


def node(name: str, labels: dict[str, str], gpus: str | None = "8",
         unschedulable: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name, "labels": labels},
                            "spec": {"unschedulable": unschedulable} if unschedulable else {}}
    if gpus is not None:
        body["status"] = {"allocatable": {"nvidia.com/gpu": gpus}}
    return body


@pytest.mark.parametrize(("labels", "gpu_class", "key"), [
    ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "H100", "nvidia.com/gpu.product"),
    ({"nvidia.com/gpu.product": "NVIDIA-H200"}, "H200", "nvidia.com/gpu.product"),
    ({"nvidia.com/gpu.product": "NVIDIA-B200"}, "B200", "nvidia.com/gpu.product"),
    ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, "H100",
     "cloud.google.com/gke-accelerator"),
    ({"karpenter.k8s.aws/instance-gpu-name": "h200"}, "H200",
     "karpenter.k8s.aws/instance-gpu-name"),
    ({"node.kubernetes.io/instance-type": "p6-b200.48xlarge"}, "B200",
     "node.kubernetes.io/instance-type"),
    # An unknown product label does not hide a known GKE label.
    ({"nvidia.com/gpu.product": "NVIDIA-Mystery", "cloud.google.com/gke-accelerator":
      "nvidia-b200"}, "B200", "cloud.google.com/gke-accelerator"),
    ({"kubernetes.io/os": "linux"}, None, None),
    ({"nvidia.com/gpu.product": "Tesla-T4-Unknown"}, None, None),
])
def test_classify(labels: dict[str, str], gpu_class: str | None, key: str | None) -> None:
    gpu_node = classify_node(node("n", labels))
    if gpu_class is None:
        assert gpu_node is None
        return
    assert gpu_node is not None
    assert (gpu_node.gpu_class, gpu_node.selector_key) == (gpu_class, key)
    assert gpu_node.selector_value == labels[key]  # type: ignore[index]


def test_pools_group_nodes_and_select_them_by_every_label_source() -> None:
    pools = discover_pools([
        node("h100-a", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
        node("h100-b", {"nvidia.com/gpu.product": "NVIDIA-H100-SXM5-80GB"}, gpus="4"),
        node("h100-gke", {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}),
        node("h200-a", {"nvidia.com/gpu.product": "NVIDIA-H200"}, unschedulable=True),
        node("cpu", {"kubernetes.io/os": "linux"}),
    ])
    assert sorted(pools) == ["H100", "H200"]
    h100 = pools["H100"]
    assert [n.name for n in h100.nodes] == ["h100-a", "h100-b", "h100-gke"]
    assert h100.max_gpus_per_node == 8
    terms = h100.node_affinity()["requiredDuringSchedulingIgnoredDuringExecution"][  # type: ignore[index]
        "nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                               "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"]}]},
        {"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "In",
                               "values": ["nvidia-h100-80gb"]}]},
    ]
    assert pools["H200"].schedulable_nodes == ()
    assert inventory_digest(pools) == "H100=3,H200=0"


def test_gpu_count_falls_back_to_the_count_label() -> None:
    gpu_node = classify_node(node("n", {"nvidia.com/gpu.product": "NVIDIA-H200",
                                        "nvidia.com/gpu.count": "4"}, gpus=None))
    assert gpu_node is not None and gpu_node.gpus == 4
