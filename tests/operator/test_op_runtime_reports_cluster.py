"""spec.runtime.entrypoint: kvtune against the real control plane: the runtime pods run as
``kvtune-runtime`` (created here from operator/render/runtime_access.py, as the chart creates it),
and the runtime entrypoint's own code, authenticated as that ServiceAccount (a TokenRequest
token), writes its report into the namespace's ``kvtune-runtime-reports`` ConfigMap; the
operator shows expected vs actual in status and posts an Event. The token may patch no pod.

kwok makes the pods Running but no container runs, so the test plays the runtime's part: it
calls ``kvtune.runtime.__main__.run`` (the entrypoint without the NVML read and the exec) with
the rendered container's args and KVTUNE_PLAN, the pod's downward-API values, a service
account directory holding the token, and GPUs read through the fake NVML of the entrypoint's
packaging tests."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    OperatorProcess,
    cluster_ca_pem,
    condition,
    create_infd,
    get_infd,
    prepare_namespaces,
    service_account_dir,
    service_account_token,
    wait_for,
)
from op_samples import SAMPLE_SPEC

from kvtune.runtime import __main__ as entrypoint_main
from kvtune.runtime import gpus, report

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS, OTHER_NS = "op-runtime", "op-runtime-other"  # OTHER_NS: no runtime access objects
NAME = "chat"
MIB, GIB = 1024**2, 1024**3
H200_TOTAL = 143771 * MIB
REPO = Path(__file__).resolve().parents[2]


def _fake_nvml() -> Any:
    """The FakeNvml class of tests/runtime/test_runtime_entrypoint.py."""
    path = REPO / "tests/runtime/test_runtime_entrypoint.py"
    spec = importlib.util.spec_from_file_location("_kvtune_pkg_entrypoint_fakes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.FakeNvml


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    # What the chart creates for the runtime in NS; none in OTHER_NS.
    return prepare_namespaces(local_cluster, NS, OTHER_NS, runtime_access=(NS,))


@pytest.fixture(scope="module")
def operator(local_cluster: Any, cluster_api: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = Path(tmp_path_factory.mktemp("operator-runtime")) / "operator.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVTUNE_RUNTIME_REPORT_SECONDS", "1")
        proc = OperatorProcess(Path(local_cluster.kubeconfig_path), [NS, OTHER_NS], log)
        proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def running(cluster_api: Any, operator: OperatorProcess) -> dict[str, Any]:
    """The InferenceDeployment with entrypoint kvtune, Ready, and its one pod."""
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec.pop("rollout")
    spec["runtime"] = {"entrypoint": "kvtune",
                       "image": "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0"}
    create_infd(cluster_api, NS, NAME, spec)

    def ready() -> dict[str, Any] | None:
        obj = get_infd(cluster_api, NS, NAME)
        c = condition(obj, "Ready")
        return obj if c and c["status"] == "True" else None

    obj = wait_for(ready, "Ready=True with entrypoint kvtune", 120, operator.log)
    pods = wait_for(lambda: [p for p in client.CoreV1Api(cluster_api).list_namespaced_pod(
        NS, label_selector=f"kvtune.io/deployment={NAME}").items
        if p.status.phase == "Running"], "a Running pod", 60, operator.log)
    return {"infd": obj, "pod": pods[0]}


def _run_entrypoint(pod: Any, sa_dir: Path, server: str, tmp: Path, free_bytes: int) -> int:
    """The entrypoint as the pod would run it, up to (not including) exec'ing vllm."""
    container = pod.spec.containers[0]
    env_of = {e.name: e.value for e in container.env if e.value is not None}
    host, port = server.removeprefix("https://").rsplit(":", 1)
    env = {
        "KVTUNE_PLAN": env_of["KVTUNE_PLAN"],
        # The downward API's values for this pod.
        "POD_NAME": pod.metadata.name, "POD_NAMESPACE": pod.metadata.namespace,
        "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
        "KVTUNE_SERVICEACCOUNT_DIR": str(sa_dir),
        "KVTUNE_STATUS_FILE": str(tmp / "runtime-report.json"),
        "KVTUNE_DRY_RUN": "1",
    }
    fake = _fake_nvml()([("NVIDIA H200", H200_TOTAL, free_bytes, (9, 0))])
    found = gpus.read_gpus(fake)
    return entrypoint_main.run(list(container.args), env, found,
                               exec_fn=lambda *_: pytest.fail("exec'd"))


