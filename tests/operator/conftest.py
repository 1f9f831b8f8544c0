"""Fixtures of the operator's tests (builders live in op_samples.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC, make_pool_plan

from kvtune.tuner.plan import PoolPlan


@pytest.fixture
def pool_plan() -> PoolPlan:
    return make_pool_plan()


@pytest.fixture
def sample_spec() -> dict[str, Any]:
    return copy.deepcopy(SAMPLE_SPEC)


# The operator reaches only allow-listed Prometheus URLs (its own configuration); the tests run
# Prometheus and loopback servers (and the operator, which inherits the environment) on
# 127.0.0.1 only.
@pytest.fixture(autouse=True)
def allow_loopback_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtune.operator.prometheus.prom_http import ENV_ALLOWED

    monkeypatch.setenv(ENV_ALLOWED, "http://127.0.0.1:*")
