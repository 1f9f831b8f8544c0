"""The operator against the real control plane (etcd, kube-apiserver, controller-manager with
its garbage collector, scheduler, kwok GPU nodes): `kvtune operator` runs as a subprocess."""

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    condition,
    create_infd,
    ensure_namespace,
    get_infd,
    patch_spec,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NAMESPACES = ["op-two-pools", "op-recommend", "op-invalid", "op-degraded", "op-nodes",
              "op-template", "op-lifecycle", "op-configmap", "op-stuck", "op-canary"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, *NAMESPACES)


@pytest.fixture(scope="module")
def operator(local_cluster: Any, cluster_api: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    proc = OperatorProcess(Path(local_cluster.kubeconfig_path), NAMESPACES, log)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def tainted_node(cluster_api: Any) -> Iterator[dict[str, str]]:
    """A nodeSelector matching one schedulable H100 node that the pods cannot go to (a taint
    they do not tolerate): kvtune places the pool, the pods stay Pending. (A selector no
    node matches at all is refused before anything is applied.)"""
    core = client.CoreV1Api(cluster_api)
    node = next(n for n in core.list_node(label_selector="kvtune.io/fake-gpu-pool=H100").items
                if not n.spec.unschedulable)
    name, key = node.metadata.name, "kvtune.io/test"
    taints = [t.to_dict() for t in node.spec.taints or []]
    core.patch_node(name, {"metadata": {"labels": {key: "tainted"}}, "spec": {"taints": [
        *taints, {"key": key, "value": "tainted", "effect": "NoSchedule"}]}})
    try:
        yield {key: "tainted"}
    finally:
        core.patch_node(name, {"metadata": {"labels": {key: None}},
                               "spec": {"taints": taints or None}})


def _deployments(api: Any, ns: str) -> dict[str, Any]:
    items = client.AppsV1Api(api).list_namespaced_deployment(
        ns, label_selector="kvtune.io/deployment").items
    return {d.metadata.name: d for d in items}


def _rollout_state(api: Any, ns: str) -> str:
    """What the namespace's Deployments and pods were doing, for a rollout wait that timed
    out (CI once saw a healthy canary never become available, and the operator's log alone
    could not say why)."""
    lines = []
    for name, dep in sorted(_deployments(api, ns).items()):
        st = dep.status
        conds = "; ".join(f"{c.type}={c.status} {c.reason}: {c.message}"
                          for c in st.conditions or [])
        lines.append(f"deployment {name}: replicas {st.replicas} ready {st.ready_replicas} "
                     f"available {st.available_replicas} | {conds}")
    for pod in client.CoreV1Api(api).list_namespaced_pod(ns).items:
        conds = "; ".join(f"{c.type}={c.status} {c.reason or ''} {c.message or ''}".strip()
                          for c in pod.status.conditions or [])
        lines.append(f"pod {pod.metadata.name}: {pod.status.phase} on {pod.spec.node_name} | "
                     f"{conds}")
    return "\n".join(lines)


def _ready(api: Any, ns: str, name: str, reason: str | None = None) -> dict[str, Any] | None:
    obj = get_infd(api, ns, name)
    ready = condition(obj, "Ready")
    ok = ready is not None and ready["status"] == "True" and (
        reason is None or ready["reason"] == reason)
    return obj if ok else None


def test_two_pools_become_two_deployments_with_the_planned_flags(
    cluster_api: Any, operator: OperatorProcess
) -> None:
    ns = "op-two-pools"
    create_infd(cluster_api, ns, "support-bot", copy.deepcopy(SAMPLE_SPEC))
    obj = wait_for(lambda: _ready(cluster_api, ns, "support-bot", "AllPoolsApplied"),
                   "Ready=True", 90, operator.log)
    status = obj["status"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["poolSummary"] == "H200x2,H100x1"
    assert condition(obj, "Degraded")["status"] == "False"  # type: ignore[index]
    assert condition(obj, "Progressing")["status"] == "False"  # type: ignore[index]
    assert status["profile"]["source"] == "declared"
    deployments = _deployments(cluster_api, ns)
    assert sorted(deployments) == ["support-bot-h100", "support-bot-h200"]
    for pool in status["pools"]:
        assert pool["phase"] == "Applied" and pool["revision"] == 1
        assert pool["plan"]["blockSize"] == 32  # the pin
        assert any(r.startswith("kv-cache-dtype=") for r in pool["reasons"])
        assert pool["expected"]["kvCacheTokens"] > 0
        dep = deployments[pool["deployment"]]
        container = dep.spec.template.spec.containers[0]
        assert container.args == pool["vllmArgs"]
        assert f"--kv-cache-dtype={pool['plan']['kvCacheDtype']}" in container.args
        assert f"--max-num-seqs={pool['plan']['maxNumSeqs']}" in container.args
        assert f"--tensor-parallel-size={pool['tensorParallel']}" in container.args
        assert container.resources.limits["nvidia.com/gpu"] == str(pool["tensorParallel"])
        assert dep.metadata.labels["kvtune.io/plan-revision"] == "1"
        owner = dep.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.controller) == ("InferenceDeployment",
                                                              "support-bot", True)
        assert dep.status.ready_replicas == pool["replicas"]
        # The real scheduler put the pods on nodes of the pool's class.
        pods = client.CoreV1Api(cluster_api).list_namespaced_pod(
            ns, label_selector=f"kvtune.io/pool={pool['name']}").items
        assert pods and all(p.spec.node_name.startswith(pool["gpuClass"].lower())
                            for p in pods)
    events = client.CoreV1Api(cluster_api).list_namespaced_event(ns).items
    reasons = {e.reason for e in events if e.involved_object.kind == "InferenceDeployment"}
    assert {"PlanChanged", "RolloutStarted"} <= reasons


def test_restart_causes_no_new_rollout(cluster_api: Any, operator: OperatorProcess) -> None:
    ns = "op-two-pools"
    wait_for(lambda: _ready(cluster_api, ns, "support-bot"), "the two-pool sample Ready", 90,
             operator.log)
    before = {n: (d.metadata.generation, d.spec.template.metadata.annotations)
              for n, d in _deployments(cluster_api, ns).items()}
    status_before = get_infd(cluster_api, ns, "support-bot")["status"]
    operator.stop()
    operator.start()
    wait_for(lambda: "Resuming is processed" in operator.current_log(),
             "the restarted operator to resume its objects", 60, operator.log)
    after = {n: (d.metadata.generation, d.spec.template.metadata.annotations)
             for n, d in _deployments(cluster_api, ns).items()}
    assert after == before
    status_after = get_infd(cluster_api, ns, "support-bot")["status"]
    assert status_after["pools"] == status_before["pools"]
    assert status_after["conditions"] == status_before["conditions"]


def test_recommend_mode_writes_plans_and_changes_nothing(
    cluster_api: Any, operator: OperatorProcess
) -> None:
    ns = "op-recommend"
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["tuning"]["mode"] = "recommend"
    create_infd(cluster_api, ns, "reviewed", spec)
    obj = wait_for(lambda: _ready(cluster_api, ns, "reviewed", "Recommended"),
                   "Ready=True/Recommended", 60, operator.log)
    assert [p["phase"] for p in obj["status"]["pools"]] == ["Recommended", "Recommended"]
    assert all(p["plan"]["maxModelLen"] >= 32768 for p in obj["status"]["pools"])
    assert _deployments(cluster_api, ns) == {}
    assert client.CoreV1Api(cluster_api).list_namespaced_service(ns).items == []


@pytest.mark.parametrize(("change", "message"), [
    ({"pools": [{"gpuClass": "H200", "replicas": 0}]}, "canaryReplicas"),
    ({"tuning": {"pin": {"blockSize": 24}}}, "multiple of 16"),
    ({"pools": [{"gpuClass": "H200"}, {"gpuClass": "H200"}]}, "pool names must be unique"),
    ({"tuning": {"pin": {"kvCacheDtype": "nvfp4"}}}, "narrower than"),
    ({"slo": {"ttftP95": "2 seconds"}}, "ttftP95"),
    ({"pools": [{"gpuClass": "H200", "tensorParallel": 3}]}, "tensorParallel"),
    ({"pools": [{"gpuClass": "H200", "tensorParallel": "two"}]}, "tensorParallel"),
    ({"tuning": {"prometheus": {"url": "http://p:9090", "window": "10m"},
                 "retune": {"dwell": "5m"}}}, "dwell must be at least"),
])
def test_invalid_objects_are_refused_by_the_crd(
    cluster_api: Any, change: dict[str, Any], message: str
) -> None:
    spec = {**copy.deepcopy(SAMPLE_SPEC), **change}
    with pytest.raises(ApiException) as info:
        create_infd(cluster_api, "op-invalid", "refused", spec)
    assert info.value.status == 422
    assert message in info.value.body


def test_tensor_parallel_auto_is_admitted_and_renders_the_chosen_degree(
        cluster_api: Any) -> None:
    """The CRD's int-or-string admits auto (its CEL rule runs on the real API server); the
    reconcile seam plans every degree and the Deployment asks for the chosen one's GPUs."""
    from kvtune.operator.kube.apply import Kube
    from kvtune.operator.reconcile import reconcile

    ns = "op-direct"
    ensure_namespace(cluster_api, ns)
    spec = {**copy.deepcopy(SAMPLE_SPEC), "model": {"name": "meta-llama/Llama-3.3-70B-Instruct"},
            "pools": [{"gpuClass": "H100", "replicas": 2, "tensorParallel": "auto"}]}
    spec.pop("rollout")
    create_infd(cluster_api, ns, "tp-auto", spec)
    assert get_infd(cluster_api, ns, "tp-auto")["spec"]["pools"][0]["tensorParallel"] == "auto"
    result = reconcile(get_infd(cluster_api, ns, "tp-auto"), kube=Kube(cluster_api))
    assert result.permanent_error is None, result.status
    pool = result.status["pools"][0]
    tp = pool["tensorParallel"]
    assert tp in (2, 4, 8) and pool["replicas"] == 2  # no rate: the spec's replicas
    deployment = _deployments(cluster_api, ns)["tp-auto-h100"]
    container = deployment.spec.template.spec.containers[0]
    assert f"--tensor-parallel-size={tp}" in container.args
    assert container.resources.limits["nvidia.com/gpu"] == str(tp)
    assert deployment.spec.replicas == 2


def test_bad_model_degrades_and_leaves_the_runtime_alone(
    cluster_api: Any, operator: OperatorProcess
) -> None:
    ns = "op-degraded"
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    create_infd(cluster_api, ns, "bot", spec)
    wait_for(lambda: _ready(cluster_api, ns, "bot"), "Ready", 60, operator.log)
    before = _deployments(cluster_api, ns)["bot-h100"]
    patch_spec(cluster_api, ns, "bot", {"model": {"name": "acme/NotAModel-13B"}})

    def degraded() -> dict[str, Any] | None:
        obj = get_infd(cluster_api, ns, "bot")
        cond = condition(obj, "Degraded")
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for(degraded, "Degraded=True", 60, operator.log)
    assert cond["reason"] == "UnknownModel"
    assert "spec.model.name" in cond["message"] and "acme/NotAModel-13B" in cond["message"]
    assert "configMapRef" in cond["message"]  # the fix
    after = _deployments(cluster_api, ns)["bot-h100"]
    assert after.metadata.generation == before.metadata.generation
    assert after.spec.template.spec.containers[0].args == \
        before.spec.template.spec.containers[0].args


def test_deletion_garbage_collects_the_children(
    cluster_api: Any, operator: OperatorProcess
) -> None:
    ns = "op-degraded"
    wait_for(lambda: _deployments(cluster_api, ns), "the Deployment of 'bot'", 60)
    client.CustomObjectsApi(cluster_api).delete_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "bot")
    core, policy = client.CoreV1Api(cluster_api), client.PolicyV1Api(cluster_api)

    def gone() -> bool:
        return not _deployments(cluster_api, ns) and not core.list_namespaced_service(
            ns).items and not policy.list_namespaced_pod_disruption_budget(ns).items

    wait_for(gone, "the garbage collector to delete Deployment, Service and PDB", 60)


