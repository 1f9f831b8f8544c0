"""issue 27 in status: the capacity search's reuse summary (hit rate per tier, the CPU tier
chosen and why, what reuse saves, the tier's cost at the chart's host-memory price), and the
observed per-tier shares beside the prediction (the retune timer's)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from op_samples import SAMPLE_SPEC
from test_op_status_round_trip import through_api

from kvtune.operator import api
from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.prometheus.profiling import ProfilingSettings, RawWindow, build_profile
from kvtune.operator.retune import reuse_observed
from kvtune.operator.rollout import plan as rec
from kvtune.operator.search import reuse_summary
from kvtune.tuner.planner.presets import preset_profile


def _window(prompt_by_source: dict[str, float], cached_by_source: dict[str, float]
            ) -> RawWindow:
    n = 300
    prompt = np.full(n, 1000.0)
    bounds = [100.0, 1000.0, 10000.0, float("inf")]

    def cum(values: np.ndarray) -> list[tuple[float, float]]:
        return [(b, float((values <= b).sum())) for b in bounds]

    return RawWindow(
        window_seconds=60, at_unix_seconds=0.0, requests=n, prompt_buckets=cum(prompt),
        output_buckets=cum(np.full(n, 100.0)), ttft_buckets=[], tpot_buckets=[],
        prefix_cache_queries=1000.0 * n, prefix_cache_hits=400.0 * n,
        kv_cache_usage_mean=0.5, kv_cache_usage_max=0.9, preemptions=0.0, waiting_mean=0.0,
        prompt_tokens_by_source=prompt_by_source, prompt_tokens_cached_by_source=cached_by_source,
    )


@pytest.mark.slow
def test_a_searched_plan_with_a_cpu_budget_shows_its_reuse_priced_in_status() -> None:
    body = copy.deepcopy(SAMPLE_SPEC)
    body["pools"] = [{"gpuClass": "H100", "replicas": 2}]
    body["tuning"] = {**body.get("tuning", {}), "cpuOffloadGiB": 64}
    spec = InferenceDeploymentSpec.model_validate(body)
    model = rec.resolve_model(spec, "llm", None)
    observed = preset_profile("multi-tenant").model_copy(update={
        "source": "prometheus", "request_rate_per_second": 4.0})
    pool_plan = rec.plan_one_pool(spec, spec.pools[0], model, observed, rec.policy_for(spec))
    assert pool_plan.search is not None and pool_plan.search.reuse is not None
    r = pool_plan.search.reuse
    unpriced = reuse_summary.reuse_status(pool_plan)
    assert unpriced is not None
    assert (unpriced.gpu_prefix_hit_rate, unpriced.cpu_prefix_hit_rate) == (
        r.gpu_prefix_hit_rate, r.cpu_prefix_hit_rate)
    assert unpriced.gpu_prefix_hit_rate > 0  # a shared system prompt is reused
    # The GPU's list price prices the saving.
    assert unpriced.usd_saved_per_day is not None and unpriced.usd_saved_per_day > 0
    # Off and the budget were weighed; the reason says which pays and why.
    assert [t.size_gib for t in unpriced.tier_sizes] == [0.0, 64.0]
    assert sum(t.chosen for t in unpriced.tier_sizes) == 1
    assert "Sizes weighed" in unpriced.tier_reason
    chosen = next(t.size_gib for t in unpriced.tier_sizes if t.chosen)
    assert unpriced.cpu_tier_gib_per_replica == chosen
    # The chart's host price prices a tier (this traffic chose none, so one is put in
    # place here: the pricing is what is checked) and nothing without it.
    tiered = pool_plan.model_copy(update={"search": pool_plan.search.model_copy(update={
        "reuse": r.model_copy(update={"cpu_tier_gib_per_replica": 64.0})})})
    assert (reuse_summary.reuse_status(reuse_summary.with_host_price(tiered))
            or unpriced).cpu_tier_usd_per_day is None
    reuse_summary.CONFIG.usd_per_gib_hour = 0.004
    try:
        status = reuse_summary.reuse_status(reuse_summary.with_host_price(tiered))
    finally:
        reuse_summary.CONFIG.usd_per_gib_hour = None
    assert status is not None
    replicas = pool_plan.search.replicas_needed or pool_plan.search.replicas
    assert status.cpu_tier_usd_per_day == pytest.approx(64.0 * replicas * 24 * 0.004, rel=1e-3)
    assert status.cpu_tier_price_source is not None
    assert "hostMemoryPriceUsdPerGiBHour 0.004" in status.cpu_tier_price_source
    # Through the API server and back, camelCase as the CRD declares.
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert "cpuTierGiBPerReplica" in dumped and "sizeGiB" in dumped["tierSizes"][0]
    assert api.ReuseStatus.model_validate(through_api(dumped)) == status


def test_observed_shares_sit_beside_the_prediction_per_pool() -> None:
    settings = ProfilingSettings(window_seconds=60, min_requests=100)
    wide = build_profile(_window(
        {"local_compute": 500.0, "local_cache_hit": 300.0, "external_kv_transfer": 200.0},
        {"device": 300.0, "host": 200.0}), settings)
    rates = wide.observed.tier_hit_rates
    assert rates is not None and (rates.device, rates.host) == (0.3, 0.2)
    prev = api.PoolStatus(name="a", gpu_class="H100", tensor_parallel=1, replicas=1,
                          phase="Applied", reuse=api.ReuseStatus(
                              gpu_prefix_hit_rate=0.25, cpu_prefix_hit_rate=0.15,
                              cached_prompt_tokens_per_day=1e9,
                              prefill_gpu_seconds_saved_per_day=100.0))
    one = reuse_observed.observed_reuse(["a"], [prev], {}, wide, "2026-12-02T00:00:00Z")
    seen = one["a"]
    assert seen.scope == "deployment" and seen.observed.host == 0.2
    assert (seen.predicted_gpu_prefix_hit_rate, seen.predicted_cpu_prefix_hit_rate) == (
        0.25, 0.15)
    assert api.ObservedReuseStatus.model_validate(through_api(
        seen.model_dump(mode="json", by_alias=True, exclude_none=True))) == seen
    # Two pools without their own series: another pool's tokens are not counted as theirs.
    assert reuse_observed.observed_reuse(["a", "b"], [prev], {}, wide, "t") == {}
    # A pool's own series wins, and one without by-source counts shows nothing.
    own = {"b": wide}
    assert reuse_observed.observed_reuse(["a", "b"], [prev], own, wide, "t")["b"].scope == "pool"
    empty = build_profile(_window({}, {}), settings)
    assert empty.observed.tier_hit_rates is None
    assert reuse_observed.observed_reuse(["a"], [prev], {}, empty, "t") == {}
    # The deployment-wide window in status.profile.observed carries the shares too.
    from kvtune.operator.retune import retune_state

    shown = retune_state.observed_status(wide.observed).tier_hit_rates
    assert shown is not None and shown.device == 0.3 and shown.prompt_tokens == 1000
