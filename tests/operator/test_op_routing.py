"""The Gateway API Inference Extension objects of a pool follow its plan (pure rendering)."""

from __future__ import annotations

import yaml
from op_samples import make_pool_plan

from kvtune.operator import routing

LABELS = {"kvtune.io/deployment": "bot", "kvtune.io/pool": "h200"}


def _objects(**knobs: object) -> tuple[dict, dict]:  # type: ignore[type-arg]
    pool, config_map = routing.routing_objects(
        name="bot", namespace="llm", pool="h200", pool_plan=make_pool_plan(**knobs),
        labels=LABELS)
    return pool, config_map


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
    _, cm = routing.routing_objects(name="bot", namespace="llm", pool="h200",
                                    pool_plan=make_pool_plan(), labels=LABELS,
                                    prefix_hit_rate=0.02)
    config = yaml.safe_load(cm["data"][routing.EPP_CONFIG_KEY])
    weights = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert weights["prefix-cache-scorer"] == 1
    assert "2%" in cm["metadata"]["annotations"][routing.ANNOTATION_SCORER_WEIGHTS]
    _, cm = routing.routing_objects(name="bot", namespace="llm", pool="h200",
                                    pool_plan=make_pool_plan(), labels=LABELS,
                                    prefix_hit_rate=0.6)
    config = yaml.safe_load(cm["data"][routing.EPP_CONFIG_KEY])
    weights = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert weights["prefix-cache-scorer"] == 3