def test_pool_without_nodes_waits_then_follows_a_new_node(
    local_cluster: Any, cluster_api: Any, operator: OperatorProcess
) -> None:
    ns = "op-nodes"
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "L40S", "replicas": 1}]
    spec["rollout"] = {"canaryReplicas": 0}
    # Created while the operator is down, and the node created as soon as the object waits:
    # the node comes while the operator's node watch has not settled (its first listing),
    # the window where a reconcile lists the nodes itself. The watch starts from an
    # inventory that already holds the node, so only the waiting object's record (planned
    # against an older inventory) can bring it to the node before kopf's 30 s retry.
    operator.stop()
    create_infd(cluster_api, ns, "edge", spec)
    operator.start()

    def waiting() -> dict[str, Any] | None:
        obj = get_infd(cluster_api, ns, "edge")
        ready = condition(obj, "Ready")
        return obj if ready and ready["reason"] == "PoolWithoutNodes" else None

    obj = wait_for(waiting, "Ready=False/PoolWithoutNodes", 60, operator.log)
    assert obj["status"]["pools"][0]["phase"] == "NoNodes"
    assert obj["status"]["pools"][0]["plan"]["kvCacheDtype"]  # planned, only not applied
    assert _deployments(cluster_api, ns) == {}
    core = client.CoreV1Api(cluster_api)
    core.create_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "l40s-op-test", "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": "l40s-op-test",
                                "kubernetes.io/os": "linux", "type": "kwok",
                                "nvidia.com/gpu.present": "true",
                                "nvidia.com/gpu.product": "NVIDIA-L40S",
                                "nvidia.com/gpu.count": "4"}},
        "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                "nvidia.com/gpu": "4"},
                   "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                   "nvidia.com/gpu": "4"}},
    })
    try:
        # Well inside the 30 s no-nodes retry: the node watch triggers the reconcile.
        obj = wait_for(lambda: _ready(cluster_api, ns, "edge"), "Ready after the node came",
                       25, operator.log)
        assert obj["status"]["pools"][0]["nodes"] == 1
        pods = core.list_namespaced_pod(ns).items
        assert [p.spec.node_name for p in pods] == ["l40s-op-test"]
    finally:
        client.CustomObjectsApi(cluster_api).delete_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "edge")
        core.delete_node("l40s-op-test")


