"""Cost of the searched configurations (tuner/planner/cost.py, the search's Pareto front):
the front is non-dominated over every configuration scored on the full stream, the cost
figures are the price over what the simulator says one replica serves (a good request: over
its capacity at SLO), and GPU prices reorder GPU classes exactly when the price ratio crosses
the capacity ratio."""

from __future__ import annotations

import hashlib

import pytest

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.prices import default_prices, parse_overrides, price_for
from kvtune.tuner.plan import FrontPoint, KVPlan, PoolPlan
from kvtune.tuner.planner.cost import priced, rank_by_cost
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.search import GoodputScore, SearchSettings, search
from kvtune.tuner.simulator.goodput_search import plan_by_goodput

QUICK = SearchSettings(rungs=(30, 80), batched_tokens=(2048, 8192))
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _request(gpu: str, kind: str = "chat", rate: float = 8.0, ttft: float = 1.0,
             tpot: float = 0.05) -> PlanRequest:
    profile = preset_profile(kind).model_copy(update={"request_rate_per_second": rate})
    return PlanRequest(model=get_model(MODEL), gpu=get_gpu_class(gpu), profile=profile,
                       policy=PlanPolicy(slo=SLO(ttft_p95_seconds=ttft, tpot_p95_seconds=tpot)))


class ScrambledScorer:
    """Scores from a hash of the plan: figures that disagree with each other on purpose
    (high capacity with low throughput, and so on), so the front has several points and
    dominated ones to leave out. A plan meets the SLO up to ``capacity_scale`` times the
    observed rate, and misses it above. Records every score taken at the observed rate."""

    rate_per_second = 10.0
    max_requests = 80

    def __init__(self) -> None:
        self.taken: dict[tuple[KVPlan, int], GoodputScore] = {}

    def score(self, request: PlanRequest, plan: KVPlan, num_requests: int,
              rate_scale: float = 1.0) -> GoodputScore:
        h = hashlib.sha256(plan.model_dump_json().encode()).digest()
        # Coarse values, so that equal figures (duplicates) happen too.
        t, ttft, tpot = (100 + 50 * (h[1] % 5), 0.2 * (1 + h[2] % 5), 0.01 * (1 + h[3] % 5))
        meets = rate_scale <= self.capacity_scale(plan)
        s = GoodputScore(slo_attainment=1.0 if meets else 0.5, keeps_up=True,
                         throughput_requests_per_second=10.0, ttft_p95_seconds=ttft,
                         tpot_p95_seconds=tpot, requests=num_requests,
                         output_tokens_per_second=float(t))
        if rate_scale == 1.0:
            self.taken[(plan, num_requests)] = s
        return s

    @staticmethod
    def capacity_scale(plan: KVPlan) -> float:
        return (1 + hashlib.sha256(plan.model_dump_json().encode()).digest()[0] % 6) / 2


def _dominates(a: FrontPoint, b: FrontPoint) -> bool:
    ge = (a.capacity_requests_per_second >= b.capacity_requests_per_second
          and a.output_tokens_per_second >= b.output_tokens_per_second
          and a.latency_vs_slo <= b.latency_vs_slo)
    return ge and (a.capacity_requests_per_second > b.capacity_requests_per_second
                   or a.output_tokens_per_second > b.output_tokens_per_second
                   or a.latency_vs_slo < b.latency_vs_slo)


