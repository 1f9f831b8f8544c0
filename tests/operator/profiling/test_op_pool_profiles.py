"""Per-pool profiles: which series are a pool's, the fallback to the deployment-wide profile
when a pool has too few requests, and the retune timer deciding pool by pool (pure, with a
fake profiler, a fake API and the reconcile seam captured)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from kvtune.operator import reconcile as rec
from kvtune.operator.api import InferenceDeploymentSpec, PoolStatus, PrometheusSpec
from kvtune.operator.api.workloads import declared_profile, profile_status
from kvtune.operator.kube import status as status_writer
from kvtune.operator.prometheus import selectors
from kvtune.operator.prometheus.profiling import (
    LatencyQuantiles,
    ObservedFigures,
    ProfileResult,
    ProfilingSettings,
    choose_for_pool,
    queries,
)
from kvtune.operator.render.objects import object_name
from kvtune.operator.retune import decide as retune
from kvtune.operator.retune import retune_handlers, retune_state
from kvtune.operator.rollout import plan as plan_stage
from kvtune.operator.rollout.outcome import Event
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

PROM = PrometheusSpec(url="http://prometheus:9090", window="1m")


def _promql(prom: PrometheusSpec, pool: str) -> str:
    series = selectors.pool_selector(prom, namespace="llm", deployment="bot", pool=pool)
    return "" if series is None else series.promql()


@pytest.mark.parametrize(("update", "expected"), [
    ({}, '{namespace="llm",pod=~"bot-h200(-canary)?-[a-z0-9]+-[a-z0-9]+"}'),
    ({"namespace_label": "kubernetes_namespace", "pod_label": "kubernetes_pod_name"},
     '{kubernetes_namespace="llm",kubernetes_pod_name=~"bot-h200(-canary)?-[a-z0-9]+-[a-z0-9]+"}'),
    ({"pool_selector": "labels"},
     '{kvtune_io_deployment="bot",kvtune_io_pool="h200",namespace="llm"}'),
    ({"pool_selector": "labels", "pool_label": "pool", "deployment_label": "app"},
     '{app="bot",namespace="llm",pool="h200"}'),
    ({"pool_selector": "none"}, ""),
])
def test_pool_selectors(update: dict[str, Any], expected: str) -> None:
    assert _promql(PROM.model_copy(update=update), "h200") == expected


@pytest.mark.parametrize(("pod", "pool", "matches"), [
    ("bot-h200-6f7d9c8b5-x2x7q", "h200", True),
    ("bot-h200-canary-6f7d9c8b5-x2x7q", "h200", True),  # the canary runs the pool's plan
    ("bot-h200-long-6f7d9c8b5-x2x7q", "h200", False),  # another pool's pods
    ("bot-h200-long-6f7d9c8b5-x2x7q", "h200-long", True),
    ("bot-h2000-6f7d9c8b5-x2x7q", "h200", False),
    ("other-bot-h200-6f7d9c8b5-x2x7q", "h200", False),
    ("bot-h200-6f7d9c8b5", "h200", False),  # not a Deployment's pod
])
def test_the_pod_regex_takes_exactly_the_pools_pods(pod: str, pool: str, matches: bool) -> None:
    series = selectors.pool_selector(PROM, namespace="llm", deployment="bot", pool=pool)
    assert series is not None
    # Prometheus anchors a regex matcher at both ends: fullmatch.
    assert bool(re.fullmatch(series.regex["pod"], pod)) is matches


def test_a_long_name_uses_the_cut_object_name_and_escapes_nothing_it_needs() -> None:
    name = "a" * 70
    series = selectors.pool_selector(PROM, namespace="llm", deployment=name, pool="h200")
    assert series is not None
    prefix = object_name(name, "h200")
    assert re.fullmatch(series.regex["pod"], f"{prefix}-6f7d9c8b5-x2x7q")
    assert selectors.re2_escape("a.b(c)") == r"a\.b\(c\)"


def test_queries_carry_the_regex_and_the_info_metric_drops_only_model_name() -> None:
    series = selectors.pool_selector(PROM, namespace="llm", deployment="bot", pool="h200")
    assert series is not None
    q = queries(series.model_copy(update={"equal": {**series.equal, "model_name": "m"}}), 60)
    assert q["requests"] == ('sum(increase(vllm:request_success_total{model_name="m",'
                             'namespace="llm",pod=~"bot-h200(-canary)?-[a-z0-9]+-[a-z0-9]+"}'
                             '[60s]))')
    assert "model_name" not in q["cache_config"] and 'pod=~"bot-h200' in q["cache_config"]
    # The old dict form still works (equality matchers only).
    assert queries({"model_name": "m"}, 60)["requests"] == \
        'sum(increase(vllm:request_success_total{model_name="m"}[60s]))'
    settings = ProfilingSettings.for_series(series, window_seconds=60)
    assert settings.series() == series


def _q(p50: int, p99: int) -> TokenQuantiles:
    return TokenQuantiles(p50=p50, p90=p99 // 2, p95=p99 * 3 // 4, p99=p99, max=p99 * 2)


def _profile(p50: int, p99: int, requests: int, hit: float = 0.0) -> WorkloadProfile:
    return WorkloadProfile(source="prometheus", context_tokens=_q(p50, p99),
                           output_tokens=_q(150, 800), prefix_hit_rate=hit,
                           requests=requests, window_seconds=60.0,
                           request_rate_per_second=requests / 60)


def _result(profile: WorkloadProfile | None, requests: int,
            reason: str | None = None) -> ProfileResult:
    observed = ObservedFigures(
        window_seconds=60, at_unix_seconds=0, requests=requests,
        request_rate_per_second=requests / 60, prefix_hit_rate=None, kv_cache_usage_mean=None,
        kv_cache_usage_max=None, preemptions_per_second=0.0, waiting_mean=None,
        ttft=LatencyQuantiles(), tpot=LatencyQuantiles())
    if profile is not None:
        return ProfileResult(trusted=True, reason="Observed", message=f"{requests} requests",
                             profile=profile, observed=observed)
    return ProfileResult(
        trusted=False, reason=reason or "TooFewRequests", profile=None, observed=observed,
        message=f"{requests} requests in the last 60s, fewer than min_requests=200; the "
                f"declared workload stays")


SHORT = _profile(1000, 4000, 900)
LONG = _profile(12000, 60000, 700, hit=0.5)
WIDE = _profile(1100, 4200, 1700)


@pytest.mark.parametrize(("own", "wide", "scope", "planned_on", "needle"), [
    (_result(LONG, 700), _result(WIDE, 1700), "pool", LONG, "pool h200: 700 requests"),
    (_result(None, 12), _result(WIDE, 1700), "deployment", WIDE,
     "12 requests in the last 60s, fewer than min_requests=200; planned on the "
     "deployment-wide profile (1700 requests)"),
    (_result(None, 0, "NoData"), _result(WIDE, 1700), "deployment", WIDE, "deployment-wide"),
    (_result(None, 12), _result(None, 40), "deployment", None, "deployment-wide: 40 requests"),
    (None, _result(WIDE, 1700), "deployment", WIDE, "poolSelector: none"),
])
def test_a_pool_with_too_few_requests_falls_back_to_the_deployment(
    own: ProfileResult | None, wide: ProfileResult, scope: str,
    planned_on: WorkloadProfile | None, needle: str,
) -> None:
    choice = choose_for_pool("h200", own, wide)
    assert choice.scope == scope and choice.profile == planned_on
    assert needle in choice.message, choice.message
    assert "the declared workload stays; planned" not in choice.message


# --- the timer, pool by pool ----------------------------------------------------------------

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SPEC: dict[str, Any] = {
    "model": {"name": MODEL},
    "workload": {"profile": "chat", "contextTokens": {"p50": 1000, "p99": 4000, "max": 4096}},
    "pools": [{"gpuClass": "H200", "name": "chat"}, {"gpuClass": "H200", "name": "docs"},
              {"gpuClass": "H100", "name": "quiet"}],
    "tuning": {"prometheus": {"url": "http://prometheus:9090", "window": "1m"},
               "retune": {"minInterval": "0s", "driftThreshold": 0.3, "dwell": "2m"}},
}


class _FakeKube:
    """The two calls the retune timer makes (``Kube.request``): read the object, merge-patch
    its status; on one object in memory."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.patches: list[dict[str, Any]] = []

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        if method == "GET":  # apply.read_inference_deployment
            return json.loads(json.dumps(self.body))
        assert (method, path.rsplit("/", 1)[-1]) == ("PATCH", "status"), (method, path)
        patch = body["status"]
        self.patches.append(patch)
        status = self.body.setdefault("status", {})
        for key, value in patch.items():  # enough of a merge patch for status.profile
            if isinstance(value, dict) and isinstance(status.get(key), dict):
                status[key] = {**status[key], **value}
            else:
                status[key] = value
        return {}


