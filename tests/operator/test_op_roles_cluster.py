"""Prefill/decode pools and multi-node replicas against the real API server (issue 26 items 2
and 3): a pair rolls out as two Deployments, each with its role's ``--kv-transfer-config``;
a replica over nodes rolls out as a LeaderWorkerSet (owned, followed from its status as the
LWS controller writes it, pruned with its pool; a canary refused by name), accepted by the
pinned lws release's CRD exactly as rendered. The reconcile seam is called
directly (as in the bad-spec corpus)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from bad_specs import _DECODE, _PREFILL, BASE
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    get_infd,
    install_crd,
    prepare_namespaces,
)
from test_op_leader_worker_set import TWO_NODES, rendered, spec_for

from kvtune.e2e.leader_worker_set import crd_path
from kvtune.operator import reconcile as rec
from kvtune.operator.kube.apply import Kube
from kvtune.operator.render import leader_worker_set as lws

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS = "pool-roles"
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, NS)


def _create(api: Any, name: str, pools: list[dict[str, Any]],
            model: str | None = None) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    spec["pools"] = pools
    if model is not None:
        spec["model"] = {"name": model}
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
        "metadata": {"name": name, "namespace": NS}, "spec": spec})
    rec.reconcile(get_infd(api, NS, name), kube=Kube(api))
    return get_infd(api, NS, name)


def test_a_pair_rolls_out_each_role_with_its_transfer_config(cluster_api: Any) -> None:
    stored = _create(cluster_api, "pd", [_PREFILL, _DECODE])
    assert [p["phase"] for p in stored["status"]["pools"]] == ["Applied", "Applied"], stored
    apps = client.AppsV1Api(cluster_api)
    plans = []
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        name = f"pd-{'pre' if role == 'prefill' else 'dec'}"
        held = apps.read_namespaced_deployment(name, NS, _preload_content=False)
        deployment = json.loads(held.data)
        pod = deployment["spec"]["template"]
        args = pod["spec"]["containers"][0]["args"]
        flag = next(a for a in args if a.startswith("--kv-transfer-config="))
        assert json.loads(flag.split("=", 1)[1]) == {"kv_connector": "NixlConnector",
                                                     "kv_role": kv_role}
        assert pod["metadata"]["labels"]["llm-d.ai/role"] == role
        plans.append({a.split("=")[0]: a for a in args if a.startswith("--block-size")
                      or a.startswith("--kv-cache-dtype")})
    # What the handshake compares is the same on both roles.
    assert plans[0] == plans[1] and plans[0]


def test_a_pair_the_handshake_refuses_rolls_out_neither_role(cluster_api: Any) -> None:
    stored = _create(cluster_api, "pd-bad", [_PREFILL | {"pin": {"blockSize": 32}},
                                             _DECODE | {"pin": {"blockSize": 16}}])
    degraded = condition(stored, "Degraded")
    assert degraded is not None and degraded["reason"] == "KVTransferIncompatible", degraded
    assert "blockSize='prefill 32, decode 16'" in degraded["message"]
    assert "\n" not in degraded["message"]
    for pool in ("pre", "dec"):
        with pytest.raises(ApiException):
            client.AppsV1Api(cluster_api).read_namespaced_deployment(f"pd-bad-{pool}", NS)


def _lws(api: Any, name: str) -> dict[str, Any]:
    got: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        LWS_GROUP, LWS_VERSION, NS, LWS_PLURAL, name)
    return got


def _controller_reports(api: Any, name: str, *, ready: int, available: bool) -> None:
    """What the LWS v0.9.0 controller writes (no controller runs here): the status
    subresource with the generation seen, the group counts and one True condition."""
    held = _lws(api, name)
    generation = held["metadata"]["generation"]
    type_, reason = ("Available", "AllGroupsReady") if available else \
        ("Progressing", "GroupsProgressing")
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        LWS_GROUP, LWS_VERSION, NS, LWS_PLURAL, name, {"status": {
            "observedGeneration": generation, "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": ready, "conditions": [{
                "type": type_, "status": "True", "reason": reason, "message": reason,
                "observedGeneration": generation,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})


def _patch_spec(api: Any, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, name, {"spec": patch})
    rec.reconcile(get_infd(api, NS, name), kube=Kube(api))
    return get_infd(api, NS, name)


def test_a_multi_node_pool_rolls_out_as_a_leader_worker_set(cluster_api: Any) -> None:
    """Applied like a Deployment (owned, server-side applied, idempotent), followed from the
    LWS status to Ready, its canary refused by name, and pruned with its pool."""
    install_crd(cluster_api, crd_path())
    stored = _create(cluster_api, "dsv3", [TWO_NODES], model="deepseek-ai/DeepSeek-V3")
    pool = stored["status"]["pools"][0]
    assert pool["phase"] == "Applied" and pool["deployment"] == "dsv3-h100", pool
    assert "--data-parallel-size=16" in pool["vllmArgs"], pool
    progressing = condition(stored, "Progressing")
    assert progressing is not None and progressing["status"] == "True", stored["status"]
    assert "LeaderWorkerSet controller has not seen" in pool["message"], pool
    group = _lws(cluster_api, "dsv3-h100")
    assert group["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]
    assert group["spec"]["leaderWorkerTemplate"]["size"] == 2
    with pytest.raises(ApiException):
        client.AppsV1Api(cluster_api).read_namespaced_deployment("dsv3-h100", NS)

    _controller_reports(cluster_api, "dsv3-h100", ready=1, available=False)
    assert rec.refresh_rollout(get_infd(cluster_api, NS, "dsv3"), kube=Kube(cluster_api))
    stored = get_infd(cluster_api, NS, "dsv3")
    ready = condition(stored, "Ready")
    assert ready is not None and ready["status"] == "False", ready
    assert "1/2 groups ready" in stored["status"]["pools"][0]["message"]

    _controller_reports(cluster_api, "dsv3-h100", ready=2, available=True)
    assert rec.refresh_rollout(get_infd(cluster_api, NS, "dsv3"), kube=Kube(cluster_api))
    stored = get_infd(cluster_api, NS, "dsv3")
    ready = condition(stored, "Ready")
    assert ready is not None and ready["status"] == "True", ready
    assert ready["reason"] == "AllPoolsApplied"
    assert "2/2 groups updated and ready" in stored["status"]["pools"][0]["message"]
    generation = _lws(cluster_api, "dsv3-h100")["metadata"]["generation"]
    rec.reconcile(stored, kube=Kube(cluster_api))  # the same plan: no new template
    assert _lws(cluster_api, "dsv3-h100")["metadata"]["generation"] == generation

    # A new plan (a pinned max-num-seqs) with a canary asked for: held, field and fix named.
    stored = _patch_spec(cluster_api, "dsv3", {"rollout": {"canaryReplicas": 1},
                                               "tuning": {"pin": {"maxNumSeqs": 64}}})
    degraded = condition(stored, "Degraded")
    assert degraded is not None and degraded["reason"] == "MultiNodeCanaryUnsupported", degraded
    assert "spec.rollout.canaryReplicas=1" in degraded["message"]
    assert "set spec.rollout.canaryReplicas: 0" in degraded["message"]
    assert _lws(cluster_api, "dsv3-h100")["metadata"]["generation"] == generation
    # Without the canary it rolls out group by group: the LWS gets the new template.
    stored = _patch_spec(cluster_api, "dsv3", {"rollout": {"canaryReplicas": 0}})
    assert stored["status"]["pools"][0]["phase"] == "Applied", stored["status"]
    args = _lws(cluster_api, "dsv3-h100")["spec"]["leaderWorkerTemplate"]["leaderTemplate"][
        "spec"]["containers"][0]["args"]
    assert "--max-num-seqs=64" in args

    # The pool renamed, its layout chosen over 16 GPUs (gpusPerReplica, accepted by the CRD's
    # CEL beside the defaulted layout fields): the old pool's LWS is pruned, the new one's
    # applied with the layout the planner chose (DP16+EP, as kvtune plan chooses).
    stored = _patch_spec(cluster_api, "dsv3", {"pools": [{
        "gpuClass": "H100", "name": "big", "replicas": 2, "gpusPerReplica": 16,
        "nodesPerReplica": 2}]})
    assert stored["status"]["pools"][0]["phase"] == "Applied", stored["status"]
    assert stored["status"]["pools"][0]["reasons"][0].startswith("layout"), stored["status"]
    with pytest.raises(ApiException) as gone:
        _lws(cluster_api, "dsv3-h100")
    assert gone.value.status == 404
    big = _lws(cluster_api, "dsv3-big")
    assert big["spec"]["replicas"] == 2
    args = big["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0][
        "args"]
    assert "--data-parallel-size=16" in args and "--enable-expert-parallel" in args

    # The pool back on one node per replica (a model one node holds): its Deployment applied,
    # its LeaderWorkerSet deleted.
    stored = _patch_spec(cluster_api, "dsv3", {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "pools": [{"gpuClass": "H100", "name": "big", "replicas": 1}]})
    assert stored["status"]["pools"][0]["phase"] == "Applied", stored["status"]
    client.AppsV1Api(cluster_api).read_namespaced_deployment("dsv3-big", NS)
    with pytest.raises(ApiException) as gone:
        _lws(cluster_api, "dsv3-big")
    assert gone.value.status == 404


def test_the_rendered_leader_worker_set_is_accepted_by_the_lws_crd(cluster_api: Any) -> None:
    """Server-side applied as kvtune applies its objects: the release's structural schema
    prunes nothing (what the server holds is what was rendered), and a group size the schema
    refuses is refused."""
    install_crd(cluster_api, crd_path())
    group = rendered(spec_for(TWO_NODES))[0]
    group["metadata"]["namespace"] = NS
    custom = client.CustomObjectsApi(cluster_api)
    kw = {"field_manager": "kvtune", "force": True,
          "_content_type": "application/apply-patch+yaml"}
    name = group["metadata"]["name"]
    custom.patch_namespaced_custom_object(LWS_GROUP, LWS_VERSION, NS, LWS_PLURAL, name, group,
                                          **kw)
    held = custom.get_namespaced_custom_object(LWS_GROUP, LWS_VERSION, NS, LWS_PLURAL, name)
    lwt, want = held["spec"]["leaderWorkerTemplate"], group["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and held["spec"]["replicas"] == 2
    for template in ("leaderTemplate", "workerTemplate"):
        got_pod, want_pod = lwt[template]["spec"], want[template]["spec"]
        assert got_pod["containers"][0]["args"] == want_pod["containers"][0]["args"]
        assert got_pod["containers"][0]["command"] == want_pod["containers"][0]["command"]
        assert got_pod["containers"][0]["resources"] == want_pod["containers"][0]["resources"]
    # The schema's defaults added (partition 0), nothing rendered dropped.
    strategy = held["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert group["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"].items() <= \
        strategy.items()
    broken = copy.deepcopy(group)
    broken["spec"]["rolloutStrategy"]["type"] = "Recreate"
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(LWS_GROUP, LWS_VERSION, NS, LWS_PLURAL, name,
                                              broken, **kw)
    assert refused.value.status == 422
    assert f"{LWS_GROUP}/{LWS_VERSION}" == lws.API_VERSION


def test_a_pipeline_over_two_nodes_rolls_out_as_a_leader_worker_set(cluster_api: Any) -> None:
    """Llama-3.1-405B as TP8 x PP2 over 2 nodes: admitted by the CRD's CEL (pipelineParallel
    beside nodesPerReplica, a multiple of it), planned, and applied as an LWS whose pods join
    one engine by vLLM's --nnodes/--node-rank, held by the release's CRD exactly as rendered;
    3 stages over the same 2 nodes are refused at admission."""
    from test_op_pipeline_nodes import L405, STAGES_OVER_NODES

    install_crd(cluster_api, crd_path())
    stored = _create(cluster_api, "l405", [STAGES_OVER_NODES], model=L405)
    pool = stored["status"]["pools"][0]
    assert pool["phase"] == "Applied" and pool["deployment"] == "l405-h100", pool
    assert "--pipeline-parallel-size=2" in pool["vllmArgs"], pool
    with pytest.raises(ApiException):
        client.AppsV1Api(cluster_api).read_namespaced_deployment("l405-h100", NS)
    lwt = _lws(cluster_api, "l405-h100")["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "--nnodes=2" in leader["args"] and "--master-addr=$(LWS_LEADER_ADDRESS)" in \
        leader["args"]
    assert lws.NODE_RANK_FLAG in worker["command"][2] and worker["args"][-1] == "--headless"
    for container in (leader, worker):
        assert container["resources"]["limits"]["nvidia.com/gpu"] in (8, "8")

    spec = copy.deepcopy(BASE)
    spec["model"] = {"name": L405}
    spec["pools"] = [{**STAGES_OVER_NODES, "name": "split", "tensorParallel": 4,
                      "pipelineParallel": 3}]
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(cluster_api).create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
                "metadata": {"name": "l405-split", "namespace": NS}, "spec": spec})
    assert refused.value.status == 422
    assert "pools[].pipelineParallel must be a multiple of nodesPerReplica" in \
        str(refused.value.body)
