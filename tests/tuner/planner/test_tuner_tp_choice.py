"""``tensorParallel: auto`` (planner/tp_choice.py): the degree and replicas chosen for the
lowest cost per good request, from each degree's capacity per replica.

The choice is tested on the real plans of each degree (weights, KV, vLLM's head rules) with
the search's summary replaced by a stated capacity per degree, so each case says exactly what
decides; ``test_the_real_search_wires_through`` runs the goodput search itself."""

from __future__ import annotations

import math

import pytest

from kvtune.tuner.errors import NoFeasiblePlan
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.prices import GPUPrice
from kvtune.tuner.plan import FrontPoint, PoolPlan, SearchSummary
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.tp_choice import (
    TENSOR_PARALLEL,
    capacity_per_replica,
    choose_tensor_parallel,
)

LLAMA_8B = get_model("meta-llama/Llama-3.1-8B-Instruct")
LLAMA_70B = get_model("meta-llama/Llama-3.3-70B-Instruct")
H100 = get_gpu_class("H100")
PRICE = GPUPrice(gpu_class="H100", usd_per_gpu_hour=3.0, source="test")


def _request(model: object = LLAMA_8B, rate: float | None = None) -> PlanRequest:
    profile = preset_profile("chat")
    if rate is not None:
        profile = profile.model_copy(update={"request_rate_per_second": rate})
    return PlanRequest(model=model, gpu=H100, profile=profile)  # type: ignore[arg-type]


def _summary(rate: float, replicas: int, capacity: float, latency_vs_slo: float = 0.5
             ) -> SearchSummary:
    """What the search says of one replica with ``capacity`` req/s at its share of ``rate``:
    the SLO met when the share is within capacity."""
    share = rate / replicas
    met = share <= capacity
    point = FrontPoint(vllm_args=("--max-num-seqs=64",), chosen=True, on_front=True,
                       capacity_requests_per_second=capacity,
                       slo_attainment=0.97 if met else 0.5, output_tokens_per_second=100.0,
                       ttft_p95_seconds=0.2, tpot_p95_seconds=0.02,
                       latency_vs_slo=latency_vs_slo)
    return SearchSummary(
        observed_rate_per_second=rate, replicas=replicas, rate_per_replica_per_second=share,
        littles_law_sequences=8, capacity_requests_per_second=capacity,
        slo_attainment=0.97 if met else 0.5, ttft_p95_seconds=0.2, tpot_p95_seconds=0.02,
        slo_met=met, slo_set=True,
        replicas_needed=math.ceil(rate / capacity),
        candidates=1, simulated_requests=100, requests_per_candidate=100,
        changed_from="rules' plan", front=(point,))


class StatedCapacity:
    """A plan function: each degree's real rules plan, with the search's summary for a
    stated capacity per replica; remembers (TP, replicas) of every call."""

    def __init__(self, capacity_by_tp: dict[int, float],
                 latency_by_tp: dict[int, float] | None = None) -> None:
        self.capacity_by_tp = capacity_by_tp
        self.latency_by_tp = latency_by_tp or {}
        self.calls: list[tuple[int, int]] = []

    def __call__(self, request: PlanRequest, replicas: int) -> PoolPlan:
        self.calls.append((request.tensor_parallel, replicas))
        pool = plan_pool(request)
        rate = request.profile.request_rate_per_second
        assert rate is not None
        return pool.model_copy(update={"search": _summary(
            rate, replicas, self.capacity_by_tp[request.tensor_parallel],
            self.latency_by_tp.get(request.tensor_parallel, 0.5))})


def test_70b_on_h100_never_chooses_tp1_whose_weights_do_not_fit() -> None:
    for plan_fn, rate in ((lambda r, n: plan_pool(r), None),
                          (StatedCapacity({2: 1.0, 4: 6.0, 8: 14.0}), 5.0)):
        pool = choose_tensor_parallel(_request(LLAMA_70B, rate), plan_fn, price=PRICE)
        c = pool.tp_choice
        assert c is not None and pool.tensor_parallel != 1
        tp1 = c.options[0]
        assert tp1.tensor_parallel == 1 and not tp1.chosen
        assert tp1.refused is not None and tp1.refused.startswith("does not fit")
        assert pool.reasons[0].knob == TENSOR_PARALLEL
        assert "TP1: does not fit" in pool.reasons[0].message


