"""Every example in examples/ is a valid InferenceDeployment that kvtune can plan on each of
its pools (the article's four patterns across H100, H200 and B200, and the demo's sample)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.rollout import plan as plan_stage

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
PATTERNS = {"rag.yaml": "rag", "agentic.yaml": "agent",
            "multi-tenant-system-prompt.yaml": "multi-tenant", "multi-turn-chat.yaml": "chat"}


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def test_the_four_patterns_cover_three_gpu_classes() -> None:
    names = {p.name for p in EXAMPLES}
    assert set(PATTERNS) <= names
    classes = {pool["gpuClass"] for p in EXAMPLES if p.name in PATTERNS
               for pool in _load(p)["spec"]["pools"]}
    assert classes == {"H100", "H200", "B200"}
    for filename, profile in PATTERNS.items():
        assert _load(EXAMPLES[[p.name for p in EXAMPLES].index(filename)])["spec"][
            "workload"]["profile"] == profile


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_parses_and_plans_every_pool(path: Path) -> None:
    doc = _load(path)
    assert doc["apiVersion"] == "kvtune.io/v1alpha1" and doc["kind"] == "InferenceDeployment"
    spec = InferenceDeploymentSpec.model_validate(doc["spec"])
    model = plan_stage.resolve_model(spec, doc["metadata"]["namespace"], None)
    profile, policy = declared_profile(spec.workload), plan_stage.policy_for(spec)
    for pool in spec.pools:
        pool_plan = plan_stage.plan_one_pool(spec, pool, model, profile, policy)
        assert pool_plan.gpu_class == pool.gpu_class
        assert pool_plan.expected.concurrent_sequences >= 1
        if spec.tuning.pin and spec.tuning.pin.block_size:
            assert pool_plan.plan.block_size == spec.tuning.pin.block_size
        if path.name == "agentic.yaml":
            # issue 27: it says it keeps session KV in a CPU tier, so it must.
            assert pool_plan.plan.kv_offloading_size_gib, pool.gpu_class
