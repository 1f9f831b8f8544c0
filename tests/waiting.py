"""Waiting for a condition in integration tests (never a fixed sleep). Importable from every
test area: pytest puts tests/ on sys.path because tests/conftest.py lives there."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def wait_scale() -> float:
    """How much longer than its deadline a wait may take: ``KVTUNE_TEST_WAIT_SCALE``, else the
    number of pytest-xdist workers. A deadline here guards against a hang; what the cluster
    tests wait on is mostly the operator's own CPU-bound search, which takes longer while
    another worker shares the cores. A test that checks a time (a failover under 30 s)
    measures it and asserts it apart from its wait, so the scale never loosens it."""
    given = os.environ.get("KVTUNE_TEST_WAIT_SCALE") or os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    return max(1.0, float(given)) if given else 1.0


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 60.0,
             log: Path | None = None) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` (and the
    operator log's tail) on timeout."""
    timeout *= wait_scale()
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n--- operator log ---\n" + "\n".join(log.read_text().splitlines()[-40:])
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last}"
                         f"{tail}")