def test_invalid_pod_template_is_reported_and_nothing_changes(
    cluster_api: Any, operator: OperatorProcess
) -> None:
    ns = "op-template"
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1}]
    create_infd(cluster_api, ns, "tpl", spec)
    wait_for(lambda: _ready(cluster_api, ns, "tpl"), "Ready", 60, operator.log)
    before = _deployments(cluster_api, ns)["tpl-h200"]
    # Renders valid YAML of the right shape, but an object the API server refuses.
    template = ("spec:\n  containers:\n    - name: vllm\n      image: {{ image | tojson }}\n"
                "      args: {{ args | tojson }}\n"
                "      resources: {limits: {nvidia.com/gpu: not-a-quantity}}\n")
    client.CoreV1Api(cluster_api).create_namespaced_config_map(
        ns, {"metadata": {"name": "pod-tpl"}, "data": {"pod.yaml.j2": template}})
    patch_spec(cluster_api, ns, "tpl", {"runtime": {"podTemplate": {
        "configMapRef": {"name": "pod-tpl"}}}})

    def degraded() -> dict[str, Any] | None:
        cond = condition(get_infd(cluster_api, ns, "tpl"), "Degraded")
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for(degraded, "Degraded=True for the template", 60, operator.log)
    assert cond["reason"] == "ApplyFailed"
    assert "tpl-h200" in cond["message"] and "nothing was changed" in cond["message"]
    after = _deployments(cluster_api, ns)["tpl-h200"]
    assert after.metadata.generation == before.metadata.generation

    # Fixing the ConfigMap is enough: the referenced ConfigMaps are re-read periodically.
    fixed = template.replace("not-a-quantity", "1").replace(
        "spec:\n", "spec:\n  serviceAccountName: default\n", 1)
    client.CoreV1Api(cluster_api).patch_namespaced_config_map(
        "pod-tpl", ns, {"data": {"pod.yaml.j2": fixed}})
    wait_for(lambda: _ready(cluster_api, ns, "tpl"), "Ready after the template was fixed", 60,
             operator.log)
    pod_spec = _deployments(cluster_api, ns)["tpl-h200"].spec.template.spec
    assert pod_spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert "--block-size=32" in pod_spec.containers[0].args
    assert pod_spec.service_account_name == "default"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_the_api_servers_validation(cluster_api: Any, path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = "op-invalid"
    created = client.CustomObjectsApi(cluster_api).create_namespaced_custom_object(
        GROUP, VERSION, "op-invalid", PLURAL, doc, dry_run="All")
    # The API server fills each pool with the CRD's defaults and keeps the rest as written;
    # the defaults are read from the CRD, so a new defaulted field is not a stale list here.
    crd = yaml.safe_load((REPO / "crds" / f"{PLURAL}.{GROUP}.yaml").read_text())
    pool_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"]["properties"]["pools"]["items"]["properties"]
    defaults = {k: v["default"] for k, v in pool_schema.items() if "default" in v}
    assert {"replicas": 1, "tensorParallel": 1, "dataParallel": 1}.items() <= defaults.items()
    assert created["spec"]["pools"] == [{**defaults, **p} for p in doc["spec"]["pools"]]


def test_operator_metrics_count_reconciles(operator: OperatorProcess) -> None:
    def scrape() -> str | None:
        try:
            with urllib.request.urlopen(operator.metrics_url, timeout=5) as resp:
                text: str = resp.read().decode()
        except OSError:
            return None
        return text if "kvtune_reconciles_total{" in text else None

    text = wait_for(scrape, "reconcile counts on the operator's /metrics", 30, operator.log)
    assert 'outcome="ok"' in text
    assert "kvtune_reconcile_duration_seconds_count" in text
    assert 'kvtune_pools{name="support-bot",namespace="op-two-pools",phase="Applied"} 2.0' in text


def _one_pool_spec(**pool: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1, **pool}]
    return spec