def _runtime(api: Any) -> dict[str, Any] | None:
    pools = (get_infd(api, NS, NAME).get("status") or {}).get("pools") or []
    return pools[0].get("runtime") if pools else None


def _events(api: Any, reason: str) -> list[Any]:
    return [e for e in client.CoreV1Api(api).list_namespaced_event(NS).items
            if e.involved_object.name == NAME and e.reason == reason]


def test_runtime_pods_run_as_the_charts_runtime_account(cluster_api: Any,
                                                       running: dict[str, Any]) -> None:
    core, rbac = client.CoreV1Api(cluster_api), client.RbacAuthorizationV1Api(cluster_api)
    # The operator created no ServiceAccount, Role or RoleBinding of its own.
    assert [a.metadata.name for a in core.list_namespaced_service_account(NS).items
            if a.metadata.name != "default"] == ["kvtune-runtime"]
    assert [r.metadata.name for r in rbac.list_namespaced_role(NS).items] == [
        "kvtune-runtime-reporter"]
    pod = running["pod"]
    assert pod.spec.service_account_name == "kvtune-runtime"
    assert pod.spec.containers[0].command == ["python3", "-m", "kvtune.runtime"]
    assert {e.name for e in pod.spec.containers[0].env} >= {
        "KVTUNE_PLAN", "POD_NAME", "POD_NAMESPACE", "KVTUNE_REPORT_CONFIGMAP"}


def test_a_namespace_without_the_runtime_account_says_how_to_fix_it(
        cluster_api: Any, operator: OperatorProcess) -> None:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec.pop("rollout")
    spec["runtime"] = {"entrypoint": "kvtune"}
    create_infd(cluster_api, OTHER_NS, NAME, spec)

    def missing() -> dict[str, Any] | None:
        c = condition(get_infd(cluster_api, OTHER_NS, NAME), "RuntimeAsPlanned")
        return c if c and c["reason"] == "RuntimeAccessMissing" else None

    c = wait_for(missing, "RuntimeAsPlanned=False/RuntimeAccessMissing", 120, operator.log)
    assert c["status"] == "False"
    assert f"add {OTHER_NS} to the Helm chart's runtime.namespaces" in c["message"]


