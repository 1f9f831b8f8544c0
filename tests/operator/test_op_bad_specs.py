"""The operator's own check of a spec (pydantic) agrees with the API server's (the CRD):
every bad spec the CRD refuses, the operator refuses too (an object admitted under an older
CRD is still never trusted), and every spec meant to be Degraded passes both."""

from __future__ import annotations

import pytest
from bad_specs import CASES, BadSpec
from pydantic import ValidationError

from kvtune.operator.api import InferenceDeploymentSpec


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