def test_the_front_is_non_dominated_and_its_capacities_are_what_the_ladder_saw() -> None:
    request = _request("H100")
    scorer = ScrambledScorer()
    settings = SearchSettings(rungs=(30, 80))
    pool = search(request, scorer, settings=settings)
    s = pool.search
    assert s is not None
    final = {tuple(p.vllm_args()): (p, sc) for (p, n), sc in scorer.taken.items() if n == 80}
    # The knockout scores at the observed rate, on the full stream, only the finalists
    # within the tie band of the best (a loser is out after one replay at the band's edge).
    assert len(final) >= 2
    # The chosen capacity is the best true capacity among the finalists, to the tolerance;
    # every other point's is a lower bound of its own.
    best = max(ScrambledScorer.capacity_scale(p) for p, _ in final.values()) * 10.0
    assert best / (1 + settings.capacity_tolerance) <= s.capacity_requests_per_second <= best
    front = [p for p in s.front if p.on_front]
    for p in s.front:
        plan, sc = final[p.vllm_args]  # scored on the full stream
        assert p.capacity_requests_per_second <= ScrambledScorer.capacity_scale(plan) * 10.0
        assert (p.output_tokens_per_second, p.ttft_p95_seconds, p.tpot_p95_seconds) == (
            sc.output_tokens_per_second, sc.ttft_p95_seconds, sc.tpot_p95_seconds)
    # No front point dominates another, and none has the same figures as another.
    assert not any(_dominates(a, b) for a in front for b in front)
    assert len({(p.capacity_requests_per_second, p.output_tokens_per_second,
                 p.latency_vs_slo) for p in front}) == len(front)
    assert [p.capacity_requests_per_second for p in s.front] == sorted(
        (p.capacity_requests_per_second for p in s.front), reverse=True)
    # The chosen configuration is always listed, flagged when a tie rule kept a dominated one.
    chosen = [p for p in s.front if p.chosen]
    assert len(chosen) == 1 and chosen[0].vllm_args == tuple(pool.plan.vllm_args())
    assert chosen[0].on_front == (not any(_dominates(o, chosen[0]) for o in front))
    assert chosen[0].capacity_requests_per_second == s.capacity_requests_per_second


def test_cost_is_the_price_over_what_one_replica_serves() -> None:
    pool = plan_by_goodput(_request("H100"), settings=QUICK)
    price = price_for("H100", {"H100": 2.0})
    assert price is not None and price.source == "--gpu-price H100=2"
    costed = priced(pool, price)
    s = costed.search
    assert s is not None and s.cost is not None and s.front
    assert s.output_tokens_per_second > 0
    assert s.cost.usd_per_replica_hour == 2.0  # TP 1
    assert s.cost.cost_per_million_output_tokens_usd == pytest.approx(
        2.0 / (s.output_tokens_per_second * 3600) * 1e6)
    assert s.capacity_requests_per_second > 0
    assert s.cost.cost_per_million_good_requests_usd == pytest.approx(
        2.0 / (s.capacity_requests_per_second * 3600) * 1e6)
    for p in s.front:
        assert p.cost_per_million_output_tokens_usd == pytest.approx(
            2.0 / (p.output_tokens_per_second * 3600) * 1e6)
    # No price, no figures (never a guess); the plan itself is the same either way.
    assert priced(pool, None) is pool
    assert costed.plan == pool.plan


def _pair() -> tuple[PoolPlan, PoolPlan]:
    # The same traffic, planned on two GPU classes.
    return (plan_by_goodput(_request("H100", rate=10.0), settings=QUICK),
            plan_by_goodput(_request("H200", rate=10.0), settings=QUICK))


@pytest.mark.slow
def test_prices_reorder_gpu_classes_when_the_price_ratio_crosses_the_capacity_ratio() -> None:
    h100, h200 = _pair()
    assert h100.search is not None and h200.search is not None
    g100 = h100.search.capacity_requests_per_second
    g200 = h200.search.capacity_requests_per_second
    assert g100 > 0 and g200 > 0
    # Break-even: the H100 price at which a good request costs the same on both.
    p200 = 4.0
    even = p200 * g100 / g200

    def first(p100: float, scale: float = 1.0) -> str:
        prices = {"H100": p100 * scale, "H200": p200 * scale}
        ranked = rank_by_cost([priced(h100, price_for("H100", prices)),
                               priced(h200, price_for("H200", prices))])
        return ranked[0].gpu_class

    assert first(even * 0.9) == "H100"
    assert first(even * 1.1) == "H200"
    # Scaling every price alike (another currency, a discount) changes no ranking.
    assert first(even * 0.9, scale=7.0) == "H100"
    assert first(even * 1.1, scale=0.3) == "H200"
    # A class without a price sorts last, whatever its capacity.
    ranked = rank_by_cost([priced(h100, None), priced(h200, price_for("H200", {}))])
    assert [p.gpu_class for p in ranked] == ["H200", "H100"]