def test_8b_at_a_low_rate_takes_tp1_with_more_replicas_when_cheaper() -> None:
    # 7 req/s: TP1 needs 2 replicas (2 GPUs), TP2 one (2 GPUs): the same GPUs, and TP1
    # serves more per GPU (5 vs 4 req/s), so a million good requests cost less on it.
    plan_fn = StatedCapacity({1: 5.0, 2: 8.0, 4: 14.0, 8: 20.0})
    pool = choose_tensor_parallel(_request(rate=7.0), plan_fn, price=PRICE)
    c = pool.tp_choice
    assert c is not None and c.by == "capacity"
    assert (pool.tensor_parallel, c.replicas) == (1, 2)
    by_tp = {o.tensor_parallel: o for o in c.options}
    assert (by_tp[1].replicas_needed, by_tp[2].replicas_needed) == (2, 1)
    assert by_tp[1].gpus_needed == by_tp[2].gpus_needed == 2
    assert (by_tp[1].cost_per_million_good_requests_usd
            < by_tp[2].cost_per_million_good_requests_usd)
    # The chosen degree is planned again on its share (7 / 2 req/s), as each replica runs.
    assert plan_fn.calls[-1] == (1, 2)
    assert pool.search is not None and pool.search.replicas == 2
    assert "vllm serve" not in pool.reasons[0].message
    assert pool.vllm_args()[0] == "--tensor-parallel-size=1"


@pytest.mark.parametrize(("rate", "tp", "replicas"), [
    (4.0, 1, 1),    # one TP1 replica serves it: 1 GPU
    (11.0, 2, 1),   # TP1 needs 3 GPUs, one TP2 replica 2
    (20.0, 2, 2),   # 4 GPUs either way (TP1 x 4, TP2 x 2, TP4 x 1): TP2 serves most per GPU
    (70.0, 8, 1),   # TP8's 80 req/s: 8 GPUs, against 10 of TP2 and 12 of TP4
])
def test_the_choice_follows_the_rate(rate: float, tp: int, replicas: int) -> None:
    plan_fn = StatedCapacity({1: 5.0, 2: 12.0, 4: 22.0, 8: 80.0})
    pool = choose_tensor_parallel(_request(rate=rate), plan_fn, price=PRICE)
    assert pool.tp_choice is not None
    assert (pool.tensor_parallel, pool.tp_choice.replicas) == (tp, replicas)


def test_cost_figures_follow_the_formula() -> None:
    pool = choose_tensor_parallel(_request(rate=11.0),
                                  StatedCapacity({1: 5.0, 2: 12.0, 4: 22.0, 8: 80.0}),
                                  price=PRICE)
    c = pool.tp_choice
    assert c is not None and c.usd_per_gpu_hour == 3.0
    for o in c.options:
        assert o.replicas_needed == math.ceil(11.0 / o.capacity_per_replica)
        assert o.gpus_needed == o.replicas_needed * o.tensor_parallel
        assert o.usd_per_replica_hour == pytest.approx(3.0 * o.tensor_parallel)
        # GPUs per replica x price / (capacity x 3600) x 10^6
        assert o.cost_per_million_good_requests_usd == pytest.approx(
            o.tensor_parallel * 3.0 / (o.capacity_per_replica * 3600) * 1e6)
        assert o.cost_per_million_requests_at_rate_usd == pytest.approx(
            o.gpus_needed * 3.0 / (11.0 * 3600) * 1e6)
    cheapest = min(c.options, key=lambda o: o.cost_per_million_requests_at_rate_usd or 1e99)
    assert cheapest.chosen
    # The chosen plan's own cost is its TP's GPUs.
    assert pool.search is not None and pool.search.cost is not None
    assert pool.search.cost.gpus_per_replica == pool.tensor_parallel == 2


def test_the_replica_bound_is_respected() -> None:
    caps = {1: 5.0, 2: 12.0, 4: 22.0, 8: 50.0}
    free = choose_tensor_parallel(_request(rate=20.0), StatedCapacity(caps))
    assert free.tp_choice is not None
    assert (free.tensor_parallel, free.tp_choice.replicas) == (2, 2)
    # One replica at most: only TP4 and TP8 serve 20 req/s; TP4 on fewer GPUs.
    bound = choose_tensor_parallel(_request(rate=20.0), StatedCapacity(caps), max_replicas=1)
    assert bound.tp_choice is not None
    assert (bound.tensor_parallel, bound.tp_choice.replicas) == (4, 1)
    # No degree serves 200 req/s within 2 replicas: the bound's replicas of the degree that
    # serves most per GPU, and the reason says they fall short.
    short = choose_tensor_parallel(_request(rate=200.0), StatedCapacity(caps), max_replicas=2)
    assert short.tp_choice is not None
    assert (short.tensor_parallel, short.tp_choice.replicas) == (8, 2)
    assert "fall short of the rate" in short.reasons[0].message


