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


# issue 27 item 4: each pattern's example plans, renders, and its plan says what the pinned
# versions offer for the pattern (tuner/planner/decide_pattern.py).
PATTERN_REASON = {"rag.yaml": ("cache-blend", "NotOnThePins"),
                  "agentic.yaml": ("session-kv", "SessionTier"),
                  "multi-tenant-system-prompt.yaml": ("cache-salt", "IsolationNotRetention"),
                  "multi-turn-chat.yaml": ("routing", "NearestToConsistentHashing")}
# The plugin types gateway-api-inference-extension v1.5.0 registers that kvtune renders
# (cmd/epp/runner/runner.go: registerInTreePlugins).
IE_V150_PLUGINS = {"approx-prefix-cache-producer", "prefix-cache-scorer", "queue-scorer",
                   "kv-cache-utilization-scorer", "max-score-picker",
                   "prefix-cache-affinity-filter"}


@pytest.mark.parametrize("filename", sorted(PATTERN_REASON))
def test_pattern_example_plans_renders_and_states_its_pattern(filename: str) -> None:
    from kvtune.operator.render.objects import RenderInput, render_pool
    from kvtune.operator.routing.inference_pool import AFFINITY_FILTER, epp_config

    doc = _load(EXAMPLES[[p.name for p in EXAMPLES].index(filename)])
    spec = InferenceDeploymentSpec.model_validate(doc["spec"])
    model = plan_stage.resolve_model(spec, doc["metadata"]["namespace"], None)
    profile, policy = declared_profile(spec.workload), plan_stage.policy_for(spec)
    knob, code = PATTERN_REASON[filename]
    for pool in spec.pools:
        pool_plan = plan_stage.plan_one_pool(spec, pool, model, profile, policy)
        assert [r.code for r in pool_plan.reasons if r.knob == knob] == [code], pool.gpu_class
        objects = render_pool(RenderInput(
            name=doc["metadata"]["name"], namespace=doc["metadata"]["namespace"],
            pool=pool.pool_name, pool_plan=pool_plan, model_name=spec.model.name,
            image=spec.runtime.image, replicas=pool.replicas, revision=1))
        assert "Deployment" in {o["kind"] for o in objects}
        if filename == "multi-turn-chat.yaml":
            assert spec.routing is not None and spec.routing.enabled
            config = epp_config(pool_plan, multi_turn=bool(profile.multi_turn))
            types = [p["type"] for p in config["plugins"]]
            assert AFFINITY_FILTER in types and set(types) <= IE_V150_PLUGINS
