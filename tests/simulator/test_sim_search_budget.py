"""The capacity search's budget (tuner/planner/search_budget.py), the stream-size cap
(simulator/profile_traffic.py) and the closed-form SLO bound (simulator/slo_bound.py): an
impossible SLO or an absurd rate ends at once with a clear answer, a spent budget keeps the
best plan so far and says so, and a cancelled search stops."""

from __future__ import annotations

import itertools
import time

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.search import GoodputScore, SearchSettings, search
from kvtune.tuner.planner.search_budget import (
    UNBOUNDED,
    SearchBudget,
    SearchBudgetSpent,
    SearchCancelled,
)
from kvtune.tuner.simulator import slo_bound
from kvtune.tuner.simulator.goodput_search import plan_by_goodput
from kvtune.tuner.simulator.profile_traffic import traffic_from_profile

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TINY = SearchSettings(rungs=(20,), batched_tokens=(2048,))


def _request(rate: float, ttft: float | None = 2.0, tpot: float | None = 0.05,
             kind: str = "chat") -> PlanRequest:
    profile = preset_profile(kind).model_copy(update={"request_rate_per_second": rate})
    return PlanRequest(model=get_model(MODEL), gpu=get_gpu_class("H100"), profile=profile,
                       policy=PlanPolicy(slo=SLO(ttft_p95_seconds=ttft, tpot_p95_seconds=tpot)))


class CountingScorer:
    """Deterministic scores without simulating: capacity from the plan's max-num-seqs (it
    meets the SLO up to (max-num-seqs % 97) / 10 times the observed rate)."""

    rate_per_second = 10.0
    max_requests = 80

    def __init__(self) -> None:
        self.calls = 0

    def score(self, request: PlanRequest, plan: KVPlan, num_requests: int,
              rate_scale: float = 1.0) -> GoodputScore:
        self.calls += 1
        meets = rate_scale <= (plan.max_num_seqs % 97) / 10
        return GoodputScore(slo_attainment=1.0 if meets else 0.5, keeps_up=True,
                            throughput_requests_per_second=10.0, ttft_p95_seconds=0.1,
                            tpot_p95_seconds=0.01, requests=num_requests)


@pytest.mark.parametrize("rate", [1e5, 1e9])
def test_traffic_at_an_absurd_rate_is_the_stream_size_and_keeps_its_rate(rate: float) -> None:
    t0 = time.process_time()
    reqs = traffic_from_profile(preset_profile("chat").model_copy(
        update={"request_rate_per_second": rate}), 800)
    assert len(reqs) == 800
    span = reqs[-1].arrival_seconds - reqs[0].arrival_seconds
    # The stream's own rate is the declared one (within sampling noise), not a fraction.
    assert 0.7 * rate < 799 / span < 1.4 * rate
    assert time.process_time() - t0 < 20  # was: gigabytes (1e5), terabytes (1e9)


def test_an_impossible_ttft_is_unreachable_from_the_bound_without_searching() -> None:
    request = _request(5000.0, ttft=0.001)
    t0 = time.process_time()
    pool = plan_by_goodput(request, settings=TINY)
    assert time.process_time() - t0 < 5
    assert pool.search is None
    u = pool.slo_unreachable
    assert u is not None and u.ttft_floor_seconds > 0.001
    assert u.message.startswith("SLO unreachable") and u.message in pool.warnings
    # The floor is at least the weights read once at the GPU's bandwidth (16 GB / 3.35 TB/s).
    assert u.ttft_floor_seconds > 0.004


def test_a_reachable_slo_has_floors_below_it() -> None:
    request = _request(5.0, ttft=2.0, tpot=0.05)
    assert slo_bound.slo_unreachable(request, "auto") is None
    ttft, tpot, _ = slo_bound.latency_floors(request, "auto")
    assert 0 < tpot <= ttft < 2.0


def test_an_impossible_tpot_is_unreachable() -> None:
    u = slo_bound.slo_unreachable(_request(5.0, ttft=None, tpot=0.0001), "auto")
    assert u is not None and "TPOT" in u.message and u.tpot_floor_seconds > 0.0001


def test_a_budget_spent_before_any_score_is_a_clean_error() -> None:
    clock = itertools.count()  # one CPU second per look
    budget = SearchBudget(cpu_seconds=0.5, cpu_clock=lambda: float(next(clock)))
    with pytest.raises(SearchBudgetSpent, match=r"CPU budget of 0\.5 s"):
        plan_by_goodput(_request(7.0), settings=TINY, budget=budget)


def test_memory_the_search_adds_past_the_budget_stops_it() -> None:
    # The budget is the search's growth of the process, not the process's size: a process
    # already at 2 GiB (torch imported) searches; one that grows by 2 GiB mid-search stops.
    sizes = iter([2**31, *([2**31 + 2**20] * 10**6)])
    big_process = SearchBudget(memory_bytes=2**30, rss_bytes=lambda: next(sizes))
    assert plan_by_goodput(_request(7.0), settings=TINY, budget=big_process)
    grows = iter([2**31, *([2**32] * 10**6)])
    runaway = SearchBudget(memory_bytes=2**30, rss_bytes=lambda: next(grows))
    with pytest.raises(SearchBudgetSpent, match="grew the process's memory by 2048 MiB"):
        plan_by_goodput(_request(7.0), settings=TINY, budget=runaway)


def test_a_budget_spent_midway_keeps_the_best_scored_plan_and_says_why() -> None:
    scorer = CountingScorer()
    clock = itertools.count()
    budget = SearchBudget(cpu_seconds=4.5, cpu_clock=lambda: float(next(clock)))
    pool = search(_request(10.0), scorer, settings=SearchSettings(rungs=(30, 80)),
                  meter=budget.start())
    s = pool.search
    assert s is not None and s.stopped_by is not None and "CPU budget" in s.stopped_by
    assert scorer.calls == 4  # four looks allowed, then stopped before the fifth score
    assert any(w.startswith("search stopped by its budget") for w in pool.warnings)
    full = search(_request(10.0), CountingScorer(), settings=SearchSettings(rungs=(30, 80)),
                  meter=UNBOUNDED.start())
    assert full.search is not None and full.search.stopped_by is None


def test_a_cancelled_search_stops_at_once() -> None:
    scorer = CountingScorer()
    budget = SearchBudget(cancelled=lambda: True)
    with pytest.raises(SearchCancelled):
        search(_request(10.0), scorer, meter=budget.start())
    assert scorer.calls == 0


def test_a_search_in_a_thread_stops_within_seconds_of_the_switch() -> None:
    """What the operator's shutdown relies on: kopf's handler threads cannot be killed, so a
    running search must notice the switch (between scores and inside a replay) by itself."""
    import threading

    stop = threading.Event()
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            plan_by_goodput(_request(20000.0), budget=SearchBudget(cpu_seconds=None,
                                                                    cancelled=stop.is_set))
            outcome.append(None)
        except BaseException as exc:  # the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    time.sleep(2.0)  # the search is well under way: it takes many seconds at this rate
    assert thread.is_alive()
    t0 = time.monotonic()
    stop.set()
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert isinstance(outcome[0], SearchCancelled)
    assert time.monotonic() - t0 < 15