def _body() -> dict[str, Any]:
    """Three pools running plans made for the short traffic: chat and docs on their own
    series, quiet on the deployment-wide profile."""
    spec = InferenceDeploymentSpec.model_validate(SPEC)
    model = plan_stage.resolve_model(spec, "llm", None)
    pools = []
    for pool in spec.pools:
        scope = "deployment" if pool.pool_name == "quiet" else "pool"
        planned_on = SHORT if scope == "pool" else WIDE
        knobs, expected, _ = plan_stage.plan_status(
            plan_stage.plan_one_pool(spec, pool, model, planned_on, plan_stage.policy_for(spec)))
        pools.append(PoolStatus(
            name=pool.pool_name, gpu_class=pool.gpu_class, tensor_parallel=1, replicas=1,
            phase="Applied", plan=knobs, expected=expected, revision=1,
            profile=profile_status(planned_on, window="1m", scope=scope)))
    status = {"pools": [p.model_dump(mode="json", by_alias=True, exclude_none=True)
                        for p in pools],
              "profile": profile_status(WIDE, window="1m").model_dump(
                  mode="json", by_alias=True, exclude_none=True)}
    return {"metadata": {"name": "bot", "namespace": "llm", "generation": 1,
                         "resourceVersion": "1"},
            "spec": SPEC, "status": status}


