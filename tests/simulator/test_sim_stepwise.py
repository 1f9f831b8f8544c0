"""The step-wise scheduler: same steps as a batch run, driven by submit / advance_to."""

from __future__ import annotations

import math

import pytest
from simhelpers import STEP_SECONDS, fixed_step_cost, request

from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.simulator.engine import simulated_plan, vllm_default_plan
from kvtune.tuner.simulator.prefix import SegmentInterner
from kvtune.tuner.simulator.scheduler import EngineConfig, Scheduler
from kvtune.tuner.simulator.stepwise import (
    StepwiseScheduler,
    sim_request_from_trace,
)
from kvtune.tuner.simulator.workload import requests_from_trace
from kvtune.tuner.traces import load_trace

CFG = EngineConfig(num_gpu_blocks=201, block_size=16, max_num_seqs=8,
                   max_num_batched_tokens=512, max_model_len=4096)


def test_one_request_reports_ttft_gaps_and_the_finish() -> None:
    s = StepwiseScheduler(CFG, fixed_step_cost())
    assert s.submit(request(0, 0.0, 100, 5))
    s.advance_to(0.005)  # one step is never split: now passes t by less than a step
    assert s.state().running == 1 and math.isclose(s.now, STEP_SECONDS)
    ev = s.drain()
    assert ev.first_token_seconds == [pytest.approx(STEP_SECONDS)]
    s.advance_to(1.0)
    ev = s.drain()
    assert sum(n for _, n in ev.token_gaps) == 4
    assert all(gap == pytest.approx(STEP_SECONDS) for gap, _ in ev.token_gaps)
    (done,) = ev.finished
    assert done.output_tokens == 5 and done.finished_reason == "stop"
    assert done.finish_seconds == pytest.approx(5 * STEP_SECONDS)
    st = s.state()
    assert (st.running, st.waiting, st.generation_tokens, st.prompt_tokens) == (0, 0, 5, 100)
    assert s.now == 1.0  # idle time is skipped to t


def test_rejections_and_order() -> None:
    s = StepwiseScheduler(CFG, fixed_step_cost())
    assert not s.submit(request(0, 0.0, 4096, 5))  # no room for one output token
    assert s.submit(request(1, 1.0, 10, 5))
    with pytest.raises(InvalidInput, match="arrival order"):
        s.submit(request(2, 0.5, 10, 5))
    assert s.state().rejected == 1


def test_all_at_once_matches_the_batch_run_exactly() -> None:
    reqs = [request(i, 0.02 * i, 50 + 37 * (i % 7), 3 + 11 * (i % 5),
                    shared=((1, 32),)) for i in range(60)]
    batch = Scheduler(reqs, CFG, fixed_step_cost()).run()
    s = StepwiseScheduler(CFG, fixed_step_cost())
    for r in reqs:
        s.submit(r)
    s.advance_to(math.inf)
    done = {f.request_id: f for f in s.drain().finished}
    assert len(done) == 60
    for i in range(60):
        assert done[i].first_token_seconds == batch.first_token_seconds[i]
        assert done[i].finish_seconds == batch.finish_seconds[i]
    assert s.preemptions == batch.preemptions
    assert s.hit_tokens == batch.prefix_hit_tokens > 0


def test_streaming_the_azure_trace_matches_the_batch_run() -> None:
    trace = load_trace(AZURE)
    request_ = PlanRequest(model=get_model("meta-llama/Llama-3.1-8B-Instruct"),
                           gpu=get_gpu_class("H100"), profile=profile_from_trace(trace))
    sim = simulated_plan(request_, vllm_default_plan(request_), "defaults")
    reqs = requests_from_trace(trace, limit=400)
    batch = Scheduler(reqs, sim.engine, sim.cost).run()
    s = StepwiseScheduler(sim.engine, sim.cost)
    interner = SegmentInterner()
    rows = trace.requests[:400]
    t0 = rows[0].arrival_seconds
    k = 0
    t = 0.0
    finished = []
    while k < len(rows) or s.state().running or s.state().waiting:
        t += 1.0
        while k < len(rows) and rows[k].arrival_seconds - t0 <= t:
            s.submit(sim_request_from_trace(rows[k], k, rows[k].arrival_seconds - t0, interner))
            k += 1
        s.advance_to(t)
        finished += s.drain().finished
    assert len(finished) == 400
    # Decode runs end at each advance_to horizon: the same steps, summed in other groups.
    ttft = sorted(f.first_token_seconds - f.arrival_seconds for f in finished)
    want = sorted(a - b for a, b in zip(batch.first_token_seconds, batch.arrival_seconds,
                                        strict=True))
    assert ttft == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_in_flight_lists_running_then_waiting_then_future() -> None:
    s = StepwiseScheduler(CFG, fixed_step_cost())
    for i in range(3):
        s.submit(request(i, 0.0, 100, 50))
    s.submit(request(3, 5.0, 100, 50))
    s.advance_to(0.1)
    assert s.state().running == 3
    assert [r.request_id for r in s.in_flight()] == [0, 1, 2, 3]
