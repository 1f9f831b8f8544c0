"""spec.tuning.retune.dwell: defaults to the window, refused when shorter than it (pydantic
here, the same rule as CEL in the CRD), and used by the retune timer's decisions."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kvtune.operator.api import InferenceDeploymentSpec, TuningSpec
from kvtune.operator.api.crdgen import crd as build_crd

PROM = {"url": "http://prometheus:9090", "window": "10m"}


@pytest.mark.parametrize(("retune", "dwell_seconds"), [
    ({}, 600.0),  # left out: the window
    ({"dwell": "10m"}, 600.0),
    ({"dwell": "1h"}, 3600.0),
    ({"dwell": "0.5h"}, 1800.0),
])
def test_dwell_defaults_to_the_window(retune: dict[str, Any], dwell_seconds: float) -> None:
    tuning = TuningSpec.model_validate({"prometheus": PROM, "retune": retune})
    assert tuning.retune is not None and tuning.prometheus is not None
    assert tuning.retune.dwell_seconds(tuning.prometheus.window_seconds()) == dwell_seconds


@pytest.mark.parametrize(("tuning", "needle"), [
    ({"prometheus": PROM, "retune": {"dwell": "5m"}}, "shorter than"),
    # The window's default (6h) counts when the spec leaves it out.
    ({"prometheus": {"url": "http://p:9090"}, "retune": {"dwell": "1h"}}, "'6h'"),
    ({"prometheus": PROM, "retune": {"dwell": "5 minutes"}}, "dwell"),
])
def test_a_dwell_shorter_than_the_window_is_refused(tuning: dict[str, Any],
                                                    needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        TuningSpec.model_validate(tuning)
    assert needle in str(info.value)


def test_dwell_without_prometheus_is_allowed() -> None:
    # Nothing is profiled, so the dwell has nothing to cover.
    TuningSpec.model_validate({"retune": {"dwell": "1s"}})


def test_the_crd_carries_the_dwell_field_and_its_cel_rule() -> None:
    crd = build_crd()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    tuning = spec["properties"]["tuning"]
    assert "dwell" in tuning["properties"]["retune"]["properties"]
    rules = [r["rule"] for r in tuning["x-kubernetes-validations"]]
    assert any("duration(self.retune.dwell) >=" in r for r in rules)
    InferenceDeploymentSpec.model_json_schema()  # the model still builds its schema