def _profiler(url: str, settings: ProfilingSettings) -> ProfileResult:
    """docs' traffic turned long; chat's did not; quiet has 12 requests."""
    if "model_name" in settings.selector:
        return _result(WIDE, 1700)
    pod = settings.selector_regex["pod"]
    if re.fullmatch(pod, "bot-docs-6f7d9c8b5-x2x7q"):
        return _result(LONG, 700)
    if re.fullmatch(pod, "bot-chat-6f7d9c8b5-x2x7q"):
        return _result(SHORT, 900)
    return _result(None, 12)


@pytest.mark.slow
def test_each_pool_is_decided_and_planned_on_its_own_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_reconcile(body: Any, **kw: Any) -> Any:
        calls.append(vars(kw["request"]))  # the one typed request
        return rec.ReconcileResult(status=dict(body.get("status") or {}),
                                   status_changed=True,
                                   events=[Event("Normal", "RolloutStarted", "bot-docs r2")])

    monkeypatch.setattr(rec, "reconcile", fake_reconcile)
    body = _body()
    kube = _FakeKube(body)
    first = retune_handlers.retune_once(body, kube=kube, now_seconds=1000.0,  # type: ignore[arg-type]
                                        profiler=_profiler)
    assert first.pool_profiles["chat"].scope == "pool"
    assert first.pool_profiles["docs"].scope == "pool"
    quiet = first.pool_profiles["quiet"]
    assert quiet.scope == "deployment" and quiet.profile == WIDE and quiet.requests == 12
    pools = {p["name"]: p for p in body["status"]["profile"]["retune"]["pools"]}
    assert pools["chat"]["reason"] == retune.BELOW_THRESHOLD
    assert pools["docs"]["reason"] == retune.DWELL_PENDING
    assert pools["quiet"]["reason"] == retune.BELOW_THRESHOLD
    assert "planned on the deployment-wide profile (1700 requests)" in \
        pools["quiet"]["profileMessage"]
    assert pools["docs"]["selector"].startswith('{namespace="llm",pod=~"bot-docs')
    # The tick is named by the pool furthest along.
    assert first.reason == retune.DWELL_PENDING and not calls
    assert body["status"]["profile"]["retune"]["dwellSeconds"] == 120.0

    # The dwell is spec.tuning.retune.dwell (2m), not the 1m window.
    body = {**body, "status": body["status"]}
    at_window = retune_handlers.retune_once(body, kube=kube, now_seconds=1061.0,  # type: ignore[arg-type]
                                            profiler=_profiler)
    assert at_window.reason == retune.DWELL_PENDING and not calls
    replanned = retune_handlers.retune_once(body, kube=kube, now_seconds=1121.0,  # type: ignore[arg-type]
                                            profiler=_profiler)
    assert replanned.reason == retune.PLAN_CHANGED and replanned.rolled_out
    # The reconcile's own Events are posted with the tick's (they were dropped).
    assert [e.reason for e in replanned.events][:2] == ["RolloutStarted", "RetunePlanChanged"]
    assert len(calls) == 1
    call = calls[0]
    # Only docs is re-planned on what it showed; chat and quiet keep what their plans were
    # made for (a pool that did not drift is not re-planned).
    assert call["profiles"]["docs"].context_tokens == LONG.context_tokens
    assert call["profiles"]["chat"].context_tokens == SHORT.context_tokens
    assert call["profiles"]["quiet"].context_tokens == WIDE.context_tokens
    assert call["profile_scopes"] == {"chat": "pool", "docs": "pool", "quiet": "deployment"}
    assert call["profile"].context_tokens == WIDE.context_tokens  # status.profile
    # Kind and multi-turn stay as declared (metrics cannot tell them).
    assert call["profiles"]["docs"].kind == declared_profile(
        InferenceDeploymentSpec.model_validate(SPEC).workload).kind
    pools = {p["name"]: p for p in body["status"]["profile"]["retune"]["pools"]}
    assert pools["docs"]["reason"] == retune.PLAN_CHANGED
    assert "max_model_len" in pools["docs"]["message"]
    assert pools["docs"]["state"]["lastRolloutSeconds"] == 1121.0
    assert pools["chat"]["reason"] == retune.BELOW_THRESHOLD
    assert "lastRolloutSeconds" not in pools["chat"]["state"]


