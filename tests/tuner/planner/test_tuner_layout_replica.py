"""A chosen layout's capacity-search summary is the replica's (planner/layout_replica.py): the
search replays one engine (one DP rank on its share), but the pool scales by replicas of
DP engines, so capacity, replicas and replicas needed are restated per replica, and the cost
is the replica's GPUs (TP x DP) over its capacity; every layout weighed is priced alike."""

from __future__ import annotations

import math

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.prices import GPUPrice
from kvtune.tuner.plan import FrontPoint, PoolPlan, SearchSummary
from kvtune.tuner.planner.capacity import replicas_needed
from kvtune.tuner.planner.cost import priced
from kvtune.tuner.planner.layout_choice import choose_layout
from kvtune.tuner.planner.layout_replica import per_replica_summary
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.presets import preset_profile

OBSERVED = 40.0  # req/s over the pool
POOL_REPLICAS = 2
PRICE = GPUPrice(gpu_class="H200", usd_per_gpu_hour=4.0, source="test")
# One engine's capacity at SLO per TP degree: a DP8 engine serves less, but 8 of them more.
ENGINE_CAPACITY = {8: 6.0, 4: 4.0, 2: 2.5, 1: 1.5}


def _engine_summary(engines: int, capacity: float) -> SearchSummary:
    """A search summary as goodput_search writes it for one engine of ``engines``."""
    share = OBSERVED / engines
    return SearchSummary(
        observed_rate_per_second=OBSERVED, replicas=engines, rate_per_replica_per_second=share,
        littles_law_sequences=10, capacity_requests_per_second=capacity, slo_attainment=0.99,
        ttft_p95_seconds=0.5, tpot_p95_seconds=0.02, slo_met=True, slo_set=True,
        replicas_needed=replicas_needed(engines, capacity / share), candidates=3,
        simulated_requests=100, requests_per_candidate=50, changed_from="rules' plan",
        output_tokens_per_second=100.0,
        front=(FrontPoint(vllm_args=("--x",), chosen=True, on_front=True,
                          capacity_requests_per_second=capacity, slo_attainment=0.99,
                          output_tokens_per_second=100.0, ttft_p95_seconds=0.5,
                          tpot_p95_seconds=0.02, latency_vs_slo=0.8),))


def _searched(req: PlanRequest) -> PoolPlan:
    # The rules' plan with the search's summary of one engine on its share (as the CLI and
    # the operator call the search: replicas x DP engines).
    pool = plan_pool(req)
    summary = _engine_summary(POOL_REPLICAS * req.data_parallel,
                              ENGINE_CAPACITY[req.tensor_parallel])
    return pool.model_copy(update={"search": summary})


@pytest.fixture(scope="module")
def chosen() -> PoolPlan:
    request = PlanRequest(model=get_model("deepseek-ai/DeepSeek-V3"), gpu=get_gpu_class("H200"),
                          profile=preset_profile("chat"))
    return priced(choose_layout(request, 8, _searched), PRICE)


def test_the_summary_of_a_dp_layout_counts_replicas_not_engines(chosen: PoolPlan) -> None:
    assert chosen.layout is not None and chosen.layout.label == "DP8+EP"  # 8 x 1.5 > 6.0
    s = chosen.search
    assert s is not None
    assert s.replicas == POOL_REPLICAS  # not 16 engines
    assert s.capacity_requests_per_second == pytest.approx(8 * 1.5)
    assert s.rate_per_replica_per_second == pytest.approx(OBSERVED / POOL_REPLICAS)
    assert s.replicas_needed == math.ceil(OBSERVED / 12.0) == 4  # engines needed: 27
    assert s.front[0].capacity_requests_per_second == pytest.approx(12.0)
    assert s.output_tokens_per_second == pytest.approx(800.0)
    assert chosen.expected.capacity_requests_per_second == pytest.approx(12.0)
    assert chosen.expected.replicas_needed == 4
    # The layout's score (the replica's capacity) is the summary's.
    best = next(o for o in chosen.layouts_considered if o.chosen)
    assert best.score == pytest.approx(s.capacity_requests_per_second)


def test_the_cost_is_the_replicas_gpus_over_its_capacity(chosen: PoolPlan) -> None:
    s = chosen.search
    assert s is not None and s.cost is not None
    assert s.cost.gpus_per_replica == 8 and s.cost.usd_per_replica_hour == pytest.approx(32.0)
    per_m = 32.0 * 1e6 / 3600 / 12.0
    assert s.cost.cost_per_million_good_requests_usd == pytest.approx(per_m)
    assert s.front[0].cost_per_million_good_requests_usd == pytest.approx(per_m)
    costs = {o.layout.label: o.cost_per_million_good_requests_usd
             for o in chosen.layouts_considered}
    # TP8 serves 6 req/s on the same 8 GPUs: twice DP8+EP's cost per good request.
    assert costs["TP8"] == pytest.approx(32.0 * 1e6 / 3600 / 6.0)
    assert costs["DP8+EP"] == pytest.approx(per_m)
    assert all(o.usd_per_replica_hour == pytest.approx(32.0) for o in chosen.layouts_considered)


def test_at_dp1_the_engine_is_the_replica() -> None:
    s = _engine_summary(2, 5.0)
    assert per_replica_summary(s, 1) == s
