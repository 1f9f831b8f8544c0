"""A pool on a GPU kvtune has no data for (issue 14 item 6): declared in the CRD by its facts,
found on nodes labelled kvtune.io/gpu-class, planned like any class."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC
from pydantic import ValidationError

from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.kube.pools import classify_node
from kvtune.operator.rollout.plan import plan_one_pool, policy_for, resolve_model
from kvtune.tuner.planner.presets import preset_profile

CUSTOM = {"gpuClass": "RTX6000", "replicas": 1, "customGpu": {
    "memory": "47.4GiB", "bandwidth": "960GB/s", "bf16": "364TFLOPS", "fp8": "728TFLOPS",
    "computeCapability": "8.9"}}


def _spec(pool: dict[str, Any]) -> InferenceDeploymentSpec:
    body = copy.deepcopy(SAMPLE_SPEC)
    body["pools"] = [pool]
    return InferenceDeploymentSpec.model_validate(body)


def test_custom_gpu_pool_is_planned() -> None:
    spec = _spec(CUSTOM)
    (pool,) = spec.pools
    plan = plan_one_pool(spec, pool, resolve_model(spec, "llm", None),
                         preset_profile("chat"), policy_for(spec))
    assert plan.gpu_class == "RTX6000"
    assert plan.expected.kv_cache_bytes + plan.expected.non_kv_bytes_per_gpu < 47.4 * 2**30


def test_custom_gpu_fields_are_validated() -> None:
    bad = copy.deepcopy(CUSTOM)
    bad["customGpu"]["computeCapability"] = "eight"
    with pytest.raises(ValidationError, match="computeCapability"):
        _spec(bad)


def test_nodes_labelled_with_the_custom_class_are_its_pool() -> None:
    node = {"metadata": {"name": "n1", "labels": {"kvtune.io/gpu-class": "RTX6000"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    gpu_node = classify_node(node)
    assert gpu_node is not None
    assert (gpu_node.gpu_class, gpu_node.selector_key, gpu_node.gpus) == (
        "RTX6000", "kvtune.io/gpu-class", 4)
