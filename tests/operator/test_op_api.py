"""The spec's validation in Python mirrors the CRD's CEL rules: each case names its field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC
from pydantic import ValidationError

from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.durations import parse_duration
from kvtune.tuner.errors import InvalidInput


def _with(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    node: Any = spec
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    last = parts[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return spec


def test_sample_parses_with_camel_case_aliases() -> None:
    spec = InferenceDeploymentSpec.model_validate(SAMPLE_SPEC)
    assert spec.pools[1].tensor_parallel == 2
    assert spec.pools[0].pool_name == "h200"
    assert spec.quality is not None and spec.quality.lowest_kv_precision == "fp8"
    assert spec.slo is not None and spec.slo.tpot_p95_seconds() == pytest.approx(0.08)
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["quality"]["lowestKVPrecision"] == "fp8"
    # The KV-quality gate's defaults (issue 15).
    assert dumped["quality"]["maxKVQuantizationKL"] == 0.01
    assert dumped["quality"]["requireMeasurement"] is False
    assert dumped["quality"]["calibration"]["timeout"] == "30m"
    assert dumped["pools"][0]["gpuClass"] == "H200"


@pytest.mark.parametrize(("path", "value", "needle"), [
    ("pools.0.replicas", 0, "canaryReplicas"),
    ("pools.1.gpuClass", "H200", "used twice"),
    ("tuning.pin.blockSize", 24, "multiple of 16"),
    ("tuning.pin", {"gpuMemoryUtilization": 0.9, "kvCacheMemoryBytes": 10}, "not both"),
    ("tuning.pin.kvCacheDtype", "nvfp4", "narrower than"),
    ("tuning.pin.kvCacheDtype", "fp9", "kvCacheDtype"),
    ("tuning.mode", "yolo", "mode"),
    ("slo.ttftP95", "2 seconds", "ttftP95"),
    ("pools.0.tensorParallel", 3, "tensorParallel"),
    ("workload.contextTokens", {"p50": 9000, "p99": 100}, "p50=9000 exceeds p99=100"),
    ("pools", [], "pools"),
    ("model.weightsDtype", "fp7", "weightsDtype"),
])
def test_invalid_specs_are_refused_naming_the_field(path: str, value: Any, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        InferenceDeploymentSpec.model_validate(_with(path, value))
    assert needle in str(info.value)


@pytest.mark.parametrize(("text", "seconds"), [
    ("2s", 2.0), ("80ms", 0.08), ("6h", 21600.0), ("10m", 600.0), ("1h30m", 5400.0),
    ("1.5s", 1.5),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, field="spec.x") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "s", "2 s", "-1s", "2d", "1e3s"])
def test_bad_durations_name_the_field(text: str) -> None:
    with pytest.raises(InvalidInput, match=r"spec\.slo\.ttftP95"):
        parse_duration(text, field="spec.slo.ttftP95")
