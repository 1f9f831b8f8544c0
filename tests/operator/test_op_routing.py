"""The Gateway API Inference Extension objects of a pool follow its plan (pure rendering)."""

from __future__ import annotations

import pytest
import yaml
from op_samples import make_pool_plan

from kvtune.operator.render import pod_policy
from kvtune.operator.routing import endpoint_picker
from kvtune.operator.routing import inference_pool as routing

LABELS = {"kvtune.io/deployment": "bot", "kvtune.io/pool": "h200"}


def _by_kind(objects: list[dict]) -> dict[str, dict]:  # type: ignore[type-arg]
    kinds = {o["kind"]: o for o in objects}
    assert len(kinds) == len(objects)
    return kinds


def _objects(**knobs: object) -> tuple[dict, dict]:  # type: ignore[type-arg]
    kinds = _by_kind(routing.routing_objects(
        name="bot", namespace="llm", pool="h200", pool_plan=make_pool_plan(**knobs),
        labels=LABELS))
    return kinds["InferencePool"], kinds["ConfigMap"]


def _producer(config_map: dict) -> dict:  # type: ignore[type-arg]
    config = yaml.safe_load(config_map["data"][routing.EPP_CONFIG_KEY])
    assert config["kind"] == "EndpointPickerConfig"
    (producer,) = [p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer"]
    return producer["parameters"]  # type: ignore[no-any-return]


def test_the_scorer_hashes_in_the_plans_block_size_and_follows_a_plan_change() -> None:
    _, config_map = _objects(block_size=32)
    params = _producer(config_map)
    assert params["blockSizeTokens"] == 32
    assert params["autoTune"] is False  # a guessed block size would hash other boundaries
    assert params["maxPrefixTokensToMatch"] == 32768
    assert params["lruCapacityPerServer"] == 51_200  # the plan's KV blocks
    _, changed = _objects(block_size=16, max_model_len=8192)
    assert _producer(changed)["blockSizeTokens"] == 16
    assert _producer(changed)["maxPrefixTokensToMatch"] == 8192


def test_the_inference_pool_selects_the_pools_pods_and_carries_its_limits() -> None:
    pool, config_map = _objects(max_model_len=16384, block_size=64)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["metadata"]["name"] == "bot-h200"
    assert pool["spec"]["selector"]["matchLabels"] == LABELS
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"]["name"] == config_map["metadata"]["name"] \
        == "bot-h200-epp"
    assert pool["metadata"]["labels"][routing.LABEL_MAX_MODEL_LEN] == "16384"
    assert pool["metadata"]["labels"][routing.LABEL_BLOCK_SIZE] == "64"


def test_low_prefix_reuse_lowers_the_prefix_scorers_weight_and_says_why() -> None:
    cm = _by_kind(routing.routing_objects(name="bot", namespace="llm", pool="h200",
                                          pool_plan=make_pool_plan(), labels=LABELS,
                                          prefix_hit_rate=0.02))["ConfigMap"]
    config = yaml.safe_load(cm["data"][routing.EPP_CONFIG_KEY])
    weights = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert weights["prefix-cache-scorer"] == 1
    assert "2%" in cm["metadata"]["annotations"][routing.ANNOTATION_SCORER_WEIGHTS]
    cm = _by_kind(routing.routing_objects(name="bot", namespace="llm", pool="h200",
                                          pool_plan=make_pool_plan(), labels=LABELS,
                                          prefix_hit_rate=0.6))["ConfigMap"]
    config = yaml.safe_load(cm["data"][routing.EPP_CONFIG_KEY])
    weights = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert weights["prefix-cache-scorer"] == 3


def test_the_endpoint_picker_reads_the_pools_config_and_serves_the_pools_ref() -> None:
    kinds = _by_kind(routing.routing_objects(name="bot", namespace="llm", pool="h200",
                                             pool_plan=make_pool_plan(), labels=LABELS))
    pool, cm, dep, svc = (kinds[k] for k in ("InferencePool", "ConfigMap", "Deployment",
                                              "Service"))
    ref = pool["spec"]["endpointPickerRef"]
    # The ref names the EPP's Service, on its ext-proc port, which selects the EPP's pods.
    assert (ref["kind"], ref["name"]) == ("Service", svc["metadata"]["name"])
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc-ext-proc")
    assert grpc["port"] == ref["port"]["number"] == 9002
    template = dep["spec"]["template"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"] \
        == template["metadata"]["labels"]
    # The EPP's pods are not the pool's model servers: nothing that selects those takes them.
    selector = pool["spec"]["selector"]["matchLabels"]
    assert not set(selector.items()) <= set(template["metadata"]["labels"].items())
    (container,) = template["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    assert args[args.index("--pool-namespace") + 1] == "llm"
    (volume,) = template["spec"]["volumes"]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert args[args.index("--config-file") + 1] == \
        f"{container['volumeMounts'][0]['mountPath']}/{routing.EPP_CONFIG_KEY}"
    assert template["spec"]["serviceAccountName"] == endpoint_picker.SERVICE_ACCOUNT
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    # The EPP pod meets the strictest Pod Security level (its account is the chart's own).
    found = pod_policy.violations(template, "restricted")
    assert [v for v in found if "serviceAccountName" not in v] == [], found


def test_a_new_plan_restarts_the_endpoint_picker_and_a_reworded_reason_does_not() -> None:
    def config_hash(**knobs: object) -> str:
        kinds = _by_kind(routing.routing_objects(
            name="bot", namespace="llm", pool="h200", pool_plan=make_pool_plan(**knobs),
            labels=LABELS))
        annotations = kinds["Deployment"]["spec"]["template"]["metadata"]["annotations"]
        return str(annotations[endpoint_picker.ANNOTATION_CONFIG_HASH])

    # The EPP reads its configuration once, at start: a new block size must restart it.
    assert config_hash(block_size=32) != config_hash(block_size=16)
    assert config_hash(block_size=32) == config_hash(block_size=32)


def test_the_endpoint_pickers_access_is_read_only_and_namespaced() -> None:
    sa, role, binding = endpoint_picker.namespace_objects("llm")
    assert (sa["kind"], role["kind"], binding["kind"]) == ("ServiceAccount", "Role",
                                                            "RoleBinding")
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"pods", "inferencepools", "inferenceobjectives",
                         "inferencemodelrewrites"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "llm"}]


def test_multi_turn_traffic_keeps_a_request_on_the_pods_holding_its_prefix() -> None:
    plain = routing.epp_config(make_pool_plan())
    assert routing.AFFINITY_FILTER not in str(plain)
    config = routing.epp_config(make_pool_plan(), multi_turn=True)
    (affinity,) = [p for p in config["plugins"] if p["type"] == routing.AFFINITY_FILTER]
    assert affinity["parameters"]["affinityThreshold"] == 0.8
    # A filter first: the load scorers then choose among the pods that hold the prefix.
    profile = config["schedulingProfiles"][0]["plugins"]
    assert profile[0] == {"pluginRef": routing.AFFINITY_FILTER}
    assert [p["pluginRef"] for p in profile[1:]] == [
        p["pluginRef"] for p in plain["schedulingProfiles"][0]["plugins"]]


def test_the_pickers_resources_come_from_the_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    def container() -> dict:  # type: ignore[type-arg]
        kinds = _by_kind(routing.routing_objects(name="bot", namespace="llm", pool="h200",
                                                 pool_plan=make_pool_plan(), labels=LABELS))
        return kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]

    assert container()["resources"] == endpoint_picker.RESOURCES
    monkeypatch.setenv(endpoint_picker.RESOURCES_ENV, '{"requests": {"cpu": "500m"}}')
    assert container()["resources"] == {"requests": {"cpu": "500m"}}
    monkeypatch.setenv(endpoint_picker.RESOURCES_ENV, "[1]")
    with pytest.raises(ValueError, match=r"routing\.endpointPicker\.resources"):
        container()