def test_plan_change_rolls_out_a_new_revision_and_mode_switches_leave_it(
    cluster_api: Any, operator: OperatorProcess
) -> None:
    ns = "op-lifecycle"
    spec = _one_pool_spec()
    spec["pools"].append({"gpuClass": "H200", "replicas": 1})
    create_infd(cluster_api, ns, "life", spec)
    wait_for(lambda: _ready(cluster_api, ns, "life"), "Ready", 60, operator.log)
    first = _deployments(cluster_api, ns)["life-h100"]

    # A new pin changes the plan: a new revision, a new pod template, one rollout.
    patch_spec(cluster_api, ns, "life", {"tuning": {"pin": {"blockSize": 64}}})

    def revision_2() -> dict[str, Any] | None:
        obj = _ready(cluster_api, ns, "life")
        pools = (obj or {}).get("status", {}).get("pools", [])
        return obj if pools and all(p["revision"] == 2 for p in pools) else None

    wait_for(revision_2, "plan revision 2 rolled out", 60, operator.log)
    second = _deployments(cluster_api, ns)["life-h100"]
    assert second.metadata.generation == first.metadata.generation + 1
    assert "--block-size=64" in second.spec.template.spec.containers[0].args
    assert second.spec.template.metadata.labels["kvtune.io/plan-revision"] == "2"

    # recommend and off: the plan may change, the runtime does not.
    for mode, reason in (("recommend", "Recommended"), ("off", "TuningOff")):
        patch_spec(cluster_api, ns, "life", {"tuning": {"mode": mode,
                                                        "pin": {"blockSize": 128}}})
        wait_for(lambda reason=reason: _ready(cluster_api, ns, "life", reason),
                 f"Ready/{reason}", 60, operator.log)
        now = _deployments(cluster_api, ns)["life-h100"]
        assert now.metadata.generation == second.metadata.generation
        assert "--block-size=64" in now.spec.template.spec.containers[0].args

    # Back to auto without the H200 pool: its objects are pruned, H100 rolls out 128 (the
    # plan recommended meanwhile), and says so.
    patch_spec(cluster_api, ns, "life", {"tuning": {"mode": "auto"},
                                         "pools": [{"gpuClass": "H100", "replicas": 1}]})
    wait_for(lambda: sorted(_deployments(cluster_api, ns)) == ["life-h100"] and
             _ready(cluster_api, ns, "life", "AllPoolsApplied"),
             "the H200 pool pruned and H100 Ready", 60, operator.log)
    last = _deployments(cluster_api, ns)["life-h100"]
    assert "--block-size=128" in last.spec.template.spec.containers[0].args
    assert client.CoreV1Api(cluster_api).list_namespaced_service(
        ns, label_selector="kvtune.io/pool=h200").items == []
    # The revision rolled out: 3 where auto plans what recommend showed; 4 where auto's plan
    # differs (recommend shows the planner's fp8, while auto holds the wider dtype for its
    # measurement when no calibration can run here: the KV-quality gate fails closed).
    (pool,) = (_ready(cluster_api, ns, "life") or {})["status"]["pools"]
    revision = pool["revision"]
    assert revision in (3, 4) and last.spec.template.metadata.labels[
        "kvtune.io/plan-revision"] == str(revision)
    # kopf posts a reconcile's Events after its status write: wait for the Event.
    wait_for(lambda: any("life-h100" in e.message and f"revision {revision}" in e.message
                         for e in client.CoreV1Api(cluster_api).list_namespaced_event(ns).items
                         if e.reason == "RolloutStarted"),
             f"a RolloutStarted Event for revision {revision}", 30, operator.log)


