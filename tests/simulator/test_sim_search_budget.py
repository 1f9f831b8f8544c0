"""The capacity search's budget (tuner/planner/search_budget.py), the stream-size cap
(simulator/profile_traffic.py) and the closed-form SLO bound (simulator/slo_bound.py): an
impossible SLO or an absurd rate ends at once with a clear answer, a spent budget keeps the
best plan so far and says so, and a cancelled search stops."""

from __future__ import annotations

import itertools
import math
import time

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner import search as search_module
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


class ShrinkingScorer(CountingScorer):
    """As ``CountingScorer``, but a longer stream sustains less (a queue has longer to
    build): the capacity on n requests is the one on 30 x sqrt(30 / n)."""

    def score(self, request: PlanRequest, plan: KVPlan, num_requests: int,
              rate_scale: float = 1.0) -> GoodputScore:
        return super().score(request, plan, num_requests,
                             rate_scale / math.sqrt(30 / num_requests))


def _stopped_after(looks: int, scorer: CountingScorer) -> SearchBudget:
    """A CPU budget spent after ``looks`` looks at the meter, each a quarter second."""
    clock = itertools.count()
    return SearchBudget(cpu_seconds=looks / 4 + 0.1, cpu_clock=lambda: next(clock) / 4)


def test_a_budget_spent_midway_keeps_the_best_plan_measured_on_the_full_stream() -> None:
    scorer = ShrinkingScorer()
    pool = search(_request(10.0), scorer, settings=SearchSettings(rungs=(30, 80)),
                  meter=_stopped_after(4, scorer).start())
    s = pool.search
    assert s is not None and s.stopped_by is not None and "CPU budget" in s.stopped_by
    # Four looks, then the stop; then the chosen plan alone on the whole stream, in a grace.
    assert 4 < scorer.calls <= 4 + 20
    assert s.requests_per_candidate == 30 and s.capacity_measured_requests == 80
    # Its capacity is the full stream's (a 30-request figure would be sqrt(80/30) = 1.63x).
    true_80 = 10.0 * (pool.plan.max_num_seqs % 97) / 10 * math.sqrt(30 / 80)
    assert true_80 / 1.021 <= s.capacity_requests_per_second <= true_80 * 1.0001
    warning = next(w for w in pool.warnings if w.startswith("search stopped by its budget"))
    assert "measured on the full stream of 80" in warning
    full = search(_request(10.0), CountingScorer(), settings=SearchSettings(rungs=(30, 80)),
                  meter=UNBOUNDED.start())
    assert full.search is not None and full.search.stopped_by is None
    assert full.search.capacity_measured_requests == 80


def test_with_no_grace_left_a_short_streams_capacity_is_labelled_as_such(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "GRACE_MIN_CPU_SECONDS", 0.0)
    monkeypatch.setattr(search_module, "GRACE_SHARE", 0.0)
    scorer = ShrinkingScorer()
    pool = search(_request(10.0), scorer, settings=SearchSettings(rungs=(30, 80)),
                  meter=_stopped_after(4, scorer).start())
    s = pool.search
    assert s is not None and s.stopped_by is not None and scorer.calls == 4
    assert s.capacity_measured_requests == 30 == s.requests_per_candidate
    warning = next(w for w in pool.warnings if w.startswith("search stopped by its budget"))
    assert "measured on the first 30 requests" in warning and "overstate" in warning


@pytest.mark.slow
def test_the_default_budget_finishes_the_chat_search_at_5_requests_per_second() -> None:
    """The standard spec (`kvtune plan -m meta-llama/Llama-3.1-8B-Instruct -g H100
    --workload chat --request-rate 5`) searches to its last stage within the default 60 s;
    before the knockout it took ~96 s and stopped at its 100-request rung."""
    pool = plan_by_goodput(_request(5.0, ttft=None, tpot=None), budget=SearchBudget())
    s = pool.search
    assert s is not None and s.stopped_by is None
    assert s.capacity_measured_requests == s.requests_per_candidate == 800


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