def test_reason_names_every_degree_with_capacity_replicas_and_cost() -> None:
    pool = choose_tensor_parallel(_request(rate=7.0),
                                  StatedCapacity({1: 5.0, 2: 8.0, 4: 14.0, 8: 20.0}),
                                  price=PRICE)
    message = pool.reasons[0].message
    assert message.startswith("TP1: 5.00 req/s per replica, 2 replica(s) = 2 GPUs")
    # Each degree at its own capacity at SLO, whether or not it meets the SLO at the rate.
    for part in ("TP2: 8.00 req/s per replica, 1 replica(s) = 2 GPUs",
                 "TP4: 14.00 req/s per replica, 1 replica(s) = 4 GPUs",
                 "TP8: 20.00 req/s per replica", "/M good requests at capacity",
                 "also weighed"):
        assert part in message


def test_the_front_spans_the_degrees_on_cost_against_latency() -> None:
    # Latency against the SLO falls with TP, except TP4's (worse than TP2's): TP4 costs more
    # per good request than TP2 and is slower, so it is off the front.
    pool = choose_tensor_parallel(
        _request(rate=7.0), StatedCapacity({1: 5.0, 2: 8.0, 4: 14.0, 8: 20.0},
                                           {1: 0.8, 2: 0.5, 4: 0.6, 8: 0.3}), price=PRICE)
    front = pool.tp_choice.front if pool.tp_choice is not None else ()
    assert [p.tensor_parallel for p in front] == [1, 2, 8]
    assert [p.chosen for p in front].count(True) == 1 and front[0].chosen
    costs = [p.cost_per_million_good_requests_usd for p in front]
    assert all(c is not None for c in costs) and costs == sorted(costs)  # type: ignore[type-var]
    lat = [p.latency_vs_slo for p in front]
    assert lat == sorted(lat, reverse=True)


def test_without_a_rate_fewest_gpus_per_sequence_decides() -> None:
    pool = choose_tensor_parallel(_request(LLAMA_70B), lambda r, n: plan_pool(r))
    c = pool.tp_choice
    assert c is not None and c.by == "sequences" and c.replicas is None
    fitting = [o for o in c.options if o.refused is None]
    best = min(fitting, key=lambda o: o.tensor_parallel / o.capacity_per_replica)
    assert best.chosen and pool.tensor_parallel == best.tensor_parallel
    assert "no arrival rate" in pool.reasons[0].message


def test_degrees_vllm_refuses_are_ruled_out_naming_the_heads() -> None:
    # phi-4: 40 attention heads, 10 KV heads: TP4 and TP8 split neither evenly.
    pool = choose_tensor_parallel(_request(get_model("microsoft/phi-4")),
                                  lambda r, n: plan_pool(r))
    assert pool.tp_choice is not None
    refused = {o.tensor_parallel: o.refused for o in pool.tp_choice.options}
    assert refused[1] is None and refused[2] is None
    assert refused[4] is not None and "40 attention heads / 10 KV heads" in refused[4]
    assert refused[8] is not None and pool.tensor_parallel in (1, 2)


def test_nothing_fits_names_every_degree() -> None:
    with pytest.raises(NoFeasiblePlan) as exc:
        choose_tensor_parallel(_request(get_model("meta-llama/Llama-3.1-405B-Instruct")),
                               lambda r, n: plan_pool(r), allowed=(1, 2))
    assert "TP1: does not fit" in str(exc.value) and "TP2: does not fit" in str(exc.value)


def test_capacity_per_replica_is_the_searchs_capacity_at_slo() -> None:
    # Met at its share or not, the figure is the capacity the search measured.
    assert capacity_per_replica(_summary(4.0, 1, 10.0)) == 10.0
    assert capacity_per_replica(_summary(40.0, 2, 10.0)) == 10.0


@pytest.mark.slow
def test_the_real_search_wires_through() -> None:
    """The capacity search itself on two degrees (a short stream): figures from its summary."""
    from kvtune.tuner.planner.search import SearchSettings
    from kvtune.tuner.simulator.goodput_search import plan_by_goodput

    settings = SearchSettings(rungs=(24, 48), alternatives=1)
    pool = choose_tensor_parallel(
        _request(rate=2.0), lambda r, n: plan_by_goodput(r, replicas=n, settings=settings),
        price=PRICE, allowed=(1, 2))
    c = pool.tp_choice
    assert c is not None and c.by == "capacity" and pool.search is not None
    chosen = next(o for o in c.options if o.chosen)
    assert chosen.capacity_per_replica > 0 and chosen.replicas_needed is not None
    assert pool.tensor_parallel == chosen.tensor_parallel
    assert {p.tensor_parallel for p in c.front} <= {1, 2} and c.front
