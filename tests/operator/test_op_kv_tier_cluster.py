"""The LMCache tiers' Deployments against a real kube-apiserver (issue 27 item 1): the API
server takes each rendered Deployment as it is (its env, the disk tier's emptyDir and
ephemeral-storage, the memory request) and keeps what kvtune rendered."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.utils import parse_quantity
from op_samples import make_pool_plan

from kvtune.operator.render.objects import RenderInput, render_pool
from kvtune.tuner.plan_tier import KVTier

pytestmark = pytest.mark.cluster

NS = "kv-tiers"
TIERS = {
    "cpu": KVTier(kind="lmcache-cpu", size_gib=48.0),
    "disk": KVTier(kind="lmcache-disk", size_gib=600.0, buffer_gib=10.0),
    "remote": KVTier(kind="lmcache-remote", size_gib=2000.0, buffer_gib=10.0,
                     remote_url="lm://lmcache-server.kv-tiers.svc:65432"),
}


def _deployment(name: str, tier: KVTier) -> dict[str, Any]:
    pool_plan = make_pool_plan().model_copy(update={"kv_tier": tier, "tensor_parallel": 2})
    inp = RenderInput(name=name, namespace=NS, pool="h200", pool_plan=pool_plan,
                      model_name="meta-llama/Llama-3.1-8B-Instruct",
                      image="vllm/vllm-openai:v0.33.0", replicas=1, revision=1)
    return next(o for o in render_pool(inp) if o["kind"] == "Deployment")


@pytest.mark.parametrize("kind", sorted(TIERS))
def test_the_api_server_keeps_each_tiers_deployment(local_cluster: Any, kind: str) -> None:
    api = local_cluster.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": NS}})
    except client.ApiException as exc:
        assert exc.status == 409, exc  # made by an earlier case
    rendered = _deployment(f"tier-{kind}", TIERS[kind])
    made = apps.create_namespaced_deployment(NS, rendered)
    back = api.sanitize_for_serialization(
        apps.read_namespaced_deployment(made.metadata.name, NS))
    pod, want = back["spec"]["template"]["spec"], rendered["spec"]["template"]["spec"]
    container, wanted = pod["containers"][0], want["containers"][0]
    assert container["env"] == wanted["env"]
    assert container["args"] == wanted["args"]
    # The server writes quantities in canonical form (614400Mi reads back as 600Gi).
    for part in ("requests", "limits"):
        assert {k: parse_quantity(v) for k, v in container["resources"][part].items()} == {
            k: parse_quantity(v) for k, v in wanted["resources"][part].items()}
    assert [v["name"] for v in pod["volumes"]] == [v["name"] for v in want["volumes"]]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == str(TIERS[kind].cpu_gib() / 2)
    if kind == "disk":
        disk = next(v for v in pod["volumes"] if v["name"] == "lmcache-disk")
        assert parse_quantity(disk["emptyDir"]["sizeLimit"]) == 600 * 2**30
        assert parse_quantity(container["resources"]["requests"]["ephemeral-storage"]) == (
            600 * 2**30)
    else:
        assert "ephemeral-storage" not in container["resources"]["requests"]
