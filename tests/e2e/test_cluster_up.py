"""The local control plane for real: fake GPU nodes, GPU pods scheduled by the real scheduler
onto the right class only, made Running/Ready by kwok, and garbage collection by the real
controller-manager."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from kvtune.e2e.cluster import LocalCluster
from kvtune.e2e.gpu_nodes import DEFAULT_POOLS, GPU_CLASSES

pytestmark = pytest.mark.cluster


def wait_until(what: str, condition: Callable[[], Any], timeout_seconds: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds}s waiting for {what}")
        time.sleep(0.2)


def gpu_pod(name: str, product: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.33.0",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }],
        },
    }


def pod_ready(pod: client.V1Pod) -> bool:
    conditions = pod.status.conditions or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    return pod.status.phase == "Running" and ready


def test_fake_gpu_nodes_carry_gfd_labels_and_gpu_capacity(local_cluster: LocalCluster) -> None:
    with local_cluster.api_client() as api:
        nodes = client.CoreV1Api(api).list_node().items
    by_product: dict[str, list[client.V1Node]] = {}
    for node in nodes:
        by_product.setdefault(node.metadata.labels["nvidia.com/gpu.product"], []).append(node)
    expected = {GPU_CLASSES[p.gpu_class].product: p.nodes for p in DEFAULT_POOLS}
    assert {product: len(ns) for product, ns in by_product.items()} == expected
    assert expected == {"NVIDIA-H100-80GB-HBM3": 4, "NVIDIA-H200": 4, "NVIDIA-B200": 2}
    for node in nodes:
        labels = node.metadata.labels
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert int(labels["nvidia.com/gpu.memory"]) > 80_000
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    assert local_cluster.nodes_ready_by_pool() == {"B200": "2/2", "H100": "4/4", "H200": "4/4"}


def test_apiserver_reports_the_pinned_version(local_cluster: LocalCluster) -> None:
    with local_cluster.api_client() as api:
        version = client.VersionApi(api).get_code()
    # Stamped by build-binaries.sh; an unstamped build reports v0.0.0-master.
    assert version.git_version.startswith("v1.35.")
    assert version.minor == "35"


def test_gpu_pods_land_only_on_their_class_and_become_ready(local_cluster: LocalCluster) -> None:
    with local_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        names: dict[str, str] = {}
        for pool in DEFAULT_POOLS:
            product = GPU_CLASSES[pool.gpu_class].product
            for i in range(3):
                name = f"gpu-{pool.gpu_class.lower()}-{i}"
                core.create_namespaced_pod("default", gpu_pod(name, product, 4))
                names[name] = pool.gpu_class
        # More GPUs than any node has: the scheduler must leave it Pending, not place it.
        core.create_namespaced_pod("default", gpu_pod("too-big", "NVIDIA-H200", 9))

        def all_ready() -> list[client.V1Pod] | None:
            pods = [core.read_namespaced_pod(n, "default") for n in names]
            return pods if all(pod_ready(p) for p in pods) else None

        pods = wait_until("GPU pods Running and Ready", all_ready)
        for pod in pods:
            gpu_class = names[pod.metadata.name]
            assert pod.spec.node_name.startswith(gpu_class.lower() + "-"), pod.spec.node_name
            assert pod.status.pod_ip  # kwok assigns one from the pod CIDR

        def unschedulable() -> bool:
            pod = core.read_namespaced_pod("too-big", "default")
            conditions = pod.status.conditions or []
            return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

        wait_until("the 9-GPU pod to be reported Unschedulable", unschedulable)
        too_big = core.read_namespaced_pod("too-big", "default")
        assert too_big.spec.node_name is None and too_big.status.phase == "Pending"

        for name in [*names, "too-big"]:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_deployment_rolls_out_on_h200_and_is_garbage_collected(
    local_cluster: LocalCluster,
) -> None:
    labels = {"app": "gc-probe"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gc-probe", "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": gpu_pod("x", "NVIDIA-H200", 8)["spec"],
            },
        },
    }
    with local_cluster.api_client() as api:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        apps.create_namespaced_deployment("default", deployment)
        wait_until(
            "2 ready replicas",
            lambda: apps.read_namespaced_deployment("gc-probe", "default").status.ready_replicas
            == 2,
        )
        pods = core.list_namespaced_pod("default", label_selector="app=gc-probe").items
        assert len(pods) == 2
        # 8 GPUs each: the two replicas cannot share a node.
        assert len({p.spec.node_name for p in pods}) == 2
        assert all(p.spec.node_name.startswith("h200-") for p in pods)

        apps.delete_namespaced_deployment(
            "gc-probe", "default", propagation_policy="Background"
        )
        wait_until(
            "the garbage collector to delete the ReplicaSet and its pods",
            lambda: not core.list_namespaced_pod("default", label_selector="app=gc-probe").items
            and not apps.list_namespaced_replica_set(
                "default", label_selector="app=gc-probe"
            ).items,
        )
