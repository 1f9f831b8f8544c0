"""The operator plans a pool with the capacity search (the same ``plan_by_goodput`` as
``kvtune plan``) when Prometheus gave a profile with an arrival rate; status carries the
capacity at SLO and attainment, and an SLO no configuration meets is said with numbers."""

from __future__ import annotations

import copy

import pytest
from op_samples import SAMPLE_SPEC

from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.rollout import plan as rec
from kvtune.tuner.planner.policy import SLO
from kvtune.tuner.planner.presets import preset_profile


def _spec() -> InferenceDeploymentSpec:
    body = copy.deepcopy(SAMPLE_SPEC)
    body["pools"] = [{"gpuClass": "H200", "replicas": 1}]
    return InferenceDeploymentSpec.model_validate(body)


@pytest.mark.slow
def test_an_observed_profile_is_planned_by_goodput_and_status_shows_the_prediction() -> None:
    spec = _spec()
    (pool,) = spec.pools
    model = rec.resolve_model(spec, "llm", None)
    policy = rec.policy_for(spec)
    declared = preset_profile("chat").model_copy(update={"request_rate_per_second": 2.0})
    observed = declared.model_copy(update={"source": "prometheus"})
    by_rules = rec.plan_one_pool(spec, pool, model, declared, policy)
    assert by_rules.search is None  # a declared profile is planned by the rules
    searched = rec.plan_one_pool(spec, pool, model, observed, policy, running=by_rules.plan)
    assert searched.search is not None and searched.search.changed_from == "running plan"
    _, expected, _ = rec.plan_status(searched)
    assert expected.capacity_requests_per_second == (
        searched.search.capacity_requests_per_second)
    assert expected.slo_attainment is not None and 0.0 <= expected.slo_attainment <= 1.0
    assert rec.slo_at_risk(searched) is None or not searched.search.slo_met


@pytest.mark.slow
def test_an_slo_no_configuration_meets_is_at_risk_with_numbers() -> None:
    spec = _spec()
    (pool,) = spec.pools
    model = rec.resolve_model(spec, "llm", None)
    policy = rec.policy_for(spec).model_copy(update={
        "slo": SLO(ttft_p95_seconds=0.05, tpot_p95_seconds=0.03)})
    observed = preset_profile("rag").model_copy(update={
        "source": "prometheus", "request_rate_per_second": 5.0})
    plan = rec.plan_one_pool(spec, pool, model, observed, policy)
    message = rec.slo_at_risk(plan)
    assert message is not None and message.startswith("SLO at risk")
    assert "req/s" in message and "%" in message


@pytest.mark.slow
def test_status_carries_the_chosen_cost_at_the_pools_own_price_or_the_charts() -> None:
    from kvtune.operator.search import gpu_prices

    body = copy.deepcopy(SAMPLE_SPEC)
    body["pools"] = [{"gpuClass": "H200", "replicas": 1, "gpuPriceUsdPerHour": 2.0},
                     {"gpuClass": "H100", "replicas": 1}, {"gpuClass": "H200-NVL", "replicas": 1}]
    spec = InferenceDeploymentSpec.model_validate(body)
    model = rec.resolve_model(spec, "llm", None)
    policy = rec.policy_for(spec)
    observed = preset_profile("chat").model_copy(update={
        "source": "prometheus", "request_rate_per_second": 2.0})
    h200, h100, nvl = spec.pools
    gpu_prices.CONFIG.overrides = {"h200": 9.0, "H100": 1.5}
    try:
        own = gpu_prices.cost_status(rec.plan_one_pool(spec, h200, model, observed, policy,
                                                       pool_field="spec.pools[0]"))
        chart = gpu_prices.cost_status(rec.plan_one_pool(spec, h100, model, observed, policy,
                                                         pool_field="spec.pools[1]"))
    finally:
        gpu_prices.CONFIG.overrides = {}
    assert own is not None and own.usd_per_gpu_hour == 2.0
    assert own.price_source == "spec.pools[0].gpuPriceUsdPerHour"
    assert chart is not None and chart.usd_per_gpu_hour == 1.5
    assert chart.price_source == "chart gpuPrices H100=1.5"
    assert own.cost_per_million_output_tokens_usd and own.cost_per_million_good_requests_usd
    # Camel-cased in status, as the CRD declares it.
    assert "costPerMillionOutputTokensUsd" in own.model_dump(by_alias=True)
    # Without the chart's price: the list price; a class without one shows no cost.
    listed = gpu_prices.cost_status(rec.plan_one_pool(spec, h100, model, observed, policy))
    assert listed is not None and listed.usd_per_gpu_hour == 3.0
    assert gpu_prices.cost_status(rec.plan_one_pool(spec, nvl, model, observed, policy)) is None


@pytest.mark.slow
def test_a_declared_rate_is_searched_and_shared_by_the_replicas() -> None:
    from kvtune.operator.api.workloads import declared_profile

    body = copy.deepcopy(SAMPLE_SPEC)
    body["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    body["workload"] = {"profile": "rag", "requestRatePerSecond": 30}
    body["slo"] = {"ttftP95": "1s", "tpotP95": "30ms"}
    spec = InferenceDeploymentSpec.model_validate(body)
    (pool,) = spec.pools
    model = rec.resolve_model(spec, "llm", None)
    declared = declared_profile(spec.workload)
    assert declared.source == "declared" and declared.request_rate_per_second == 30
    one = rec.plan_one_pool(spec, pool, model, declared, rec.policy_for(spec))
    assert one.search is not None and not one.search.slo_met
    needed = one.search.replicas_needed
    assert needed is not None and needed >= 2
    assert rec.slo_at_risk(one) is not None
    # Followed, replicas_needed reaches a count whose plan meets the SLO. Not always in one
    # step: the search at the new share may pick another plan, whose capacity the 6-step
    # bisection of the first plan did not measure (at 30 req/s of RAG: 3, then 4). Issue 22
    # item 1 (capacity per replica as the objective) is what makes it one step, within 2 %.
    replicas, enough = needed, one
    for _ in range(3):
        more = spec.model_copy(update={"pools": [pool.model_copy(update={"replicas": replicas})]})
        enough = rec.plan_one_pool(more, more.pools[0], model, declared, rec.policy_for(more))
        assert enough.search is not None and enough.search.replicas == replicas
        if enough.search.slo_met:
            break
        assert enough.search.replicas_needed is not None
        assert enough.search.replicas_needed > replicas  # it moves on, never back
        replicas = enough.search.replicas_needed
    assert enough.search is not None and enough.search.slo_met, enough.search
    assert rec.slo_at_risk(enough) is None and replicas <= needed + 2
