"""Fixtures of the Prometheus tests."""

from __future__ import annotations

import pytest
from kvtune.operator.prom_http import ENV_ALLOWED

# The operator reaches only allow-listed Prometheus URLs (its own configuration); these tests
# run Prometheus (and the operator, which inherits the environment) on loopback.
LOOPBACK_PROMETHEUS = "http://127.0.0.1:*"


@pytest.fixture(autouse=True)
def allow_loopback_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ALLOWED, LOOPBACK_PROMETHEUS)
