"""A pool that can never work fails alone, with a message naming the field, the value and
the fix, before anything is applied (no API access is needed to get there)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC

from kvtune.operator import reconcile as rec
from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.rollout.outcome import Event, PoolContext
from kvtune.operator.rollout.plan import PlanInput, policy_for, resolve_model
from kvtune.operator.rollout.pool import rollout_pool
from kvtune.operator.workloads import declared_profile

BODY = {"metadata": {"name": "bot", "namespace": "llm", "uid": "u"}}


def _outcome(spec_dict: dict[str, Any]) -> Any:
    spec = InferenceDeploymentSpec.model_validate(spec_dict)
    model = resolve_model(spec, "llm", None)
    events: list[Event] = []
    ctx = PoolContext(spec=spec, index=0, pool=spec.pools[0], body=BODY,
                      kube=None, now="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
                      base=rec.base_status(spec, spec.pools[0], None, "bot"), events=events)
    return rollout_pool(ctx, PlanInput(  # one pool's stages, as reconcile runs them
        model=model, profile=declared_profile(spec.workload), policy=policy_for(spec),
        profile_used=None), {})


@pytest.mark.parametrize(("change", "reason", "needles"), [
    ({"pools": [{"gpuClass": "Z999"}]}, "InvalidSpec",
     ["spec.pools[0].gpuClass", "Z999", "H100"]),
    ({"model": {"name": "meta-llama/Llama-3.3-70B-Instruct"},
      "pools": [{"gpuClass": "H100", "tensorParallel": 1}], "rollout": None},
     "NoFeasiblePlan", ["spec.pools[0]", "H100", "tensorParallel=1"]),
    ({"tuning": {"pin": {"kvCacheDtype": "fp8_ds_mla"}}}, "InvalidSpec",
     ["spec.pools[0]", "spec.tuning.pin.kvCacheDtype", "fp8_ds_mla"]),
])
def test_pool_failures_name_field_value_and_fix(
    change: dict[str, Any], reason: str, needles: list[str]
) -> None:
    spec = {**copy.deepcopy(SAMPLE_SPEC), **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    outcome = _outcome(spec)
    assert outcome.status.phase == "Failed"
    assert outcome.failure is not None and outcome.failure[0] == reason
    for needle in needles:
        assert needle in outcome.failure[1], outcome.failure[1]


def test_pool_without_nodes_is_planned_but_not_applied() -> None:
    outcome = _outcome(copy.deepcopy(SAMPLE_SPEC))
    assert outcome.no_nodes and outcome.status.phase == "NoNodes"
    assert outcome.status.plan is not None and outcome.status.revision == 1
    assert "H200" in outcome.status.message
