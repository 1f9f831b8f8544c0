"""A refused pool changes nothing, on the real API server, although a new Service is not
dry-run (its dry run allocates a ClusterIP like the create: the largest API-server cost of a
new pool, issue 11's scale goal): the new Services are created first, before anything else
is written; a Service refused (a ResourceQuota on services) leaves the Deployment as it was
and deletes the Services this apply created; a Deployment refused at its dry run leaves no
new Service. The reconcile seam is called directly (no operator serves these namespaces)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    condition,
    create_infd,
    get_infd,
    patch_spec,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC

from kvtune.operator import reconcile as rec
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube.apply import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
QUOTA_NS, TEMPLATE_NS, TWO_NS = "aon-quota", "aon-template", "aon-two"


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, QUOTA_NS, TEMPLATE_NS, TWO_NS)


@dataclass
class RecordingKube(kapply.Kube):
    """The real connection, remembering each call's method, path and dry run."""

    calls: list[tuple[str, str, bool]] = field(default_factory=list)

    def request(self, method: str, api_path: str, **kwargs: Any) -> dict[str, Any]:
        dry = (kwargs.get("query") or {}).get("dryRun") == "All"
        self.calls.append((method, api_path.split("?")[0], dry))
        return super().request(method, api_path, **kwargs)

    def writes(self) -> list[tuple[str, bool]]:
        """(resource plural, dry run) of each PATCH of a pool's children, in order."""
        return [(p.split("/")[-2], dry) for m, p, dry in self.calls
                if m == "PATCH" and p.split("/")[-2] in ("deployments", "services",
                                                          "poddisruptionbudgets")]


def _spec(replicas: int = 1) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": replicas}]
    spec.pop("rollout")
    return spec


def _missing(read: Any, *args: Any) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        return exc.status == 404
    return False


def _quota_on_services(api: Any, namespace: str, services: int) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "services"}, "spec": {"hard": {"services": str(services)}}})
    # Admitted against the quota once its controller has counted what exists.
    wait_for(lambda: (core.read_namespaced_resource_quota("services", namespace).status.hard
                      or {}).get("services") == str(services),
             "the ResourceQuota controller to count services", 60)


def test_a_refused_service_leaves_the_deployment_as_it_was(cluster_api: Any) -> None:
    apps, core = client.AppsV1Api(cluster_api), client.CoreV1Api(cluster_api)
    create_infd(cluster_api, QUOTA_NS, "web", _spec())
    kube = RecordingKube(cluster_api)
    assert rec.reconcile(get_infd(cluster_api, QUOTA_NS, "web"), kube=kube).permanent_error \
        is None
    # The new Service is not dry-run, and is created before anything else is written.
    writes = kube.writes()
    assert ("services", True) not in writes
    assert writes[0] == ("deployments", True) and writes.index(("services", False)) < \
        writes.index(("deployments", False))
    # A new object's reconcile reads its Deployment once per planning pass (the render stage;
    # the apply knows it absent): two here, because the planned fp8 cannot be measured (no
    # calibration image) and the pool is planned again with the wider dtype held (issue 25's
    # fail-closed gate; knowing that before the first pass would save the second). Neither the
    # KV-quality report ConfigMaps nor the calibration Jobs are read: nothing of a
    # never-reconciled object can exist yet.
    reads = [p for m, p, _ in kube.calls if m == "GET"]
    assert reads.count(f"/apis/apps/v1/namespaces/{QUOTA_NS}/deployments/web-h100") == 2
    # Beside it only the cluster's model calibration (the closed loop's ConfigMap, read
    # once per planning pass): no KV-quality report, no search Job.
    assert not [p for p in reads if ("/configmaps" in p and not p.endswith(
        "/configmaps/kvtune-model-calibration")) or "/jobs" in p], reads
    before = apps.read_namespaced_deployment("web-h100", QUOTA_NS)
    assert before.spec.replicas == 1

    # The Service is gone and may not be made again; the spec asks for a changed Deployment.
    core.delete_namespaced_service("web-h100", QUOTA_NS)
    _quota_on_services(cluster_api, QUOTA_NS, 0)
    patch_spec(cluster_api, QUOTA_NS, "web", {"pools": [{"gpuClass": "H100", "replicas": 2}]})
    kube.calls.clear()
    rec.reconcile(get_infd(cluster_api, QUOTA_NS, "web"), kube=kube)
    # Once it has status, the report and the Jobs are read again.
    assert [p for m, p, _ in kube.calls if m == "GET" and "/configmaps/kvtune-kvq-" in p]
    assert [p for m, p, _ in kube.calls if m == "GET" and p.endswith("/jobs")]
    degraded = condition(get_infd(cluster_api, QUOTA_NS, "web"), "Degraded")
    assert degraded is not None and degraded["status"] == "True"
    assert degraded["reason"] == "ApplyFailed"
    assert "Service" in degraded["message"] and "quota" in degraded["message"]
    assert "nothing was changed" in degraded["message"]
    after = apps.read_namespaced_deployment("web-h100", QUOTA_NS)
    assert (after.metadata.generation, after.spec.replicas) == (before.metadata.generation, 1)
    assert _missing(core.read_namespaced_service, "web-h100", QUOTA_NS)

    # Without the quota the pool goes through: the Service back, the Deployment changed.
    core.delete_namespaced_resource_quota("services", QUOTA_NS)
    wait_for(lambda: rec.reconcile(get_infd(cluster_api, QUOTA_NS, "web"),
                                   kube=kube).permanent_error is None
             and not _missing(core.read_namespaced_service, "web-h100", QUOTA_NS),
             "the pool applied once the quota is gone", 60)
    assert apps.read_namespaced_deployment("web-h100", QUOTA_NS).spec.replicas == 2


