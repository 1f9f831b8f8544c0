"""The KV-quality guardrail against the real control plane (issue 15), end to end on the CPU.

kwok runs no container, so the test plays the kubelet's part for the calibration Job: it runs
the Job's own command (`python3 -m kvtune.quality` with the rendered args) as a process on a
small Llama-shaped checkpoint initialised with random weights (saved like a real one: this
proves the mechanics, not a model's quality), authenticated as the pod's ServiceAccount (a
TokenRequest token), so the report lands on the Job's pod through the API server as it would
in a cluster. The scheduler places the Job's pod: on a node of the pool's GPU class, with
the pool's GPU request, or nowhere.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    create_infd,
    get_infd,
    patch_spec,
    prepare_namespaces,
    service_account_client,
    service_account_dir,
    write_termination_message,
)
from op_samples import SAMPLE_SPEC
from waiting import wait_for

from kvtune.operator.calibration import calibration_job as calibration
from kvtune.operator.kube import apply as kapply
from kvtune.operator.reconcile import reconcile

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS, NAME = "op-kv-quality", "chat"
REVISION = "rev-1"
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def api(local_cluster: Any) -> Any:
    # With the chart's runtime access objects, for entrypoint kvtune's pods.
    return prepare_namespaces(local_cluster, NS, runtime_access=(NS,))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint on disk (random weights, seeded), as a model volume holds."""
    import torch
    import transformers

    path = Path(tmp_path_factory.mktemp("tiny-llama"))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**TINY), dtype=torch.bfloat16)
    model.save_pretrained(path)
    return path


def _reconcile(api: Any) -> dict[str, Any]:
    kube = kapply.Kube(api)
    reconcile(get_infd(api, NS, NAME), kube=kube)
    return get_infd(api, NS, NAME)


def _kv_reason(obj: dict[str, Any]) -> str:
    pool = obj["status"]["pools"][0]
    return next(r for r in pool["reasons"] if r.startswith("kv-cache-dtype"))


def _run_the_jobs_command(job: dict[str, Any], pod: Any, checkpoint: Path, local_cluster: Any,
                          api: Any, tmp: Path) -> subprocess.CompletedProcess[str]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = list(container["args"])
    # The kubelet's part: the model volume is this checkpoint, the device the CPU, the
    # termination log a file.
    args[args.index("--model") + 1] = str(checkpoint)
    args[args.index("--device") + 1] = "cpu"
    args[args.index("--termination-log") + 1] = str(tmp / "termination-log")
    sa_dir = service_account_dir(api, Path(local_cluster.kubeconfig_path), NS,
                                 pod.spec.service_account_name, tmp / "serviceaccount")
    host, port = local_cluster.server.removeprefix("https://").rsplit(":", 1)
    env = {**os.environ, "POD_NAME": pod.metadata.name, "POD_NAMESPACE": NS,
           "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
           "KVTUNE_SERVICEACCOUNT_DIR": str(sa_dir),
           "KVTUNE_STATUS_FILE": str(tmp / "status.json")}
    assert container["command"] == ["python3", "-m", "kvtune.quality"]
    return subprocess.run([sys.executable, "-m", "kvtune.quality", *args], env=env,
                          capture_output=True, text=True, timeout=900, check=False)