def test_the_runtimes_report_shows_as_expected_vs_actual(
    local_cluster: Any, cluster_api: Any, running: dict[str, Any], operator: OperatorProcess,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A refusal also writes the container's termination message: keep it in tmp_path.
    monkeypatch.setattr(entrypoint_main, "write_termination_message",
                        lambda message: (tmp_path / "termination-log").write_text(message))
    pod = running["pod"]
    planned = running["infd"]["status"]["pools"][0]
    util = planned["plan"]["gpuMemoryUtilization"]
    sa_dir = service_account_dir(cluster_api, Path(local_cluster.kubeconfig_path), NS,
                                 "kvtune-runtime", tmp_path / "serviceaccount")

    # 1. Another process holds GPU memory: 10 points less free than the plan asks for.
    free = int(H200_TOTAL * (util - 0.10)) + GIB
    assert _run_entrypoint(pod, sa_dir, local_cluster.server, tmp_path, free) == 0
    assert not (tmp_path / "runtime-report.json").exists(), "fell back to the status file"
    reports = client.CoreV1Api(cluster_api).read_namespaced_config_map(
        "kvtune-runtime-reports", NS).data
    assert json.loads(reports[pod.metadata.name])["started"] is True

    runtime = wait_for(lambda: (r := _runtime(cluster_api)) and r.get("reportedPods") == 1
                       and r, "status.pools[0].runtime", 30, operator.log)
    assert runtime["pods"] == 1 and runtime["startedPods"] == 1
    assert runtime["gpuProduct"] == "NVIDIA H200"
    assert runtime["gpuMemoryTotalBytes"] == H200_TOTAL
    assert runtime["gpuMemoryFreeBytes"] == free
    assert runtime["gpuMemoryUtilization"]["planned"] == util
    assert util - 0.11 <= runtime["gpuMemoryUtilization"]["actual"] <= util - 0.09
    assert runtime["kvCacheTokens"]["expected"] == planned["expected"]["kvCacheTokens"]
    assert 0 < runtime["kvCacheTokens"]["actual"] < runtime["kvCacheTokens"]["expected"]
    obj = get_infd(cluster_api, NS, NAME)
    c = condition(obj, "RuntimeAsPlanned")
    assert c is not None and (c["status"], c["reason"]) == ("False", "GpuMemoryLowered")
    assert "lowered gpu-memory-utilization" in c["message"]
    assert condition(obj, "Ready")["status"] == "True"  # type: ignore[index]
    wait_for(lambda: _events(cluster_api, "GpuMemoryLowered"), "a GpuMemoryLowered Event", 30,
             operator.log)

    # 2. The pod restarts on a GPU with almost nothing free: the runtime refuses.
    free = planned["expected"]["kvBytesPerToken"] + 1 * GIB  # not even one sequence fits
    assert _run_entrypoint(pod, sa_dir, local_cluster.server, tmp_path, free) == \
        entrypoint_main.EXIT_REFUSED
    runtime = wait_for(lambda: (r := _runtime(cluster_api)) and r.get("refusedPods") == 1
                       and r, "a refusal in status", 30, operator.log)
    assert runtime["refusalReason"] == "InsufficientGpuMemory"
    assert "Fix:" in runtime["refusal"]
    c = condition(get_infd(cluster_api, NS, NAME), "RuntimeAsPlanned")
    assert c is not None and (c["status"], c["reason"]) == ("False", "RuntimeRefused")
    wait_for(lambda: _events(cluster_api, "RuntimeRefused"), "a RuntimeRefused Event", 30,
             operator.log)
    # Events are posted when the finding changes, not on every timer tick.
    assert len(_events(cluster_api, "GpuMemoryLowered")) == 1


def test_the_runtimes_token_cannot_patch_any_pod(
    local_cluster: Any, cluster_api: Any, running: dict[str, Any],
) -> None:
    core = client.CoreV1Api(cluster_api)
    try:
        core.create_namespaced_pod(OTHER_NS, {
            "metadata": {"name": "bystander"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    token = service_account_token(cluster_api, NS, "kvtune-runtime")
    ca = Path(local_cluster.kubeconfig_path).parent / "runtime-sa-ca.crt"
    ca.write_bytes(cluster_ca_pem(Path(local_cluster.kubeconfig_path)))
    body = json.dumps({"metadata": {"annotations": {"pwn": "1"}}}).encode()
    # Its own pod included: the report goes to the ConfigMap, never into a pod.
    for namespace, pod in ((NS, running["pod"].metadata.name), (OTHER_NS, "bystander")):
        url = f"{local_cluster.server}/api/v1/namespaces/{namespace}/pods/{pod}"
        with pytest.raises(urllib.error.HTTPError) as err:
            report._request(url, method="PATCH", token=token, ca_file=str(ca),
                            timeout_seconds=10, body=body)
        assert err.value.code == 403
    # Its one right, by name: the reports ConfigMap of its namespace.
    report.patch_report_config_map({"started": True}, api_base_url=local_cluster.server,
                                   namespace=NS, pod_name="some-pod",
                                   config_map="kvtune-runtime-reports", token=token,
                                   ca_file=str(ca))
