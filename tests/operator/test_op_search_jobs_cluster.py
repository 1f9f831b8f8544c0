"""A pool's capacity search as a Kubernetes Job (issue 22 item 4), on the real API server with
kwok (which runs no containers), the reconcile seam called directly with ``search.mode: job``:

- the operator creates the input ConfigMap and the Job, both owned by the
  InferenceDeployment and keyed by the input's digest, with the least-privilege spec the API
  server validated and defaulted; the pool shows ``Searching`` and ``SearchRunning``;
- the node's part is played by the test: the Job's container command runs here (the built
  wheel's ``kvtune``, ``KVTUNE_OPERATOR_BIN``) on the ConfigMap's contents written where the
  volume would be mounted, and what it wrote to its termination-log file is written into the
  pod's status once kwok has ended the pod, as the kubelet would;
- the next reconcile plans the pool from that answer (the same plan as the in-process
  search), keeps the answer in the ConfigMap and deletes the Job;
- new inputs start a new Job and delete the old inputs' ConfigMap; an answer for the old
  inputs left on the new Job's pod is never used (the Job is SearchJobFailed, naming why);
- a pool taken out of the spec loses its search Job and ConfigMap;
- deleting the InferenceDeployment garbage-collects the Job and the ConfigMap.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    create_infd,
    get_infd,
    patch_spec,
    prepare_namespaces,
    wait_for,
    write_termination_message,
)
from op_samples import SAMPLE_SPEC

from kvtune.e2e.operator_command import operator_executable
from kvtune.operator import reconcile as rec
from kvtune.operator.kube.apply import Kube, path
from kvtune.operator.render.objects import LABEL_DEPLOYMENT
from kvtune.operator.search import search_budget, search_job_flow, search_jobs
from kvtune.tuner.simulator import search_job

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS = "search-jobs"
NAME = "chat"
IMAGE = "ghcr.io/kvtune/kvtune:0.0.0-test"
# A small budget keeps the search (run here, on a shared machine) to seconds.
CPU_SECONDS = 8.0


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, NS)


@pytest.fixture(autouse=True)
def job_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(search_jobs.ENV_MODE, "job")
    monkeypatch.setenv(search_jobs.ENV_IMAGE, IMAGE)
    monkeypatch.setattr(search_budget.CONFIG, "cpu_seconds", CPU_SECONDS)
    search_job_flow.forget()
    yield
    search_job_flow.forget()


def _spec(rate: float) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    spec.pop("rollout")
    spec["tuning"]["mode"] = "recommend"  # plans in status; nothing needs GPUs
    spec["workload"]["requestRatePerSecond"] = rate
    return spec


def _listed(kube: Kube, kind: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.request("GET", path(kind, NS), query={
        "labelSelector": f"{LABEL_DEPLOYMENT}={NAME},{search_jobs.LABEL_SEARCH}"})["items"]
    return items


def _absent(kube: Kube, kind: str, name: str) -> bool:
    try:
        kube.request("GET", path(kind, NS, name))
    except ApiException as exc:
        return exc.status == 404
    return False


def _pool(kube: Kube) -> dict[str, Any]:
    pools: list[dict[str, Any]] = get_infd(kube.api_client, NS, NAME)["status"]["pools"]
    return pools[0]


def _run_as_the_node(job: dict[str, Any], config_map: dict[str, Any], where: Path) -> str:
    """The Job's container command, run here with the built wheel's kvtune; the ConfigMap's
    items written where the volume is mounted. Returns what it left as termination message."""
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    mount = where / "inputs"
    mount.mkdir()
    for item in volume["configMap"]["items"]:
        (mount / item["path"]).write_text(config_map["data"][item["key"]])
    log = where / "termination-log"
    command = [str(operator_executable())] + [
        arg.replace(mounts["inputs"], str(mount))
        .replace(container["terminationMessagePath"], str(log))
        for arg in container["command"][1:]]
    assert container["command"][0] == "kvtune"
    subprocess.run(command, check=True, timeout=600, capture_output=True)
    return log.read_text()


def _pod_of(api: Any, job: str) -> str:
    from kubernetes import client

    core = client.CoreV1Api(api)
    pod = wait_for(lambda: next(iter(core.list_namespaced_pod(
        NS, label_selector=f"batch.kubernetes.io/job-name={job}").items), None),
        f"kwok's pod of Job {job}", 60)
    return str(pod.metadata.name)


def _assert_least_privilege(job: dict[str, Any], owner_uid: str) -> None:
    """The Job as the API server stored it (validated, defaulted)."""
    assert job["metadata"]["ownerReferences"][0]["uid"] == owner_uid
    spec = job["spec"]
    assert spec["backoffLimit"] == 2 and spec["ttlSecondsAfterFinished"] == 3600
    assert spec["activeDeadlineSeconds"] == 2 * CPU_SECONDS + search_jobs.DEADLINE_SLACK_SECONDS
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod.get("serviceAccountName", "default") == "default"
    assert pod["restartPolicy"] == "Never" and pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["image"] == IMAGE and c["command"][:2] == ["kvtune", "search-worker"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert c["terminationMessagePath"] == "/dev/termination-log"


def test_the_search_runs_as_a_job_and_its_answer_plans_the_pool(cluster_api: Any,
                                                                 tmp_path: Path) -> None:
    kube = Kube(cluster_api)
    create_infd(cluster_api, NS, NAME, _spec(rate=3.0))
    uid = get_infd(cluster_api, NS, NAME)["metadata"]["uid"]

    # 1. The operator starts the Job; the pool says so and the reconcile does not wait.
    result = rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)
    assert result.retry_after == search_jobs.POLL_SECONDS
    pool = _pool(kube)
    assert pool["phase"] == "Searching" and "runs as Job" in pool["message"], pool
    progressing = condition(get_infd(cluster_api, NS, NAME), "Progressing")
    ready = condition(get_infd(cluster_api, NS, NAME), "Ready")
    assert progressing is not None and progressing["reason"] == "SearchRunning", progressing
    assert ready is not None and (ready["status"], ready["reason"]) == ("False",
                                                                         "SearchRunning")
    (job,), (config_map,) = _listed(kube, "Job"), _listed(kube, "ConfigMap")
    digest = config_map["metadata"]["annotations"][search_jobs.ANNOTATION_DIGEST]
    doc = search_job.parse_input(config_map["data"][search_jobs.INPUT_KEY])
    assert doc.digest() == digest == job["metadata"]["annotations"][
        search_jobs.ANNOTATION_DIGEST]
    assert job["metadata"]["name"] == config_map["metadata"]["name"] == \
        search_jobs.resource_name(NAME, "h100", digest)
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == uid
    assert doc.request.profile.request_rate_per_second == 3.0
    assert doc.cpu_seconds == CPU_SECONDS and doc.running is None
    _assert_least_privilege(job, uid)
    # Looked at again before it ends: still running, the same Job (none added).
    rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)
    assert _pool(kube)["phase"] == "Searching" and len(_listed(kube, "Job")) == 1

    # 2. The node's part: the command on the mounted input; the kubelet's termination message.
    message = _run_as_the_node(job, config_map, tmp_path)
    answer = search_job.decode(message)
    assert answer is not None and answer.digest == digest and answer.plan is not None
    assert len(message.encode()) <= search_job.TERMINATION_MESSAGE_MAX_BYTES
    job_name = job["metadata"]["name"]
    write_termination_message(cluster_api, NS, _pod_of(cluster_api, job_name), message)
    wait_for(lambda: (kube.request("GET", path("Job", NS, job_name)).get("status") or {})
             .get("succeeded"), "the Job Complete (kwok ends its pod)", 60)

    # 3. The pool is planned from the Job's answer; the answer kept; the Job deleted.
    search_job_flow.forget()  # read from the API, not from this process's memory
    rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)
    pool = _pool(kube)
    assert pool["phase"] == "Recommended", pool
    plan = answer.plan.plan
    assert (pool["plan"]["kvCacheDtype"], pool["plan"]["maxNumSeqs"],
            pool["plan"]["maxNumBatchedTokens"], pool["plan"]["blockSize"]) == (
        plan.kv_cache_dtype, plan.max_num_seqs, plan.max_num_batched_tokens, plan.block_size)
    assert pool["expected"]["sloAttainment"] is not None  # the search's figures, as in-process
    wait_for(lambda: _absent(kube, "Job", job_name), "the read Job deleted", 30)
    kept = kube.request("GET", path("ConfigMap", NS, job_name))
    assert search_jobs.stored_result(kept, uid, digest) == answer

    # 4. New inputs: a new Job; the old inputs' ConfigMap deleted.
    patch_spec(cluster_api, NS, NAME, {"workload": {**SAMPLE_SPEC["workload"],
                                                    "requestRatePerSecond": 5.0}})
    rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)
    (job2,) = _listed(kube, "Job")
    digest2 = job2["metadata"]["annotations"][search_jobs.ANNOTATION_DIGEST]
    assert digest2 != digest
    assert _absent(kube, "ConfigMap", job_name)
    assert [c["metadata"]["name"] for c in _listed(kube, "ConfigMap")] == [
        job2["metadata"]["name"]]
    assert _pool(kube)["phase"] == "Searching"
    assert _pool(kube)["plan"] is not None  # the plan in force stays shown meanwhile

    # 5. The old inputs' answer on the new Job's pod is not used.
    job2_name = job2["metadata"]["name"]
    write_termination_message(cluster_api, NS, _pod_of(cluster_api, job2_name), message)
    wait_for(lambda: (kube.request("GET", path("Job", NS, job2_name)).get("status") or {})
             .get("succeeded"), "the second Job Complete", 60)
    rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)
    degraded = condition(get_infd(cluster_api, NS, NAME), "Degraded")
    assert degraded is not None and degraded["reason"] == "SearchJobFailed", degraded
    assert f"the search Job {job2_name} failed" in degraded["message"]
    assert "no answer for these inputs" in degraded["message"]
    assert "\n" not in degraded["message"]
    assert _pool(kube)["phase"] == "Failed"

    # 6. A pool taken out of the spec: its search Job and ConfigMap go; the new pool's come.
    patch_spec(cluster_api, NS, NAME, {"pools": [{"gpuClass": "H200", "replicas": 1}]})
    rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)
    assert _absent(kube, "Job", job2_name) and _absent(kube, "ConfigMap", job2_name)
    (job3,) = _listed(kube, "Job")
    assert job3["metadata"]["labels"]["kvtune.io/pool"] == "h200"

    # 7. Deleting the InferenceDeployment garbage-collects the Job and the ConfigMap.
    from kubernetes import client

    client.CustomObjectsApi(cluster_api).delete_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, NAME, propagation_policy="Background")
    wait_for(lambda: not _listed(kube, "Job") and not _listed(kube, "ConfigMap"),
             "the search Job and ConfigMap garbage-collected", 60)


def test_the_retune_timer_replans_a_drifted_pool_by_job(cluster_api: Any,
                                                        tmp_path: Path) -> None:
    """The retune timer's re-plan (``search_job_stage.plan_for_retune``): not decided while
    the Job runs (a line saying so), the plan once the Job answered."""
    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.api.workloads import declared_profile
    from kvtune.operator.rollout import plan as plan_stage
    from kvtune.operator.rollout import search_job_stage

    kube, name = Kube(cluster_api), "drift"
    create_infd(cluster_api, NS, name, _spec(rate=3.0))
    body = get_infd(cluster_api, NS, name)
    spec = InferenceDeploymentSpec.model_validate(body["spec"])
    model = plan_stage.resolve_model(spec, NS, kube)
    observed = declared_profile(spec.workload).model_copy(
        update={"source": "prometheus", "request_rate_per_second": 4.5})

    def replan() -> Any:
        return search_job_stage.plan_for_retune(
            kube, body, spec, spec.pools[0], model, observed, plan_stage.policy_for(spec),
            None, running=None, scope="deployment")

    first = replan()
    assert isinstance(first, str) and "runs as Job" in first, first
    jobs = kube.request("GET", path("Job", NS), query={
        "labelSelector": f"{LABEL_DEPLOYMENT}={name},{search_jobs.LABEL_SEARCH}"})["items"]
    (job,) = jobs
    config_map = kube.request("GET", path("ConfigMap", NS, job["metadata"]["name"]))
    assert search_job.parse_input(config_map["data"][search_jobs.INPUT_KEY]) \
        .request.profile.request_rate_per_second == 4.5
    message = _run_as_the_node(job, config_map, tmp_path)
    write_termination_message(cluster_api, NS, _pod_of(cluster_api, job["metadata"]["name"]),
                              message)
    wait_for(lambda: (kube.request("GET", path("Job", NS, job["metadata"]["name"]))
                      .get("status") or {}).get("succeeded"), "the Job Complete", 60)
    plan = replan()
    answer = search_job.decode(message)
    assert answer is not None and answer.plan is not None
    assert not isinstance(plan, str) and plan is not None
    assert plan.plan == answer.plan.plan
