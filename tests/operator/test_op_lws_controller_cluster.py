"""A multi-node pool against the real LeaderWorkerSet controller (issue 26 item 2): the pinned
lws release's controller manager (built from the Go module proxy, e2e/lws_controller.py) runs
against the local control plane with its webhooks, so the groups' pods, their labels and the
``LWS_*`` variables kvtune's command line expands, and the LWS status the operator follows
to Ready, are the controller's own (kwok makes the pods Ready on the fake H100 nodes). The
reconcile seam is called directly, as in test_op_roles_cluster.py."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bad_specs import BASE
from kubernetes import client
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    get_infd,
    install_crd,
    prepare_namespaces,
)
from test_op_leader_worker_set import TWO_NODES
from waiting import wait_for

from kvtune.e2e.gpu_nodes import POOL_LABEL
from kvtune.e2e.leader_worker_set import controller_crd_paths
from kvtune.e2e.lws_controller import CONFIG_NAME_PREFIX, SET_NAME_LABEL, LwsController
from kvtune.operator import reconcile as rec
from kvtune.operator.api.names import LABEL_DEPLOYMENT, LABEL_POOL
from kvtune.operator.kube.apply import Kube
from kvtune.operator.render import leader_worker_set as lws

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS = "lws-controller"
NAME, SET = "dsv3", "dsv3-h100"
LWS_GROUP, LWS_API_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
# The labels the controller and its pod webhook put on a group's pods (api/leaderworkerset/v1).
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
GROUP_SIZE = TWO_NODES["nodesPerReplica"]
GROUPS = TWO_NODES["replicas"]


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    api = prepare_namespaces(local_cluster, NS)
    for path in controller_crd_paths():
        install_crd(api, path)
    return api


@pytest.fixture(scope="module")
def controller(cluster_api: Any, local_cluster: Any,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[LwsController]:
    with LwsController(Path(local_cluster.kubeconfig_path), [NS],
                       tmp_path_factory.mktemp("lws-controller")) as running:
        yield running
    # Its webhooks go with it: no later module's admission waits on a server that is gone.
    admission = client.AdmissionregistrationV1Api(cluster_api)
    left = [c.metadata.name for c in [
        *admission.list_mutating_webhook_configuration().items,
        *admission.list_validating_webhook_configuration().items]
        if c.metadata.name.startswith(CONFIG_NAME_PREFIX)]
    assert not left, left


def _pods(api: Any) -> list[Any]:
    pods: list[Any] = client.CoreV1Api(api).list_namespaced_pod(
        NS, label_selector=f"{SET_NAME_LABEL}={SET}").items
    return pods


def _lws_status(api: Any) -> dict[str, Any]:
    held = client.CustomObjectsApi(api).get_namespaced_custom_object(
        LWS_GROUP, LWS_API_VERSION, NS, LWS_PLURAL, SET)
    status: dict[str, Any] = held.get("status") or {}
    return status


def _env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _check_group_pods(pods: list[Any]) -> None:
    """What the controller and its webhook made of kvtune's templates: per group a leader
    (worker index 0) and a worker, labelled with their group and index, each with the
    leader's address, the group size and its index in its environment, one to a node."""
    by_group: dict[str, dict[str, Any]] = {}
    for pod in pods:
        labels = pod.metadata.labels
        assert labels[LABEL_DEPLOYMENT] == NAME and labels[LABEL_POOL] == "h100", labels
        by_group.setdefault(labels[GROUP_INDEX_LABEL], {})[
            labels[lws.LABEL_WORKER_INDEX]] = pod
    assert sorted(by_group) == [str(g) for g in range(GROUPS)], by_group
    for group, members in by_group.items():
        assert sorted(members) == [str(i) for i in range(GROUP_SIZE)], members
        leader = members["0"]
        assert leader.metadata.name == f"{SET}-{group}"
        # UniquePerReplica: the group's headless Service is named after its leader.
        assert leader.spec.subdomain == leader.metadata.name, leader.spec
        for index, pod in members.items():
            env = _env(pod)
            # The leader's DNS name in its group's headless Service.
            assert env[lws.ENV_LEADER_ADDRESS] == \
                f"{leader.metadata.name}.{leader.spec.subdomain}.{NS}", env
            assert env[lws.ENV_WORKER_INDEX] == index, env
            assert env["LWS_GROUP_SIZE"] == str(GROUP_SIZE), env
            assert pod.spec.subdomain == leader.spec.subdomain
        worker = members["1"].spec.containers[0]
        assert worker.command[:2] == ["/bin/sh", "-c"] and lws.HEADLESS_FLAG in worker.args
        assert f"{lws.DATA_PARALLEL_ADDRESS_FLAG}=$({lws.ENV_LEADER_ADDRESS})" in \
            leader.spec.containers[0].args
    nodes = [pod.spec.node_name for pod in pods]
    assert len(set(nodes)) == len(nodes), nodes  # 8 GPUs a pod: one pod a node