def test_model_outside_the_catalog_from_a_config_map(
    cluster_api: Any, operator: OperatorProcess
) -> None:
    ns = "op-configmap"
    doc = json.loads((REPO / "tuner" / "facts" / "data" / "models" /
                      "meta-llama--Llama-3.1-8B-Instruct.json").read_text())
    client.CoreV1Api(cluster_api).create_namespaced_config_map(
        ns, {"metadata": {"name": "acme-8b"}, "data": {"config.json": json.dumps(doc["config"])}})
    spec = _one_pool_spec()
    spec["model"] = {"name": "acme/house-model-8b",
                     "config": {"configMapRef": {"name": "acme-8b"}}}
    create_infd(cluster_api, ns, "house", spec)
    obj = wait_for(lambda: _ready(cluster_api, ns, "house"), "Ready", 60, operator.log)
    pool = obj["status"]["pools"][0]
    assert pool["vllmArgs"][0] == "acme/house-model-8b"
    assert pool["expected"]["kvBytesPerToken"] > 0


def test_reconcile_seam_writes_status_only_when_it_changes(cluster_api: Any) -> None:
    """The function the retune timer calls, used directly (no operator serves this
    namespace): a second reconcile of an unchanged object writes nothing; an observed profile
    replans, is kept in status, and survives a reconcile without one."""
    from kvtune.operator.kube.apply import Kube
    from kvtune.operator.reconcile import reconcile
    from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

    ns = "op-direct"
    ensure_namespace(cluster_api, ns)
    create_infd(cluster_api, ns, "seam", _one_pool_spec())
    kube = Kube(cluster_api)
    first = reconcile(get_infd(cluster_api, ns, "seam"), kube=kube)
    assert first.status_changed and first.permanent_error is None
    # The H100 plan's fp8 cannot be measured here (no calibration image in this test's
    # operator): a Warning says so once, not on every reconcile (second.events below), and
    # the pool is planned again with the wider dtype held: one PlanChanged, for what rolls out.
    assert [e.reason for e in first.events] == ["CalibrationUnavailable", "PlanChanged",
                                                "RolloutStarted"]
    wait_for(lambda: (_deployments(cluster_api, ns)["seam-h100"].status.ready_replicas or 0)
             >= 1, "the Deployment's pod ready", 60)
    settled = reconcile(get_infd(cluster_api, ns, "seam"), kube=kube)  # sees the rollout end
    assert settled.status["conditions"][0]["status"] == "True"
    before = get_infd(cluster_api, ns, "seam")
    second = reconcile(before, kube=kube)
    assert not second.status_changed and second.events == []
    assert get_infd(cluster_api, ns, "seam")["metadata"]["resourceVersion"] == \
        before["metadata"]["resourceVersion"]

    observed = WorkloadProfile(
        source="prometheus", kind="chat",
        context_tokens=TokenQuantiles(p50=9000, p90=20000, p95=30000, p99=60000, max=90000),
        output_tokens=TokenQuantiles(p50=500, p95=2000, p99=4000, max=8000),
        prefix_hit_rate=0.2, requests=12345)
    third = reconcile(get_infd(cluster_api, ns, "seam"), kube=kube, profile=observed,
                      profile_window="6h")
    assert third.status["profile"]["source"] == "prometheus"
    assert third.status["profile"]["window"] == "6h"
    assert third.status["profile"]["requests"] == 12345
    pool = third.status["pools"][0]
    assert pool["revision"] == 2 and pool["plan"]["maxModelLen"] > 32768
    fourth = reconcile(get_infd(cluster_api, ns, "seam"), kube=kube)
    # The observed profile is kept, not the declared one: same plan, no new revision.
    assert fourth.status["profile"] == third.status["profile"]
    assert fourth.status["pools"][0]["planHash"] == pool["planHash"]
    assert fourth.status["pools"][0]["revision"] == 2 and fourth.events == []


