"""The operator's own check of a spec (pydantic) agrees with the API server's (the CRD):
every bad spec the CRD refuses, the operator refuses too (an object admitted under an older
CRD is still never trusted), and every spec meant to be Degraded passes both."""

from __future__ import annotations

import json

import pytest
from bad_specs import BASE, CASES, BadSpec
from pydantic import ValidationError

from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.dropped_fields import LAST_APPLIED, dropped_fields


@pytest.mark.parametrize("case", [c for c in CASES if c.expect == "admission" and not c.name],
                         ids=lambda c: c.id)
def test_the_operator_refuses_what_admission_refuses(case: BadSpec) -> None:
    with pytest.raises(ValidationError):
        InferenceDeploymentSpec.model_validate(case.spec())


@pytest.mark.parametrize("case", [c for c in CASES if c.expect != "admission"],
                         ids=lambda c: c.id)
def test_typos_and_degraded_cases_are_valid_specs(case: BadSpec) -> None:
    spec = case.spec()
    if case.expect == "strict":  # the server prunes the typo; the operator sees the rest
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            InferenceDeploymentSpec.model_validate(spec)
        return
    InferenceDeploymentSpec.model_validate(spec)


@pytest.mark.parametrize("case", [c for c in CASES if c.expect == "strict"], ids=lambda c: c.id)
def test_a_pruned_field_is_named_from_the_last_applied_configuration(case: BadSpec) -> None:
    """What a client-side apply sent keeps the typo the API server pruned: the operator names
    it (the stored spec lacks it), and nothing when the stored spec is what was applied."""
    applied = {"apiVersion": "kvtune.io/v1alpha1", "kind": "InferenceDeployment",
               "spec": case.spec()}
    stored = InferenceDeploymentSpec.model_validate(BASE).model_dump(by_alias=True,
                                                                     exclude_unset=True)
    body = {"metadata": {"annotations": {LAST_APPLIED: json.dumps(applied)}}, "spec": stored}
    found = dropped_fields(body)
    assert len(found) == 1 and found[0][0].endswith(case.needles[0]), found
    clean = {"metadata": {"annotations": {LAST_APPLIED: json.dumps({"spec": BASE})}},
             "spec": BASE}
    assert dropped_fields(clean) == []


def test_a_label_value_admitted_under_an_older_crd_is_named_with_its_fix() -> None:
    """The operator never trusts the CRD it was admitted under: a label value the API server
    would refuse on the PodMonitor is InvalidSpec naming field, value and fix (before: an
    apply failure on every reconcile)."""
    from pydantic import ValidationError

    from kvtune.operator.reconcile import describe_validation_error

    spec = {**BASE, "monitoring": {"scrape": {"labels": {"release": "kube prom"}}}}
    with pytest.raises(ValidationError) as refused:
        InferenceDeploymentSpec.model_validate(spec)
    message = describe_validation_error(refused.value)
    assert message.startswith('spec.monitoring.scrape.labels.release="kube prom": String '
                              "should match pattern"), message
    assert message.endswith("(fix: change it to match)"), message

