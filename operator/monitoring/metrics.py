"""The operator's own Prometheus metrics (not vLLM's): reconciles, their duration, errors.

A private registry, so importing kvtune in a test or a CLI does not register collectors
globally, and ``serve`` binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "kvtune_reconciles", "Reconciles of InferenceDeployments, by trigger and outcome.",
    ["trigger", "outcome"], registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "kvtune_reconcile_duration_seconds", "Wall time of one reconcile.", ["trigger"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "kvtune_reconcile_errors", "Reconciles that raised, by exception type.", ["error"],
    registry=REGISTRY,
)
PLAN_CHANGES = Counter(
    "kvtune_plan_changes", "Pool plans that changed (a new plan revision).", [],
    registry=REGISTRY,
)
POOLS = Gauge(
    "kvtune_pools", "Pools of the last reconcile, by InferenceDeployment and phase.",
    ["namespace", "name", "phase"], registry=REGISTRY,
)


@contextmanager
def timed(trigger: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        RECONCILE_SECONDS.labels(trigger).observe(time.perf_counter() - start)


def serve(port: int, address: str = "127.0.0.1") -> None:
    """Expose ``/metrics`` on ``address:port`` (0: off)."""
    if port:
        start_http_server(port, addr=address, registry=REGISTRY)