def _leader_resolves(api: Any, pod: Any) -> bool:
    """Whether the leader's address names a headless Service selecting the leader (what
    cluster DNS needs to answer ``<pod>.<subdomain>.<namespace>``)."""
    service = client.CoreV1Api(api).read_namespaced_service(pod.spec.subdomain, NS)
    selector = service.spec.selector or {}
    return service.spec.cluster_ip == "None" and bool(selector) and all(
        pod.metadata.labels.get(k) == v for k, v in selector.items())


def test_the_real_controller_runs_a_multi_node_pool_to_ready(
        cluster_api: Any, controller: LwsController) -> None:
    spec = copy.deepcopy(BASE)
    spec["model"], spec["pools"] = {"name": "deepseek-ai/DeepSeek-V3"}, [TWO_NODES]
    client.CustomObjectsApi(cluster_api).create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
            "metadata": {"name": NAME, "namespace": NS}, "spec": spec})
    rec.reconcile(get_infd(cluster_api, NS, NAME), kube=Kube(cluster_api))
    stored = get_infd(cluster_api, NS, NAME)
    assert stored["status"]["pools"][0]["phase"] == "Applied", stored["status"]
    template = client.CustomObjectsApi(cluster_api).get_namespaced_custom_object(
        LWS_GROUP, LWS_API_VERSION, NS, LWS_PLURAL, SET)["spec"]["leaderWorkerTemplate"]
    # The variables are not in kvtune's templates: only the controller's webhook adds them.
    rendered_env = template["leaderTemplate"]["spec"]["containers"][0].get("env") or []
    assert lws.ENV_LEADER_ADDRESS not in {e["name"] for e in rendered_env}

    log = controller.log_path
    pods = wait_for(lambda: (p := _pods(cluster_api)) and len(p) == GROUPS * GROUP_SIZE and
                    all(_ready(x) for x in p) and p, f"{GROUPS}x{GROUP_SIZE} Ready pods of "
                    f"LWS {SET}", 60, log)
    _check_group_pods(pods)
    for pod in pods:
        node = client.CoreV1Api(cluster_api).read_node(pod.spec.node_name)
        assert node.metadata.labels[POOL_LABEL] == "H100", node.metadata.labels
    leaders = [p for p in pods if p.metadata.labels[lws.LABEL_WORKER_INDEX] == "0"]
    assert all(_leader_resolves(cluster_api, p) for p in leaders), [
        (p.metadata.name, p.spec.subdomain) for p in leaders]
    # The pool's own Service (HTTP to the leaders) is kvtune's, beside the groups' headless ones.
    pool_service = client.CoreV1Api(cluster_api).read_namespaced_service(SET, NS)
    assert pool_service.spec.cluster_ip not in (None, "None"), pool_service.spec
    assert pool_service.spec.selector[lws.LABEL_WORKER_INDEX] == "0"

    def available() -> dict[str, Any] | None:
        status = _lws_status(cluster_api)
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        return status if conditions.get("Available") == "True" else None

    status = wait_for(available, f"the controller to report LWS {SET} Available", 60, log)
    assert status["readyReplicas"] == GROUPS and status["updatedReplicas"] == GROUPS, status

    rec.refresh_rollout(get_infd(cluster_api, NS, NAME), kube=Kube(cluster_api))
    stored = get_infd(cluster_api, NS, NAME)
    ready = condition(stored, "Ready")
    assert ready is not None and ready["status"] == "True", stored["status"]
    assert ready["reason"] == "AllPoolsApplied", ready
    assert f"{GROUPS}/{GROUPS} groups updated and ready" in \
        stored["status"]["pools"][0]["message"], stored["status"]["pools"][0]
