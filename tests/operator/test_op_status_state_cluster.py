"""State kept in status survives every other status write, on the real API server.

The retune timer's clocks (dwell, min interval) are stored in
``status.profile.retune.pools[].state``. They used to sit in an untyped corner of the schema
(``x-kubernetes-preserve-unknown-fields``) that the other writers' typed status did not
carry, so their merge patch nulled it: after a rollout the min-interval guard was skipped.
No operator process serves these namespaces: the seams are called directly (the profiler is
the retune timer's injected input, the traffic it "observed")."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from op_cluster_helpers import (
    OperatorProcess,
    create_infd,
    ensure_namespace,
    get_infd,
    patch_spec,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC

from kvtune.operator import reconcile as rec
from kvtune.operator.kube.apply import Kube
from kvtune.operator.prometheus.profiling import (
    LatencyQuantiles,
    ObservedFigures,
    ProfileResult,
    ProfilingSettings,
)
from kvtune.operator.retune import decide as retune
from kvtune.operator.retune import retune_handlers
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster)


def _traffic(p50: int, p99: int) -> ProfileResult:
    profile = WorkloadProfile(
        source="prometheus", context_tokens=TokenQuantiles(p50=p50, p95=p99 // 2, p99=p99,
                                                           max=p99 * 2),
        output_tokens=TokenQuantiles(p50=150, p95=600, p99=800, max=2000),
        requests=5000, window_seconds=60.0, request_rate_per_second=80.0)
    observed = ObservedFigures(
        window_seconds=60, at_unix_seconds=0, requests=5000, request_rate_per_second=80.0,
        prefix_hit_rate=None, kv_cache_usage_mean=None, kv_cache_usage_max=None,
        preemptions_per_second=0.0, waiting_mean=None, ttft=LatencyQuantiles(),
        tpot=LatencyQuantiles())
    return ProfileResult(trusted=True, reason="Observed", message="5000 requests",
                         profile=profile, observed=observed)


SHORT, LONG = _traffic(1000, 4000), _traffic(20000, 60000)


def _spec() -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    spec.pop("rollout")
    spec["workload"] = {"profile": "chat",
                        "contextTokens": {"p50": 1000, "p99": 4000, "max": 8192}}
    spec["tuning"] = {"mode": "auto",
                      "prometheus": {"url": "http://127.0.0.1:9", "window": "1m",
                                     "poolSelector": "none"},
                      "retune": {"driftThreshold": 0.3, "dwell": "1m", "minInterval": "1h"}}
    return spec


def _tick(api: Any, ns: str, at: float, traffic: ProfileResult) -> retune_handlers.RetuneOutcome:
    def profiler(_url: str, _settings: ProfilingSettings) -> ProfileResult:
        return traffic

    return retune_handlers.retune_once(get_infd(api, ns, "clocks"), kube=Kube(api),
                                       now_seconds=at, profiler=profiler)


def _state(api: Any, ns: str) -> dict[str, Any]:
    retune_status = get_infd(api, ns, "clocks")["status"]["profile"]["retune"]
    state: dict[str, Any] = retune_status["pools"][0]["state"]
    return state


def test_the_retune_clocks_survive_other_status_writes_and_hold_the_min_interval(
    cluster_api: Any,
) -> None:
    ns = "st-clocks"
    ensure_namespace(cluster_api, ns)
    create_infd(cluster_api, ns, "clocks", _spec())
    kube = Kube(cluster_api)
    assert rec.reconcile(get_infd(cluster_api, ns, "clocks"), kube=kube).status_changed

    # The traffic turns long and holds for the dwell: re-planned and rolled out.
    assert _tick(cluster_api, ns, 1000.0, LONG).reason == retune.DWELL_PENDING
    rolled = _tick(cluster_api, ns, 1061.0, LONG)
    assert rolled.reason == retune.PLAN_CHANGED and rolled.rolled_out, rolled.message
    assert _state(cluster_api, ns)["lastRolloutSeconds"] == 1061.0

    # Another writer writes status (an unrelated spec edit: a new observedGeneration).
    patch_spec(cluster_api, ns, "clocks", {"tuning": {"retune": {"driftThreshold": 0.31}}})
    written = rec.reconcile(get_infd(cluster_api, ns, "clocks"), kube=kube)
    assert written.status_changed
    stored = get_infd(cluster_api, ns, "clocks")
    assert stored["status"]["observedGeneration"] == stored["metadata"]["generation"]
    assert _state(cluster_api, ns)["lastRolloutSeconds"] == 1061.0
    # So does the rollout follower.
    rec.refresh_rollout(stored, kube=kube)
    assert _state(cluster_api, ns)["lastRolloutSeconds"] == 1061.0

    # The traffic turns back and holds for a dwell, within the hour's min interval: the
    # guard holds (it was skipped when the clocks had been erased).
    assert _tick(cluster_api, ns, 1200.0, SHORT).reason == retune.DWELL_PENDING
    held = _tick(cluster_api, ns, 1270.0, SHORT)
    assert held.reason == retune.MIN_INTERVAL_PENDING, held.message
    assert not held.rolled_out
    pools = get_infd(cluster_api, ns, "clocks")["status"]["pools"]
    assert pools[0]["revision"] == 2


# --- the plan in force is state (issue 11 item 7) -------------------------------------------

# Within pool quiet's drift threshold of the declared workload, yet a plan made on it differs
# (a longer max-model-len): the plan quiet's decision declined.
MID = _traffic(2000, 8000)


def _two_pool_spec() -> dict[str, Any]:
    spec = _spec()
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1, "name": "long"},
                     {"gpuClass": "H200", "replicas": 1, "name": "quiet"}]
    spec["tuning"]["prometheus"].pop("poolSelector")  # each pool on its own pods' series
    spec["tuning"]["retune"]["minInterval"] = "0s"
    spec["tuning"]["retune"]["driftThreshold"] = 0.6
    spec["workload"] = {"profile": "chat", "contextTokens": {"p50": 1000, "p99": 4000}}
    return spec


def _pool_traffic(_url: str, settings: ProfilingSettings) -> ProfileResult:
    """The deployment's traffic moved a little, pool long's a lot; pool quiet has too few
    requests of its own (it falls back to the deployment-wide profile)."""
    if "model_name" in settings.selector:
        return MID
    if re.fullmatch(settings.selector_regex["pod"], "plans-long-6f7d9c8b5-x2x7q"):
        return LONG
    few = SHORT.model_copy(update={"trusted": False, "profile": None,
                                   "reason": "TooFewRequests", "message": "12 requests"})
    return few


def _revisions(api: Any, ns: str) -> dict[str, tuple[int, str]]:
    pools = get_infd(api, ns, "plans")["status"]["pools"]
    return {p["name"]: (p["revision"], p["planHash"]) for p in pools}


def test_a_restart_or_an_unrelated_edit_keeps_the_plans_in_force(
    local_cluster: Any, cluster_api: Any, tmp_path: Path,
) -> None:
    ns = "st-plans"
    ensure_namespace(cluster_api, ns)
    create_infd(cluster_api, ns, "plans", _two_pool_spec())
    kube = Kube(cluster_api)
    rec.reconcile(get_infd(cluster_api, ns, "plans"), kube=kube)
    before = _revisions(cluster_api, ns)
    assert before["long"][0] == 1 and before["quiet"][0] == 1

    def tick(at: float) -> retune_handlers.RetuneOutcome:
        return retune_handlers.retune_once(get_infd(cluster_api, ns, "plans"), kube=kube,
                                           now_seconds=at, profiler=_pool_traffic)

    tick(1000.0)
    replanned = tick(1061.0)
    assert replanned.reason == retune.PLAN_CHANGED, replanned.message
    after_retune = _revisions(cluster_api, ns)
    assert after_retune["long"][0] == 2, after_retune  # re-planned on its own traffic
    assert after_retune["quiet"] == before["quiet"]  # its decision: the plan stays
    decisions = {p["name"]: p["reason"] for p in get_infd(cluster_api, ns, "plans")[
        "status"]["profile"]["retune"]["pools"]}
    assert decisions == {"long": retune.PLAN_CHANGED, "quiet": retune.BELOW_THRESHOLD}
    stored = get_infd(cluster_api, ns, "plans")["status"]
    assert stored["profile"]["source"] == "prometheus"  # the deployment-wide one moved

    # A restart: the operator's resume handler reconciles every object.
    operator = OperatorProcess(Path(local_cluster.kubeconfig_path), [ns],
                               tmp_path / "operator.log")
    operator.start()
    try:
        wait_for(lambda: "reconciled" in operator.current_log(), "the resume reconcile", 90,
                 operator.log)
        assert _revisions(cluster_api, ns) == after_retune, operator.current_log()[-3000:]
        # An edit of a field that is no planning input.
        patch_spec(cluster_api, ns, "plans",
                   {"tuning": {"prometheus": {"url": "http://127.0.0.1:19090"}}})
        generation = get_infd(cluster_api, ns, "plans")["metadata"]["generation"]
        wait_for(lambda: get_infd(cluster_api, ns, "plans")["status"].get(
            "observedGeneration") == generation, "the edit reconciled", 90, operator.log)
        assert _revisions(cluster_api, ns) == after_retune
    finally:
        operator.stop()


def test_a_kvtune_that_would_plan_otherwise_keeps_the_plan_in_force(
    cluster_api: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator upgrade whose planner chooses otherwise for the same inputs (here: half
    the max-num-seqs) keeps the running plan and says what it would choose; a change of a
    planning input adopts the new planner's plan. A status written before ``planInputs``
    existed counts as made from the current inputs while the spec is unchanged."""
    from kubernetes import client

    from kvtune.operator.rollout import plan as plan_stage

    ns, name = "st-upgrade", "upgrade"
    ensure_namespace(cluster_api, ns)
    create_infd(cluster_api, ns, name, _spec())
    kube = Kube(cluster_api)
    rec.reconcile(get_infd(cluster_api, ns, name), kube=kube)
    first = get_infd(cluster_api, ns, name)["status"]["pools"][0]
    assert first["planInputs"] and first["revision"] == 1

    # The status an older kvtune wrote: no planInputs.
    older = get_infd(cluster_api, ns, name)["status"]
    older["pools"] = [{k: v for k, v in p.items() if k != "planInputs"} for p in older["pools"]]
    client.CustomObjectsApi(cluster_api).patch_namespaced_custom_object_status(
        "kvtune.io", "v1alpha1", ns, "inferencedeployments", name, {"status": older})

    real = plan_stage.plan_one_pool

    def newer_planner(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        return made.model_copy(update={"plan": made.plan.model_copy(
            update={"max_num_seqs": max(1, made.plan.max_num_seqs // 2)})})

    monkeypatch.setattr(plan_stage, "plan_one_pool", newer_planner)

    def pool() -> dict[str, Any]:
        return dict(get_infd(cluster_api, ns, name)["status"]["pools"][0])

    for edit in (None, {"pools": [{"gpuClass": "H100", "replicas": 2}]}):
        if edit is not None:  # replicas are no planning input
            patch_spec(cluster_api, ns, name, edit)
        rec.reconcile(get_infd(cluster_api, ns, name), kube=kube)
        kept = pool()
        assert (kept["revision"], kept["planHash"], kept["plan"], kept["vllmArgs"]) == \
            (first["revision"], first["planHash"], first["plan"], first["vllmArgs"])
        assert kept["planInputs"] == first["planInputs"]
        said = [w for w in kept["warnings"] if w.startswith(plan_stage.KEPT_WARNING)]
        assert len(said) == 1 and "max_num_seqs" in said[0], kept["warnings"]

    # A planning input changes: the plan is made again, by the planner this kvtune has.
    patch_spec(cluster_api, ns, name,
               {"workload": {"contextTokens": {"p50": 1000, "p99": 6000, "max": 8192}}})
    rec.reconcile(get_infd(cluster_api, ns, name), kube=kube)
    moved = pool()
    assert moved["revision"] == first["revision"] + 1
    assert moved["planInputs"] != first["planInputs"]
    assert moved["plan"]["maxNumSeqs"] <= max(1, first["plan"]["maxNumSeqs"] // 2) * 2
    assert not [w for w in moved["warnings"] if w.startswith(plan_stage.KEPT_WARNING)]
