"""The rendered routing objects against the Gateway API Inference Extension's real CRDs (the
pinned release's own manifests, installed into the local control plane): the API server keeps
every field kvtune renders (a misspelt one would be pruned by the structural schema), refuses
an invalid pool, and a new plan moves the scorer's block size."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import ensure_namespace, install_crd
from op_samples import make_pool_plan

from kvtune.e2e.inference_extension import crd_paths
from kvtune.operator import routing

NS = "routing"
LABELS = {"kvtune.io/deployment": "bot", "kvtune.io/pool": "h200"}
GROUP, VERSION, PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
APPLY = "application/apply-patch+yaml"


def _apply_pool(api_client: Any, obj: dict[str, Any]) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api_client)
    custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, obj["metadata"]["name"],
                                          obj, field_manager="kvtune", force=True,
                                          _content_type=APPLY)
    return custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
        GROUP, VERSION, NS, PLURAL, obj["metadata"]["name"])


def _apply_config_map(api_client: Any, obj: dict[str, Any]) -> None:
    client.CoreV1Api(api_client).patch_namespaced_config_map(
        obj["metadata"]["name"], NS, obj, field_manager="kvtune", force=True,
        _content_type=APPLY)


@pytest.mark.cluster
def test_routing_objects_are_accepted_as_rendered_by_the_real_crds(local_cluster: Any) -> None:
    api_client = local_cluster.api_client()
    for path in crd_paths():
        install_crd(api_client, path)
    ensure_namespace(api_client, NS)

    pool, config_map = routing.routing_objects(
        name="bot", namespace=NS, pool="h200", pool_plan=make_pool_plan(block_size=32),
        labels=LABELS)
    held = _apply_pool(api_client, pool)
    # The structural schema prunes unknown fields: what the server holds is what was rendered.
    assert held["spec"] == pool["spec"]
    assert held["metadata"]["labels"] == pool["metadata"]["labels"]
    _apply_config_map(api_client, config_map)

    broken = json.loads(json.dumps(pool))
    broken["spec"]["targetPorts"] = [{"number": 0}]
    with pytest.raises(ApiException) as refused:
        _apply_pool(api_client, broken)
    assert refused.value.status == 422

    # A new plan (block 16): both objects follow, in the same apply.
    pool2, config_map2 = routing.routing_objects(
        name="bot", namespace=NS, pool="h200", pool_plan=make_pool_plan(block_size=16),
        labels=LABELS)
    assert _apply_pool(api_client, pool2)["metadata"]["labels"][routing.LABEL_BLOCK_SIZE] == "16"
    _apply_config_map(api_client, config_map2)
    stored = client.CoreV1Api(api_client).read_namespaced_config_map(
        config_map2["metadata"]["name"], NS)
    config = yaml.safe_load(stored.data[routing.EPP_CONFIG_KEY])
    producer = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")
    assert producer["parameters"]["blockSizeTokens"] == 16


def _run_endpoint_picker(local_cluster: Any, config_text: str, tmp_path: Any,
                         timeout_seconds: float) -> tuple[int | None, str]:
    """The Inference Extension's own endpoint picker on ``config_text``, against the local
    cluster; (exit code or None while running, its log) once it has loaded its configuration
    or exited."""
    import os
    import subprocess
    import time

    from kvtune.e2e.inference_extension import endpoint_picker
    from kvtune.e2e.prometheus import free_port

    config = tmp_path / "epp-config.yaml"
    config.write_text(config_text)
    log_path = tmp_path / "epp.log"
    env = {**os.environ, "KUBECONFIG": str(local_cluster.kubeconfig_path)}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(endpoint_picker()), "--config-file", str(config), "--pool-name", "bot-h200",
             "--pool-namespace", NS, "--grpc-port", str(free_port()),
             "--grpc-health-port", str(free_port()), "--metrics-port", str(free_port()),
             "--metrics-endpoint-auth=false"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            text = log_path.read_text()
            if proc.poll() is not None or "Instantiated all plugins" in text:
                break
            time.sleep(0.2)
        return proc.poll(), log_path.read_text()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.cluster
def test_the_endpoint_picker_loads_the_rendered_configuration(local_cluster: Any,
                                                              tmp_path: Any) -> None:
    api_client = local_cluster.api_client()
    for path in crd_paths():
        install_crd(api_client, path)
    ensure_namespace(api_client, NS)
    pool, config_map = routing.routing_objects(
        name="bot", namespace=NS, pool="h200", pool_plan=make_pool_plan(block_size=32),
        labels=LABELS)
    _apply_pool(api_client, pool)
    text = config_map["data"][routing.EPP_CONFIG_KEY]

    code, log = _run_endpoint_picker(local_cluster, text, tmp_path, 120)
    assert code is None, f"the endpoint picker exited ({code}) on kvtune's configuration:\n{log}"
    assert "Instantiated all plugins" in log
    assert "approx-prefix-cache-producer" in log

    # The same configuration with a block size the producer refuses: the picker refuses to
    # start, so the check above is not vacuous.
    broken = text.replace("blockSizeTokens: 32", "blockSizeTokens: 0")
    assert broken != text
    code, log = _run_endpoint_picker(local_cluster, broken, tmp_path, 120)
    assert code not in (None, 0), log
    assert "BlockSizeTokens must be > 0" in log
