"""The plan in force survives a retune (issue 24), on the real API server.

The retune timer's reconcile stores the digest of what the pool's plan was made from (the
observed profile among it); the next reconcile rebuilds that profile from status and
computes the digest again. Status used to lose the profile's window and notes (and put the
declared preset's notes in their place), so the digests differed: after every retune, an
unrelated edit, a restart or a kvtune whose planner would choose otherwise re-planned from
scratch and could roll out a new plan with no input changed. No operator process serves
this namespace except for the restart: the seams are called directly (the profiler is the
retune timer's injected input, the traffic it "observed")."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from op_cluster_helpers import (
    OperatorProcess,
    create_infd,
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
from kvtune.operator.rollout import plan as plan_stage
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NS, NAME = "pif-retune", "kept"

# Long contexts at 80 requests/s, as the profiling module reports a window: its length and
# its notes on how the quantiles were read (what status used to drop).
LONG = WorkloadProfile(
    source="prometheus",
    context_tokens=TokenQuantiles(p50=20000, p95=30000, p99=60000, max=120000),
    output_tokens=TokenQuantiles(p50=150, p95=600, p99=800, max=2000),
    requests=4800, window_seconds=60.0, request_rate_per_second=80.0,
    notes=("context tokens: p50 in [10000, 20000], p99 in [50000, 100000]",
           "output tokens: p50 in [100, 200], p99 in [500, 1000]",
           "quantiles interpolated log-linearly inside vLLM's 1-2-5 buckets; the true "
           "value lies in the bracket"))


def _window(_url: str, _settings: ProfilingSettings) -> ProfileResult:
    observed = ObservedFigures(
        window_seconds=60, at_unix_seconds=0, requests=4800, request_rate_per_second=80.0,
        prefix_hit_rate=None, kv_cache_usage_mean=None, kv_cache_usage_max=None,
        preemptions_per_second=0.0, waiting_mean=None, ttft=LatencyQuantiles(),
        tpot=LatencyQuantiles())
    return ProfileResult(trusted=True, reason="Observed", message="4800 requests",
                         profile=LONG, observed=observed)


def _spec() -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    spec.pop("rollout")
    spec["workload"] = {"profile": "chat",
                        "contextTokens": {"p50": 1000, "p99": 4000, "max": 8192}}
    spec["tuning"] = {"mode": "auto",
                      "prometheus": {"url": "http://127.0.0.1:9", "window": "1m",
                                     "poolSelector": "none"},
                      "retune": {"driftThreshold": 0.3, "dwell": "1m", "minInterval": "0s"}}
    return spec


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, NS)


def _in_force(api: Any) -> dict[str, Any]:
    """What must not move while no planning input changes: the plan, its identity (the
    hash the pods run: a new one is a rollout), its revision and the digest it was made
    from."""
    pool = get_infd(api, NS, NAME)["status"]["pools"][0]
    return {"revision": pool["revision"], "planHash": pool["planHash"],
            "planInputs": pool["planInputs"], "plan": pool["plan"]}


def _kept_warnings(api: Any) -> list[str]:
    pool = get_infd(api, NS, NAME)["status"]["pools"][0]
    return [w for w in pool["warnings"] if w.startswith(plan_stage.KEPT_WARNING)]


def test_after_a_retune_a_planner_change_an_edit_and_a_restart_keep_the_plan_in_force(
    local_cluster: Any, cluster_api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    create_infd(cluster_api, NS, NAME, _spec())
    kube = Kube(cluster_api)
    rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)

    def tick(at: float) -> retune_handlers.RetuneOutcome:
        return retune_handlers.retune_once(get_infd(cluster_api, NS, NAME), kube=kube,
                                           now_seconds=at, profiler=_window)

    # The traffic turns long and holds for the dwell: re-planned on it and rolled out.
    assert tick(1000.0).reason == retune.DWELL_PENDING
    rolled = tick(1061.0)
    assert rolled.reason == retune.PLAN_CHANGED and rolled.rolled_out, rolled.message
    after_retune = _in_force(cluster_api)
    assert after_retune["revision"] == 2

    # A kvtune whose planner would choose otherwise for the same inputs (an upgrade): the
    # plan in force stays, and status says what this kvtune would choose.
    real = plan_stage.plan_one_pool

    def newer_planner(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        return made.model_copy(update={"plan": made.plan.model_copy(
            update={"max_num_seqs": max(1, made.plan.max_num_seqs // 2)})})

    with monkeypatch.context() as patched:
        patched.setattr(plan_stage, "plan_one_pool", newer_planner)
        rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)
        assert _in_force(cluster_api) == after_retune
        said = _kept_warnings(cluster_api)
        assert len(said) == 1 and "max_num_seqs" in said[0], said

    # An edit of a field that is no planning input.
    patch_spec(cluster_api, NS, NAME, {"tuning": {"retune": {"driftThreshold": 0.31}}})
    rec.reconcile(get_infd(cluster_api, NS, NAME), kube=kube)
    stored = get_infd(cluster_api, NS, NAME)
    assert stored["status"]["observedGeneration"] == stored["metadata"]["generation"]
    assert _in_force(cluster_api) == after_retune
    assert not _kept_warnings(cluster_api)  # this planner's plan is the plan in force
    assert stored["status"]["pools"][0]["profile"]["source"] == "prometheus"

    # A restart: the operator's resume handler reconciles every object.
    operator = OperatorProcess(Path(local_cluster.kubeconfig_path), [NS],
                               tmp_path / "operator.log")
    operator.start()
    try:
        wait_for(lambda: "reconciled" in operator.current_log(), "the resume reconcile", 240,
                 operator.log)
        assert _in_force(cluster_api) == after_retune, operator.current_log()[-3000:]
        # And an unrelated edit the operator reconciles itself.
        patch_spec(cluster_api, NS, NAME,
                   {"tuning": {"prometheus": {"url": "http://127.0.0.1:19090"}}})
        generation = get_infd(cluster_api, NS, NAME)["metadata"]["generation"]
        wait_for(lambda: get_infd(cluster_api, NS, NAME)["status"].get(
            "observedGeneration") == generation, "the edit reconciled", 240, operator.log)
        assert _in_force(cluster_api) == after_retune, operator.current_log()[-3000:]
    finally:
        operator.stop()