def test_calibration_job_then_gating_on_its_report(
    local_cluster: Any, api: Any, checkpoint: Path, tmp_path: Path,
) -> None:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["model"]["revision"] = REVISION
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec.pop("rollout")
    spec["workload"]["concurrentSequences"] = 200  # 16-bit KV holds too few: fp8 is planned
    spec["runtime"] = {"entrypoint": "kvtune",
                       "image": "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0"}
    spec["quality"] = {"lowestKVPrecision": "fp8",
                       "calibration": {"timeout": "20m", "maxPromptTokens": 24}}
    create_infd(api, NS, NAME, spec)

    # 1. fp8 is planned but unmeasured: the Job starts, the pool keeps 16-bit KV meanwhile.
    obj = _reconcile(api)
    kvq = obj["status"]["kvQuality"]
    assert kvq["phase"] == "Calibrating" and kvq["revision"] == REVISION, kvq
    assert obj["status"]["pools"][0]["plan"]["kvCacheDtype"] == "auto"
    assert "fp8, fp8_per_token_head, int8_per_token_head" in _kv_reason(obj)
    assert f"the calibration Job {kvq['job']} (running) keeps it out" in _kv_reason(obj)
    batch = client.BatchV1Api(api)
    job = api.sanitize_for_serialization(batch.read_namespaced_job(kvq["job"], NS))
    deployment = kapply.read_deployment(kapply.Kube(api), NS, f"{NAME}-h200")
    assert deployment is not None
    job_pod, dep_pod = job["spec"]["template"]["spec"], deployment["spec"]["template"]["spec"]
    assert job_pod["affinity"] == dep_pod["affinity"]
    # The pool's requests; no memory limit (transformers loads the checkpoint on the host).
    job_res, dep_res = job_pod["containers"][0]["resources"], dep_pod["containers"][0]["resources"]
    assert job_res["requests"] == dep_res["requests"]
    assert job_res["limits"] == {k: v for k, v in dep_res["limits"].items() if k != "memory"}
    assert job_pod["serviceAccountName"] == dep_pod["serviceAccountName"]
    args = job_pod["containers"][0]["args"]
    assert args[args.index("--model") + 1] == SAMPLE_SPEC["model"]["name"]
    assert args[args.index("--dtypes") + 1].split(",")[0] == "fp8"
    assert [o["uid"] for o in job["metadata"]["ownerReferences"]] == [obj["metadata"]["uid"]]

    # 2. The scheduler puts the Job's pod on an H200 node (affinity + GPU request).
    core = client.CoreV1Api(api)
    pod = wait_for(lambda: next((p for p in core.list_namespaced_pod(
        NS, label_selector=f"batch.kubernetes.io/job-name={kvq['job']}").items
        if p.spec.node_name), None), "the calibration pod scheduled", 60)
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"

    # 3. The Job's own command, run as the pod's ServiceAccount: the report lands on the pod.
    ran = _run_the_jobs_command(job, pod, checkpoint, local_cluster, api, tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "report published:" in ran.stderr and "failed" not in ran.stderr.split(
        "report published:")[1].splitlines()[0], ran.stderr[-2000:]
    # The compact report in the termination log, which the kubelet makes the container's
    # termination message (the only channel the operator trusts: issue 25).
    text = (tmp_path / "termination-log").read_text()
    assert json.loads(text)["weights"] == "checkpoint"
    write_termination_message(api, NS, pod.metadata.name, text)

    # 4. The operator keeps the report (ConfigMap per model revision) and gates on it.
    wait_for(lambda: batch.read_namespaced_job(kvq["job"], NS).status.succeeded,
             "the Job Complete (kwok ends its pod)", 60)
    obj = _reconcile(api)
    kvq = obj["status"]["kvQuality"]
    assert kvq["phase"] == "Measured", kvq
    cm = core.read_namespaced_config_map(kvq["configMap"], NS)
    assert cm.metadata.annotations[calibration.ANNOTATION_REVISION] == REVISION
    stored = json.loads(cm.data[calibration.REPORT_KEY])
    measured = {m["dtype"]: m for m in stored["measurements"]}
    assert {"fp8", "fp8_per_token_head", "int8_per_token_head"} <= set(measured)
    assert obj["status"]["pools"][0]["plan"]["kvCacheDtype"] == "fp8"
    assert "quality: measured KL" in _kv_reason(obj)
    assert f"configmap/{kvq['configMap']}" in _kv_reason(obj)

    # 5. A limit below fp8's measured KL excludes it, quoting the figure; a wider-scaled
    #    8-bit dtype measured within the limit is chosen instead.
    fp8_kl = measured["fp8"]["kl_mean"]
    assert measured["int8_per_token_head"]["kl_mean"] < fp8_kl
    patch_spec(api, NS, NAME, {"quality": {"maxKVQuantizationKL": fp8_kl * 0.99}})
    obj = _reconcile(api)
    pool = obj["status"]["pools"][0]
    assert pool["plan"]["kvCacheDtype"] != "fp8"
    assert f"fp8 ruled out: measured KL {fp8_kl:.2e} nats" in _kv_reason(obj)
    assert "exceeds quality.maxKVQuantizationKL" in _kv_reason(obj)
    assert [d["allowed"] for d in obj["status"]["kvQuality"]["dtypes"]
            if d["dtype"] == "fp8"] == [False]


def test_a_calibration_that_leaves_no_report_keeps_the_wider_dtype(api: Any) -> None:
    """kwok ends the Job's pod at once and nothing runs in it: the Job is Complete without a
    report, which is a failed calibration: the pool keeps 16-bit KV and says why."""
    name = "silent"
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["model"]["revision"] = "rev-silent"
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec.pop("rollout")
    spec["workload"]["concurrentSequences"] = 200
    spec["runtime"] = {"entrypoint": "kvtune",
                       "image": "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0"}
    create_infd(api, NS, name, spec)
    kube = kapply.Kube(api)
    reconcile(get_infd(api, NS, name), kube=kube)
    job = get_infd(api, NS, name)["status"]["kvQuality"]["job"]
    batch = client.BatchV1Api(api)
    wait_for(lambda: batch.read_namespaced_job(job, NS).status.succeeded,
             "the Job Complete (kwok ends its pod)", 60)
    reconcile(get_infd(api, NS, name), kube=kube)
    obj = get_infd(api, NS, name)
    kvq = obj["status"]["kvQuality"]
    assert kvq["phase"] == "Failed" and "left no report" in kvq["message"], kvq
    assert "the wider dtype stays" in kvq["message"]
    pool = obj["status"]["pools"][0]
    assert pool["plan"]["kvCacheDtype"] == "auto"
    reason = next(r for r in pool["reasons"] if r.startswith("kv-cache-dtype"))
    assert f"the failed calibration Job {job} keeps it out" in reason
    # No second Job while the failed one is kept (a day): the wider dtype simply stays.
    reconcile(get_infd(api, NS, name), kube=kube)
    jobs = batch.list_namespaced_job(NS, label_selector=f"kvtune.io/deployment={name}").items
    assert [j.metadata.name for j in jobs] == [job]


def test_a_report_in_the_shared_reports_config_map_vouches_for_nothing(
        local_cluster: Any, api: Any) -> None:
    """Issue 25: any pod of the runtime's account (another InferenceDeployment's, here its
    token) may write the namespace's kvtune-runtime-reports ConfigMap. A measurement it puts
    there under the calibration pod's name must not count: the Job left no termination
    message, so the calibration failed and the wider dtype stays (before: Measured, fp8)."""
    name = "vouched"
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["model"]["revision"] = "rev-vouched"
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec.pop("rollout")
    spec["workload"]["concurrentSequences"] = 200
    spec["runtime"] = {"entrypoint": "kvtune",
                       "image": "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0"}
    create_infd(api, NS, name, spec)
    kube = kapply.Kube(api)
    reconcile(get_infd(api, NS, name), kube=kube)
    job = get_infd(api, NS, name)["status"]["kvQuality"]["job"]
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    pod = wait_for(lambda: next(iter(core.list_namespaced_pod(
        NS, label_selector=f"batch.kubernetes.io/job-name={job}").items), None),
        "the calibration pod", 60)
    forged = {"schema": "kvtune.io/kv-quality/v1", "weights": "checkpoint", "measurements": [
        {"dtype": d, "kl_mean": 1e-6, "top1_agreement": 1.0}
        for d in ("fp8", "fp8_per_token_head", "int8_per_token_head")]}
    other_pod = service_account_client(api, Path(local_cluster.kubeconfig_path), NS,
                                       "kvtune-runtime")
    client.CoreV1Api(other_pod).patch_namespaced_config_map(
        calibration.RUNTIME_REPORTS_CONFIG_MAP, NS,
        {"data": {pod.metadata.name: json.dumps(forged)}})
    wait_for(lambda: batch.read_namespaced_job(job, NS).status.succeeded,
             "the Job Complete (kwok ends its pod)", 60)
    reconcile(get_infd(api, NS, name), kube=kube)
    obj = get_infd(api, NS, name)
    kvq = obj["status"]["kvQuality"]
    assert kvq["phase"] == "Failed" and "left no report" in kvq["message"], kvq
    assert obj["status"]["pools"][0]["plan"]["kvCacheDtype"] == "auto"


def test_a_report_kept_under_the_former_name_still_counts(api: Any) -> None:
    """Before the report ConfigMap was per InferenceDeployment it was named per model
    revision: an upgraded operator finds this InferenceDeployment's report there (so it
    neither starts a Job nor re-plans to the wider dtype) and moves it to the new name."""
    name = "upgraded"
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["model"]["revision"] = "rev-upgraded"
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec.pop("rollout")
    spec["workload"]["concurrentSequences"] = 200
    spec["runtime"] = {"entrypoint": "kvtune",
                       "image": "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0"}
    create_infd(api, NS, name, spec)
    owner = get_infd(api, NS, name)
    model, revision = spec["model"]["name"], spec["model"]["revision"]
    report = {"weights": "checkpoint", "measurements": [
        {"dtype": d, "kl_mean": 3e-4, "top1_agreement": 0.99}
        for d in ("fp8", "fp8_per_token_head", "int8_per_token_head")]}
    old = calibration.shared_cache_name(model, revision)
    cm = calibration.report_config_map(name=old, namespace=NS, model=model, revision=revision,
                                       report=report,
                                       labels={calibration.LABEL_DEPLOYMENT: name})
    cm["metadata"]["ownerReferences"] = [kapply.owner_reference(owner)]
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(NS, cm)
    # The status the older kvtune left when it wrote that report (an object never
    # reconciled has no report to find).
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, name, {"status": {"observedGeneration": 1}})
    obj = _reconcile_named(api, name)
    kvq = obj["status"]["kvQuality"]
    new = calibration.cache_name(name, model, revision)
    assert kvq["phase"] == "Measured" and kvq["configMap"] == new, kvq
    assert obj["status"]["pools"][0]["plan"]["kvCacheDtype"] == "fp8"
    moved = json.loads(core.read_namespaced_config_map(new, NS).data[calibration.REPORT_KEY])
    assert moved["measurements"] == report["measurements"]
    jobs = client.BatchV1Api(api).list_namespaced_job(
        NS, label_selector=f"kvtune.io/deployment={name}").items
    assert jobs == []


def _reconcile_named(api: Any, name: str) -> dict[str, Any]:
    reconcile(get_infd(api, NS, name), kube=kapply.Kube(api))
    return get_infd(api, NS, name)