def test_a_rollout_past_its_progress_deadline_is_degraded(
    cluster_api: Any, operator: OperatorProcess, tainted_node: dict[str, str]
) -> None:
    ns = "op-stuck"
    # The pods stay Pending (the one node they select is tainted), the deadline passes.
    spec = _one_pool_spec(nodeSelector=tainted_node)
    spec["rollout"] = {"canaryReplicas": 0, "progressDeadline": "3s"}
    create_infd(cluster_api, ns, "stuck", spec)

    def degraded() -> dict[str, Any] | None:
        cond = condition(get_infd(cluster_api, ns, "stuck"), "Degraded")
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for(degraded, "Degraded=True/RolloutStuck", 90, operator.log)
    assert cond["reason"] == "RolloutStuck"
    assert "stuck-h100" in cond["message"] and "kubectl describe pod" in cond["message"]
    obj = get_infd(cluster_api, ns, "stuck")
    assert condition(obj, "Ready")["status"] == "False"  # type: ignore[index]
    assert condition(obj, "Progressing")["status"] == "True"  # type: ignore[index]
    dep = _deployments(cluster_api, ns)["stuck-h100"]
    assert dep.spec.progress_deadline_seconds == 3

    # The cause goes away (the selector is dropped): the rollout recovers, Degraded clears.
    patch_spec(cluster_api, ns, "stuck", {"pools": [{"gpuClass": "H100", "replicas": 1}]})
    wait_for(lambda: _ready(cluster_api, ns, "stuck"), "Ready after the fix", 90, operator.log)
    assert condition(get_infd(cluster_api, ns, "stuck"), "Degraded")["status"] == "False"  # type: ignore[index]