def test_a_deployment_refused_at_its_dry_run_leaves_no_new_service(cluster_api: Any) -> None:
    core = client.CoreV1Api(cluster_api)
    # Renders valid YAML of the right shape, but a Deployment the API server refuses.
    template = ("spec:\n  containers:\n    - name: vllm\n      image: {{ image | tojson }}\n"
                "      args: {{ args | tojson }}\n"
                "      resources: {limits: {nvidia.com/gpu: not-a-quantity}}\n")
    core.create_namespaced_config_map(TEMPLATE_NS, {
        "metadata": {"name": "pod-tpl"}, "data": {"pod.yaml.j2": template}})
    spec = {**_spec(), "runtime": {"podTemplate": {"configMapRef": {"name": "pod-tpl"}}}}
    create_infd(cluster_api, TEMPLATE_NS, "tpl", spec)
    kube = RecordingKube(cluster_api)
    rec.reconcile(get_infd(cluster_api, TEMPLATE_NS, "tpl"), kube=kube)
    degraded = condition(get_infd(cluster_api, TEMPLATE_NS, "tpl"), "Degraded")
    assert degraded is not None and degraded["reason"] == "ApplyFailed"
    assert "Deployment" in degraded["message"] and "nothing was changed" in degraded["message"]
    assert kube.writes() == [("deployments", True)]  # refused at its dry run: nothing else
    assert _missing(core.read_namespaced_service, "tpl-h100", TEMPLATE_NS)
    assert _missing(client.AppsV1Api(cluster_api).read_namespaced_deployment, "tpl-h100",
                    TEMPLATE_NS)
    assert _missing(client.PolicyV1Api(cluster_api).read_namespaced_pod_disruption_budget,
                    "tpl-h100", TEMPLATE_NS)


def _service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": TWO_NS, "labels": {"app": "two"}},
            "spec": {"selector": {"app": "two"}, "ports": [{"port": 8000}]}}


def test_a_second_new_service_refused_deletes_the_first(cluster_api: Any) -> None:
    """A pool with routing has two Services (the model server's and its endpoint picker's):
    when the second is refused, the first, just created, is deleted again."""
    create_infd(cluster_api, TWO_NS, "two", _spec())
    owner = get_infd(cluster_api, TWO_NS, "two")
    _quota_on_services(cluster_api, TWO_NS, 1)
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "two", "namespace": TWO_NS, "labels": {"app": "two"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "two"}},
                 "template": {"metadata": {"labels": {"app": "two"}},
                              "spec": {"containers": [{"name": "app", "image": "busybox"}]}}}}
    kube = RecordingKube(cluster_api)
    with pytest.raises(kapply.ApplyError, match=r"Service aon-two/two-b .*quota"):
        kapply.apply_pool(kube, [deployment, _service("two-a"), _service("two-b")], owner)
    core = client.CoreV1Api(cluster_api)
    assert _missing(core.read_namespaced_service, "two-a", TWO_NS)
    assert _missing(core.read_namespaced_service, "two-b", TWO_NS)
    assert _missing(client.AppsV1Api(cluster_api).read_namespaced_deployment, "two", TWO_NS)
    assert [m for m, p, _ in kube.calls if p.endswith("/services/two-a")][-1] == "DELETE"


def test_a_deployment_that_appeared_after_it_was_read_absent_is_not_taken_over(
        cluster_api: Any) -> None:
    """The apply does not read again a Deployment the render stage read absent: it applies it
    without force, so one made meanwhile by someone else is refused (NameCollision) at its
    dry run, before anything of the pool is written."""
    create_infd(cluster_api, TWO_NS, "late", _spec())
    owner = get_infd(cluster_api, TWO_NS, "late")
    apps = client.AppsV1Api(cluster_api)
    theirs = {
        "metadata": {"name": "late", "labels": {"app": "theirs"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "theirs"}},
                 "template": {"metadata": {"labels": {"app": "theirs"}},
                              "spec": {"containers": [{"name": "app", "image": "busybox"}]}}}}
    apps.create_namespaced_deployment(TWO_NS, theirs)
    before = apps.read_namespaced_deployment("late", TWO_NS)
    ours = copy.deepcopy(theirs)
    ours.update(apiVersion="apps/v1", kind="Deployment")
    ours["metadata"].update(namespace=TWO_NS, labels={"app": "ours"})
    ours["spec"]["selector"]["matchLabels"] = {"app": "ours"}
    ours["spec"]["template"]["metadata"]["labels"] = {"app": "ours"}
    ours["spec"]["template"]["spec"]["containers"][0]["image"] = "ours:1"
    with pytest.raises(kapply.NameCollision, match="Deployment aon-two/late appeared"):
        kapply.apply_pool(Kube(cluster_api), [ours, _service("late")], owner,
                          absent=[("Deployment", "late")])
    after = apps.read_namespaced_deployment("late", TWO_NS)
    # Not its resourceVersion: the Deployment controller writes its status meanwhile. What
    # kvtune would have written is spec, labels and an owner reference.
    assert after.metadata.generation == before.metadata.generation
    assert after.metadata.labels == {"app": "theirs"}
    assert after.spec.template.spec.containers[0].image == "busybox"
    assert not after.metadata.owner_references
    assert _missing(client.CoreV1Api(cluster_api).read_namespaced_service, "late", TWO_NS)
