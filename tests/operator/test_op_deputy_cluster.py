"""kvtune is never a confused deputy (issue 11 item 2), on the real API server with its
garbage collector: an InferenceDeployment whose children's names are taken by objects kvtune
did not create for it (a Service routing someone's traffic, someone's Deployment) is
Degraded with NameCollision; those objects are not changed, not adopted (no owner
reference), and deleting the InferenceDeployment does not garbage-collect them (nor the Role
and RoleBinding named like the runtime's). The reconcile seam is called directly (no
operator serves this namespace)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    create_infd,
    create_runtime_access,
    ensure_namespace,
    get_infd,
    prepare_namespaces,
    wait_for,
    write_termination_message,
)
from op_samples import SAMPLE_SPEC

from kvtune.operator import reconcile as rec
from kvtune.operator.calibration import calibration_job as calibration
from kvtune.operator.kube.apply import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS = "deputy"


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, NS)


def _spec(**runtime: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    spec.pop("rollout")
    spec["runtime"] = runtime
    return spec


def _victims(api: Any) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service(NS, {
        "metadata": {"name": "web-h100", "labels": {"app": "victim"}},
        "spec": {"selector": {"app": "victim"}, "ports": [{"port": 80}]}})
    rbac.create_namespaced_role(NS, {
        "metadata": {"name": "bot-runtime"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
    client.AppsV1Api(api).create_namespaced_deployment(NS, {
        "metadata": {"name": "bot-h100", "labels": {"app": "victim"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "victim"}},
                 "template": {"metadata": {"labels": {"app": "victim"}},
                              "spec": {"containers": [{"name": "app", "image": "busybox"}]}}}})
    rbac.create_namespaced_role_binding(NS, {
        "metadata": {"name": "bot-runtime"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "bot-runtime"},
        "subjects": [{"kind": "User", "name": "victim"}]})


def _snapshot(api: Any) -> dict[str, Any]:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    service = core.read_namespaced_service("web-h100", NS)
    role = rbac.read_namespaced_role("bot-runtime", NS)
    binding = rbac.read_namespaced_role_binding("bot-runtime", NS)
    deployment = client.AppsV1Api(api).read_namespaced_deployment("bot-h100", NS)
    return {
        "deployment": (deployment.spec.template.spec.containers[0].image,
                       deployment.metadata.owner_references,
                       deployment.metadata.generation),
        "service": (service.spec.selector, service.metadata.owner_references,
                    service.metadata.resource_version),
        "role": (role.rules[0].resources, role.metadata.owner_references,
                 role.metadata.resource_version),
        "binding": ([s.name for s in binding.subjects], binding.metadata.owner_references,
                    binding.metadata.resource_version),
        "managers": sorted({m.manager for o in (service, role, binding, deployment)
                            for m in o.metadata.managed_fields or []}),
    }


def test_names_taken_by_foreign_objects_are_degraded_not_taken_over(cluster_api: Any) -> None:
    _victims(cluster_api)
    before = _snapshot(cluster_api)
    kube = Kube(cluster_api)
    create_infd(cluster_api, NS, "web", _spec())
    create_infd(cluster_api, NS, "bot", _spec(entrypoint="kvtune"))
    create_infd(cluster_api, NS, "fine", _spec())  # no collision: its objects are made
    for name, kind in (("web", "Service"), ("bot", "Deployment")):
        result = rec.reconcile(get_infd(cluster_api, NS, name), kube=kube)
        degraded = condition(get_infd(cluster_api, NS, name), "Degraded")
        assert degraded is not None and degraded["status"] == "True", result.status
        assert degraded["reason"] == "NameCollision"
        message = degraded["message"]
        assert f"{kind} {NS}/{name}-" in message and "kvtune did not create it" in message
        assert "rename" in message  # the fix
        # Again: still nothing taken over.
        rec.reconcile(get_infd(cluster_api, NS, name), kube=kube)
    assert _snapshot(cluster_api) == before
    assert "kvtune" not in before["managers"]
    # web's Deployment was not applied either: a pool's objects go all or nothing.
    apps = client.AppsV1Api(cluster_api)
    with pytest.raises(ApiException) as missing:
        apps.read_namespaced_deployment("web-h100", NS)
    assert missing.value.status == 404
    assert rec.reconcile(get_infd(cluster_api, NS, "fine"), kube=kube).permanent_error is None
    fine = apps.read_namespaced_deployment("fine-h100", NS)
    assert [r.name for r in fine.metadata.owner_references or []] == ["fine"]

    # Deleting the InferenceDeployments garbage-collects kvtune's objects only.
    custom = client.CustomObjectsApi(cluster_api)
    for name in ("web", "bot", "fine"):
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)

    def collected() -> bool:
        try:
            apps.read_namespaced_deployment("fine-h100", NS)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(collected, "the garbage collector to remove fine's Deployment", 90)
    assert _snapshot(cluster_api) == before


# A spec whose plan picks an unmeasured fp8 KV cache: kvtune starts a calibration Job
# (operator/calibration/calibration_flow.py) and stores the Job's report in a ConfigMap.
def _calibrating_spec() -> dict[str, Any]:
    spec = _spec(entrypoint="kvtune", image="ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0")
    spec["model"]["revision"] = "rev-deputy"
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec["workload"]["concurrentSequences"] = 200  # 16-bit KV holds too few: fp8 is planned
    spec["quality"] = {"lowestKVPrecision": "fp8"}
    return spec


def _unchanged(obj: Any) -> tuple[Any, ...]:
    meta = obj.metadata
    return (meta.uid, meta.labels, meta.annotations, meta.owner_references,
            getattr(obj, "data", None))


def test_calibration_job_and_report_names_taken_are_degraded_not_taken_over(
        cluster_api: Any) -> None:
    """The calibration Job and its report ConfigMap go through the same ownership check as
    the pool's objects: someone else's Job or ConfigMap of that name survives, unchanged and
    unowned, and the InferenceDeployment is Degraded/NameCollision."""
    kube = Kube(cluster_api)
    core, batch = client.CoreV1Api(cluster_api), client.BatchV1Api(cluster_api)
    ours_ns, theirs_ns, name = "deputy-kvq-a", "deputy-kvq-b", "chat"
    for ns in (ours_ns, theirs_ns):
        ensure_namespace(cluster_api, ns)
        create_runtime_access(cluster_api, ns)
    spec = _calibrating_spec()
    model, revision = spec["model"]["name"], spec["model"]["revision"]

    # 1. In ours_ns the Job is kvtune's; a victim ConfigMap holds the report's name.
    report_name = calibration.cache_name(name, model, revision)
    core.create_namespaced_config_map(ours_ns, {
        "metadata": {"name": report_name, "labels": {"app": "victim"}},
        "data": {calibration.REPORT_KEY: "{\"mine\": true}"}})
    victim_cm = core.read_namespaced_config_map(report_name, ours_ns)
    create_infd(cluster_api, ours_ns, name, spec)
    rec.reconcile(get_infd(cluster_api, ours_ns, name), kube=kube)
    kvq = get_infd(cluster_api, ours_ns, name)["status"]["kvQuality"]
    assert kvq["phase"] == "Calibrating", kvq
    job_name = kvq["job"]
    # kwok ends the Job's pod; the test writes the report where the Job's command would.
    pod = wait_for(lambda: next(iter(core.list_namespaced_pod(
        ours_ns, label_selector=f"batch.kubernetes.io/job-name={job_name}").items), None),
        "the calibration pod", 60)
    report = {"weights": "checkpoint", "measurements": [
        {"dtype": "fp8", "kl_mean": 3e-4, "top1_agreement": 0.99}]}
    write_termination_message(cluster_api, ours_ns, pod.metadata.name, json.dumps(report))
    wait_for(lambda: batch.read_namespaced_job(job_name, ours_ns).status.succeeded,
             "the Job Complete (kwok ends its pod)", 60)
    rec.reconcile(get_infd(cluster_api, ours_ns, name), kube=kube)
    degraded = condition(get_infd(cluster_api, ours_ns, name), "Degraded")
    assert degraded is not None and degraded["status"] == "True", degraded
    assert degraded["reason"] == "NameCollision", degraded
    assert f"ConfigMap {ours_ns}/{report_name} already exists" in degraded["message"]
    assert "kvtune did not create it" in degraded["message"]
    after = core.read_namespaced_config_map(report_name, ours_ns)
    assert _unchanged(after) == _unchanged(victim_cm)
    assert "kvtune" not in {m.manager for m in after.metadata.managed_fields or []}

    # 2. In theirs_ns someone else's Job holds the calibration Job's name (same
    #    InferenceDeployment name, model revision and dtypes: the same name).
    batch.create_namespaced_job(theirs_ns, {
        "metadata": {"name": job_name, "labels": {"app": "victim"}},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "app", "image": "busybox"}]}}}})
    victim_job = batch.read_namespaced_job(job_name, theirs_ns)
    create_infd(cluster_api, theirs_ns, name, spec)
    for _ in range(2):  # again: still nothing taken over
        rec.reconcile(get_infd(cluster_api, theirs_ns, name), kube=kube)
        degraded = condition(get_infd(cluster_api, theirs_ns, name), "Degraded")
        assert degraded is not None and degraded["status"] == "True", degraded
        assert degraded["reason"] == "NameCollision", degraded
        assert f"Job {theirs_ns}/{job_name} already exists" in degraded["message"]
    after_job = batch.read_namespaced_job(job_name, theirs_ns)
    assert _unchanged(after_job) == _unchanged(victim_job)
    assert after_job.spec.template.spec.containers[0].image == "busybox"
    assert "kvtune" not in {m.manager for m in after_job.metadata.managed_fields or []}
    # Nothing of the pool was applied while its calibration Job could not start.
    assert client.AppsV1Api(cluster_api).list_namespaced_deployment(theirs_ns).items == []