def test_canary_promotes_a_healthy_plan_and_rolls_back_a_broken_one(
    cluster_api: Any, operator: OperatorProcess, tainted_node: dict[str, str]
) -> None:
    ns = "op-canary"
    spec = _one_pool_spec(replicas=3)
    # A healthy canary gets a deadline a loaded machine meets; the broken plan below gets 3 s.
    spec["rollout"] = {"canaryReplicas": 1, "analysis": "4s", "progressDeadline": "60s"}
    create_infd(cluster_api, ns, "can", spec)
    wait_for(lambda: _ready(cluster_api, ns, "can"), "Ready", 60, operator.log)

    def args(name: str) -> list[str]:
        return list(_deployments(cluster_api, ns)[name].spec.template.spec.containers[0].args)

    # A healthy new plan: one canary replica first, the three others stay on the old plan.
    patch_spec(cluster_api, ns, "can", {"tuning": {"pin": {"blockSize": 64}}})

    def in_canary() -> dict[str, Any] | None:
        pools = get_infd(cluster_api, ns, "can").get("status", {}).get("pools", [])
        return pools[0] if pools and pools[0]["phase"] == "Canary" else None

    pool = wait_for(in_canary, "phase Canary", 60, operator.log)
    assert pool["canary"]["deployment"] == "can-h100-canary" and pool["canary"]["revision"] == 2
    assert "--block-size=64" in args("can-h100-canary")
    assert "--block-size=32" in args("can-h100")
    assert _deployments(cluster_api, ns)["can-h100-canary"].spec.replicas == 1
    try:
        wait_for(lambda: "can-h100-canary" not in _deployments(cluster_api, ns)
                 and _ready(cluster_api, ns, "can"), "the canary promoted", 60, operator.log)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- rollout state ---\n"
                             f"{_rollout_state(cluster_api, ns)}") from None
    assert "--block-size=64" in args("can-h100")

    # A broken plan (its pods cannot be scheduled): rolled back, the pool keeps 64.
    patch_spec(cluster_api, ns, "can", {
        "tuning": {"pin": {"blockSize": 128}},
        "rollout": {"canaryReplicas": 1, "analysis": "4s", "progressDeadline": "3s"},
        "pools": [{"gpuClass": "H100", "replicas": 3, "nodeSelector": tainted_node}]})

    def degraded() -> dict[str, Any] | None:
        cond = condition(get_infd(cluster_api, ns, "can"), "Degraded")
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for(degraded, "Degraded=True/CanaryFailed", 90, operator.log)
    assert cond["reason"] == "CanaryFailed" and "rolled back" in cond["message"]
    wait_for(lambda: "can-h100-canary" not in _deployments(cluster_api, ns),
             "the canary deleted", 30, operator.log)
    assert "--block-size=64" in args("can-h100")
    pool = get_infd(cluster_api, ns, "can")["status"]["pools"][0]
    assert pool["rejectedPlanHash"] == pool["planHash"]
    wait_for(lambda: {"CanaryStarted", "CanaryPromoted", "CanaryRolledBack"} <= {
        e.reason for e in client.CoreV1Api(cluster_api).list_namespaced_event(ns).items},
        "the canary's Events", 30, operator.log)
