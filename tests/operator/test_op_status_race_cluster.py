"""No status update is lost when the retune timer and a reconcile write at once (issue 24),
on the real API server.

The timer's report used to be written without a resourceVersion check and outside the
object lock, and the reconcile wrote its whole status unguarded: a reconcile that read
status just before the timer's report wrote the older report (its figures, clocks and
conditions) back, and the reverse. Every writer now goes through one transaction
(``status.update``: read, mutate, patch with the resourceVersion, retry on 409).

Two threads run many times each, as the operator's timer and handlers do: retune ticks
(the real ``retune_once``, on injected traffic whose request count grows by one each tick)
and reconciles of a spec edited each time. A watch records every status the API server
stored; in none may a writer's figure go back to an older one."""

from __future__ import annotations

import copy
import itertools
import threading
from typing import Any

import pytest
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    create_infd,
    get_infd,
    patch_spec,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC

from kvtune.operator import reconcile as rec
from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.kube.apply import Kube
from kvtune.operator.prometheus.profiling import (
    LatencyQuantiles,
    ObservedFigures,
    ProfileResult,
    ProfilingSettings,
)
from kvtune.operator.retune import retune_handlers

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NS, NAME = "st-race", "race"
ITERATIONS = 30
FIRST_REQUESTS = 1000


def _spec() -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    spec.pop("rollout")
    spec["tuning"] = {"mode": "recommend",
                      "prometheus": {"url": "http://127.0.0.1:9", "window": "1m",
                                     "poolSelector": "none"},
                      "retune": {"driftThreshold": 0.3, "minInterval": "0s"}}
    return spec


def _traffic(requests: int) -> ProfileResult:
    """The declared workload, observed (no drift: every tick decides BelowThreshold and
    writes its report only); ``requests`` tells the ticks apart."""
    declared = declared_profile(InferenceDeploymentSpec.model_validate(_spec()).workload)
    profile = declared.model_copy(update={"source": "prometheus", "requests": requests,
                                          "window_seconds": 60.0})
    observed = ObservedFigures(
        window_seconds=60, at_unix_seconds=0, requests=requests, request_rate_per_second=1.0,
        prefix_hit_rate=None, kv_cache_usage_mean=None, kv_cache_usage_max=None,
        preemptions_per_second=0.0, waiting_mean=None, ttft=LatencyQuantiles(),
        tpot=LatencyQuantiles())
    return ProfileResult(trusted=True, reason="Observed", message=f"tick {requests}",
                         profile=profile, observed=observed)


def _witnesses(status: dict[str, Any]) -> dict[str, int | None]:
    """Each writer's latest figure in one stored status: the tick's request count (its
    window figures, and its ProfileStale condition) and the reconciled generation."""
    profile = status.get("profile") or {}
    stale = condition({"status": status}, "ProfileStale")
    return {
        "profile.observed.requests": (profile.get("observed") or {}).get("requests"),
        "ProfileStale message": int(stale["message"].split()[-1]) if stale else None,
        "observedGeneration": status.get("observedGeneration"),
    }


class StatusWatch:
    """Every status the API server stores for the object, in order (a watch from
    ``resource_version`` on, resumed where it stopped)."""

    def __init__(self, api: Any, resource_version: str) -> None:
        self.api, self.resource_version = api, resource_version
        self.seen: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from kubernetes import client, watch

        custom = client.CustomObjectsApi(self.api)
        while not self.stop.is_set():
            for event in watch.Watch().stream(
                    custom.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL,
                    field_selector=f"metadata.name={NAME}",
                    resource_version=self.resource_version, timeout_seconds=2):
                obj = event["object"]
                # An ERROR (410: the version is too old) would leave a gap: fail loudly.
                assert event["type"] in ("ADDED", "MODIFIED"), event
                self.resource_version = obj["metadata"]["resourceVersion"]
                self.seen.append(obj.get("status") or {})

    def until(self, resource_version: str) -> list[dict[str, Any]]:
        wait_for(lambda: self.resource_version == resource_version or not
                 self.thread.is_alive(),
                 f"the watch to reach resourceVersion {resource_version}", 30)
        assert self.resource_version == resource_version, "the watch stopped early"
        self.stop.set()
        self.thread.join(timeout=10)
        return self.seen


def test_concurrent_retune_reports_and_reconciles_lose_no_update(local_cluster: Any) -> None:
    api = prepare_namespaces(local_cluster, NS)
    create_infd(api, NS, NAME, _spec())
    rec.reconcile(get_infd(api, NS, NAME), kube=Kube(api))
    start = get_infd(api, NS, NAME)
    watch = StatusWatch(local_cluster.api_client(), start["metadata"]["resourceVersion"])
    failures: list[BaseException] = []

    def ticks() -> None:
        kube = Kube(local_cluster.api_client())  # one client per thread, as the operator's
        try:
            for i in range(ITERATIONS):
                def profiler(_url: str, _s: ProfilingSettings, i: int = i) -> ProfileResult:
                    return _traffic(FIRST_REQUESTS + i)

                body = get_infd(kube.api_client, NS, NAME)
                outcome = retune_handlers.retune_once(body, kube=kube, now_seconds=1000.0 + i,
                                                      profiler=profiler)
                assert outcome.reason == "BelowThreshold", outcome.message
        except BaseException as exc:
            failures.append(exc)

    def reconciles() -> None:
        api_ = local_cluster.api_client()
        try:
            for i in range(ITERATIONS):
                patch_spec(api_, NS, NAME, {"tuning": {"retune": {
                    "driftThreshold": round(0.3 + (i + 1) / 1000, 3)}}})
                rec.reconcile(get_infd(api_, NS, NAME), kube=Kube(api_))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=ticks), threading.Thread(target=reconciles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not failures, failures
    final = get_infd(api, NS, NAME)
    seen = watch.until(final["metadata"]["resourceVersion"])

    # The last write of each writer stands...
    last = _witnesses(final["status"])
    assert last == {"profile.observed.requests": FIRST_REQUESTS + ITERATIONS - 1,
                    "ProfileStale message": FIRST_REQUESTS + ITERATIONS - 1,
                    "observedGeneration": final["metadata"]["generation"]}, last
    # ... and no stored status ever took a writer's figure back to an older one.
    assert len(seen) >= ITERATIONS, len(seen)
    for key in last:
        figures = [w[key] for w in map(_witnesses, seen)]
        went_back = [(a, b) for a, b in itertools.pairwise(figures)
                     if a is not None and (b is None or b < a)]
        assert not went_back, f"{key} went back: {went_back} (all: {figures})"