def test_a_class_that_needs_more_replicas_pays_for_them() -> None:
    # RAG traffic one H100 cannot serve within the SLO: a good request costs the replica's
    # hour over its capacity at SLO, and the replicas needed serve the whole rate at it.
    pool = plan_by_goodput(_request("H100", "rag", 30.0, 1.0, 0.03), settings=QUICK)
    s = priced(pool, price_for("H100", {})).search
    assert s is not None and s.cost is not None and not s.slo_met
    assert s.replicas_needed is not None and s.replicas_needed >= 2
    assert s.cost.cost_per_million_good_requests_usd == pytest.approx(
        s.cost.usd_per_replica_hour / (s.capacity_requests_per_second * 3600) * 1e6)
    at_needed = (s.replicas_needed * s.cost.usd_per_replica_hour
                 / (s.observed_rate_per_second * 3600) * 1e6)
    # Rounding up to whole replicas costs at most one replica more than capacity alone.
    assert s.cost.cost_per_million_good_requests_usd <= at_needed * (1 + 1e-9)
    assert at_needed < s.cost.cost_per_million_good_requests_usd * (
        s.replicas_needed / (s.replicas_needed - 1))


def test_default_prices_cite_their_source_and_overrides_are_checked() -> None:
    defaults = default_prices()
    assert {"H100", "H200", "B200", "A100-80GB"} <= set(defaults)
    for p in defaults.values():
        assert p.usd_per_gpu_hour > 0 and "http" in p.source
        assert get_gpu_class(p.gpu_class).name == p.gpu_class
    assert price_for("h200") == defaults["H200"]
    assert price_for("L4") is None  # no list price shipped: no cost shown
    assert parse_overrides(["H100=2.49,h200=3.5", "B200=5"], "--gpu-price") == {
        "H100": 2.49, "h200": 3.5, "B200": 5.0}
    for bad in ("H100", "H100=", "H100=abc", "=3", "H100=-1", "H100=nan", "H100=0"):
        with pytest.raises(InvalidInput, match=r"^--gpu-price=.*CLASS=USD"):
            parse_overrides([bad], "--gpu-price")



@pytest.mark.slow
def test_replicas_share_the_rate_and_enough_of_them_meet_the_slo() -> None:
    # RAG traffic one H100 cannot serve within the SLO: the search says how many replicas
    # the traffic needs; planned for that many (each on its share), the SLO is met.
    request = _request("H100", "rag", 30.0, 1.0, 0.03)
    one = plan_by_goodput(request, settings=QUICK).search
    assert one is not None and not one.slo_met and one.replicas == 1
    assert one.replicas_needed is not None and one.replicas_needed >= 2
    assert any(f"needs {one.replicas_needed} replicas" in w
               for w in plan_by_goodput(request, settings=QUICK).warnings)
    enough = plan_by_goodput(request, settings=QUICK, replicas=one.replicas_needed).search
    assert enough is not None and enough.slo_met, enough
    assert enough.replicas == one.replicas_needed
    assert enough.observed_rate_per_second == pytest.approx(one.observed_rate_per_second)
    assert enough.rate_per_replica_per_second == pytest.approx(
        one.observed_rate_per_second / one.replicas_needed)
    # Fewer than needed: still at risk, and still the same total count of replicas needed
    # (within the ladder's resolution).
    if one.replicas_needed > 2:
        fewer = plan_by_goodput(request, settings=QUICK, replicas=2).search
        assert fewer is not None and not fewer.slo_met
        assert fewer.replicas_needed is not None and fewer.replicas_needed > 2