def test_a_status_written_by_the_previous_kvtune_keeps_its_dwell_clock() -> None:
    """The clocks were stored snake_case in an untyped corner; the typed status reads them."""
    declared = declared_profile(InferenceDeploymentSpec.model_validate(SPEC).workload)
    raw = {"profile": {"source": "declared", "retune": {
        "reason": "DwellPending", "state": None,
        "pools": [{"name": "h200", "reason": "DwellPending",
                   "state": {"drift_since_seconds": 9.0, "last_rollout_seconds": 3.0,
                             "candidate": declared.model_dump(mode="json")}}]}}}
    status = status_writer.read({"status": raw})
    state = retune_state.state_from_status(status, "h200", declared)
    assert state.drift_since_seconds == 9.0 and state.last_rollout_seconds == 3.0
    assert state.candidate is not None
    assert state.candidate.context_tokens == declared.context_tokens
    assert retune_state.state_from_status(status, "h100", declared).drift_since_seconds is None


@pytest.mark.slow
def test_a_replan_that_gives_the_running_plan_adopts_the_observed_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool runs exactly the plan its observed traffic calls for, but its basis is
    another profile (here: a prefix hit rate of 0.5 where 0 is seen, drift 0.5). The re-plan
    rolls nothing out, and the observed profile becomes the basis: drift is measured from it
    afterwards, so the pool is not re-planned every dwell time for ever."""
    calls: list[dict[str, Any]] = []

    def fake_reconcile(body: Any, **kw: Any) -> Any:
        calls.append(vars(kw["request"]))  # the one typed request
        return rec.ReconcileResult(status=dict(body.get("status") or {}),
                                   status_changed=True)

    monkeypatch.setattr(rec, "reconcile", fake_reconcile)
    spec_raw = {**SPEC, "pools": [{"gpuClass": "H200", "name": "chat"}]}
    spec = InferenceDeploymentSpec.model_validate(spec_raw)
    model = plan_stage.resolve_model(spec, "llm", None)
    declared = declared_profile(spec.workload)  # what metrics cannot tell stays as declared
    planned = plan_stage.plan_one_pool(spec, spec.pools[0], model,
                                       SHORT.model_copy(update={
                                           "kind": declared.kind,
                                           "multi_turn": declared.multi_turn}),
                                       plan_stage.policy_for(spec))
    knobs, expected, _ = plan_stage.plan_status(planned)
    basis = SHORT.model_copy(update={"prefix_hit_rate": 0.5})
    pool = PoolStatus(name="chat", gpu_class="H200", tensor_parallel=1, replicas=1,
                      phase="Applied", plan=knobs, expected=expected, revision=1,
                      profile=profile_status(basis, window="1m", scope="pool"))
    body: dict[str, Any] = {
        "metadata": {"name": "bot", "namespace": "llm", "generation": 1,
                     "resourceVersion": "1"}, "spec": spec_raw,
        "status": {"pools": [pool.model_dump(mode="json", by_alias=True, exclude_none=True)],
                   "profile": profile_status(basis, window="1m").model_dump(
                       mode="json", by_alias=True, exclude_none=True)}}
    kube = _FakeKube(body)

    def profiler(url: str, settings: ProfilingSettings) -> ProfileResult:
        return _result(SHORT, 900)

    ticks = [retune_handlers.retune_once(body, kube=kube, now_seconds=t,  # type: ignore[arg-type]
                                         profiler=profiler) for t in (1000.0, 1121.0)]
    assert [t.reason for t in ticks] == [retune.DWELL_PENDING, retune.PLAN_UNCHANGED], \
        ticks[1].message
    assert not ticks[1].rolled_out
    assert "the observed profile is now the plan's basis" in ticks[1].message
    # Reconcile is handed the observed profile and the plan made on it: the running knobs.
    assert len(calls) == 1
    assert calls[0]["profiles"]["chat"].prefix_hit_rate == 0.0
    assert calls[0]["plans"]["chat"].plan.model_dump() == knobs.model_dump()
    state = body["status"]["profile"]["retune"]["pools"][0]["state"]
    assert "driftSinceSeconds" not in state
