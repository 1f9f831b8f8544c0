"""``kvtune plan --from-cluster NAME -o patch``: the pin patch from a recommend-mode status."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from kvtune.cli.plan_from_cluster import NoRecommendation, pin_patch, render_patch

PLAN_H200 = {"blockSize": 32, "kvCacheDtype": "fp8", "gpuMemoryUtilization": 0.95,
             "maxModelLen": 32768, "maxNumSeqs": 192, "maxNumBatchedTokens": 8192,
             "enablePrefixCaching": True}
OBJ: dict[str, Any] = {
    "apiVersion": "kvtune.io/v1alpha1", "kind": "InferenceDeployment",
    "metadata": {"name": "support-bot", "namespace": "llm", "generation": 3},
    "spec": {"tuning": {"mode": "recommend"}},
    "status": {
        "observedGeneration": 3,
        "profile": {"source": "prometheus", "window": "6h", "requests": 182034},
        "pools": [{
            "name": "h200", "gpuClass": "H200", "tensorParallel": 1, "replicas": 2,
            "phase": "Recommended", "plan": PLAN_H200,
            "expected": {"kvCacheTokens": 1843200, "concurrentSequences": 230,
                         "concurrentSequencesContextTokens": 8000},
            "reasons": ["kv dtype fp8: bf16 holds 115 sessions at p95, target 192"],
        }],
    },
}


def test_one_pool_pins_every_knob() -> None:
    patch, comments = pin_patch(OBJ)
    assert patch == {
        "apiVersion": "kvtune.io/v1alpha1", "kind": "InferenceDeployment",
        "metadata": {"name": "support-bot", "namespace": "llm"},
        "spec": {"tuning": {"pin": PLAN_H200}},
    }
    assert any("bf16 holds 115 sessions" in c for c in comments)
    assert any("set it to auto" in c for c in comments)


def test_rendered_patch_is_yaml_with_the_reasons_as_comments() -> None:
    text = render_patch(OBJ)
    assert text.startswith("# kvtune: pin the plan recommended for llm/support-bot\n")
    assert "# profile: source prometheus, window 6h, requests 182034\n" in text
    assert yaml.safe_load(text)["spec"]["tuning"]["pin"]["kvCacheDtype"] == "fp8"


def test_pools_that_differ_pin_only_what_they_share() -> None:
    obj = copy.deepcopy(OBJ)
    h100 = copy.deepcopy(obj["status"]["pools"][0])
    h100.update(name="h100", gpuClass="H100", tensorParallel=2,
                plan={**PLAN_H200, "gpuMemoryUtilization": 0.92, "maxNumSeqs": 96})
    obj["status"]["pools"].append(h100)
    patch, comments = pin_patch(obj)
    pin = patch["spec"]["tuning"]["pin"]
    assert "gpuMemoryUtilization" not in pin and "maxNumSeqs" not in pin
    assert pin["blockSize"] == 32 and pin["kvCacheDtype"] == "fp8"
    assert "maxNumSeqs differs by pool (h200=192, h100=96): left to the tuner" in comments
    # Picking one pool pins its whole plan.
    assert pin_patch(obj, pool="H100")[0]["spec"]["tuning"]["pin"]["maxNumSeqs"] == 96


def test_bytes_win_over_the_fraction() -> None:
    obj = copy.deepcopy(OBJ)
    obj["status"]["pools"][0]["plan"]["kvCacheMemoryBytes"] = 64 * 2**30
    pin = pin_patch(obj)[0]["spec"]["tuning"]["pin"]
    assert pin["kvCacheMemoryBytes"] == 64 * 2**30 and "gpuMemoryUtilization" not in pin


def test_stale_status_is_flagged() -> None:
    obj = copy.deepcopy(OBJ)
    obj["metadata"]["generation"] = 4
    assert any(c.startswith("WARNING: status is for generation 3") for c in pin_patch(obj)[1])


@pytest.mark.parametrize(("status", "pool", "message"), [
    ({}, None, "has no plan in status.pools yet"),
    (OBJ["status"], "b200", "no planned pool 'b200' in llm/support-bot; planned pools: h200"),
])
def test_nothing_to_pin_says_why(status: dict[str, Any], pool: str | None, message: str) -> None:
    obj = {**OBJ, "status": status}
    with pytest.raises(NoRecommendation, match=message):
        pin_patch(obj, pool)


@pytest.mark.parametrize(("args", "message"), [
    (["-o", "patch"], "-o patch needs --from-cluster NAME"),
    (["--from-cluster", "bot", "-o", "json"], "use -o patch, not -o json"),
])
def test_plan_command_usage_errors(args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from kvtune.cli.main import cli

    result = CliRunner().invoke(cli, ["plan", *args])
    assert result.exit_code == 2
    assert message in result.output
