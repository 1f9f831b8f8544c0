"""The CPU KV tier (``--kv-offloading-size``, ``tuner/simulator/offload.py``): multi-turn
history evicted from the GPU prefix cache is loaded from CPU instead of recomputed, and a
run with offload off (or with nothing to reuse) is exactly the run without the tier."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner
from simhelpers import STEP_SECONDS, assert_same_times, fixed_step_cost, request
from test_sim_cohort import ROOFLINE, _slice

from kvtune.cli.main import cli
from kvtune.e2e.traces import MOONCAKE_TRACE
from kvtune.oracle.steps import RunRecord, kvtune_steps
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.simulator.compare import parse_overrides
from kvtune.tuner.simulator.engine import offload_tier, simulated_plan
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.offload import CPUTier, RequestOffload
from kvtune.tuner.simulator.scheduler import EngineConfig, Scheduler, simulate
from kvtune.tuner.simulator.workload import SimRequest

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SESSIONS = 8
HISTORY_TOKENS = 1024  # turn 1's prompt: 64 blocks of 16
NEW_TOKENS = 256


def _multi_turn() -> list[SimRequest]:
    """Eight sessions: all first turns, then all second turns (each re-sends its first
    turn's prompt, then 256 new tokens). The GPU cache holds about three histories."""
    reqs: list[SimRequest] = []
    for s in range(SESSIONS):
        history = ((100 + s, HISTORY_TOKENS),)
        reqs.append(request(s, 0.5 * s, HISTORY_TOKENS, 4, history))
    for s in range(SESSIONS):
        turn2 = ((100 + s, HISTORY_TOKENS), (200 + s, NEW_TOKENS))
        reqs.append(request(SESSIONS + s, 10.0 + 0.5 * s, HISTORY_TOKENS + NEW_TOKENS, 4,
                            turn2))
    return reqs


def _cfg(**kw: object) -> EngineConfig:
    base: dict[str, object] = dict(
        num_gpu_blocks=200, block_size=16, max_num_seqs=8, max_num_batched_tokens=128,
        max_model_len=4096, enable_prefix_caching=True, async_scheduling=True,
    )
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


def _ttft(res: SimResult, ids: range) -> float:
    return float(np.mean([res.first_token_seconds[i] - res.arrival_seconds[i] for i in ids]))


def _same(a: SimResult, b: SimResult) -> None:
    assert a.first_token_seconds == b.first_token_seconds
    assert a.finish_seconds == b.finish_seconds
    assert (a.preemptions, a.prefix_hit_tokens, a.resume_hit_tokens) == (
        b.preemptions, b.prefix_hit_tokens, b.resume_hit_tokens)
    assert a.series.kv_usage == b.series.kv_usage


def test_evicted_history_is_loaded_from_cpu_and_ttft_falls() -> None:
    reqs = _multi_turn()
    cost = fixed_step_cost()
    off = simulate(reqs, _cfg(), cost)
    # 8 x 64 history blocks fit in 1,000 CPU chunks; a chunk loads in 0.1 ms.
    on = simulate(reqs, _cfg(cpu_offload_blocks=1000, offload_load_seconds_per_block=1e-4),
                  cost)
    second = range(SESSIONS, 2 * SESSIONS)
    assert off.cpu_hit_tokens == 0
    # Most histories were evicted from the GPU cache (it holds ~3): the GPU alone finds few.
    assert off.prefix_hit_tokens < SESSIONS * HISTORY_TOKENS / 2
    # With the tier, every second turn finds its whole history on GPU or CPU.
    assert on.prefix_hit_tokens + on.cpu_hit_tokens == SESSIONS * HISTORY_TOKENS
    assert on.cpu_hit_tokens >= SESSIONS * HISTORY_TOKENS / 2
    # A history of 64 blocks loads in 6.4 ms; recomputing it takes 8 steps of 128 tokens.
    assert _ttft(on, second) < _ttft(off, second) - 4 * STEP_SECONDS
    # First turns are untouched (nothing to load yet).
    assert on.first_token_seconds[:SESSIONS] == off.first_token_seconds[:SESSIONS]


def test_a_load_waits_on_the_host_link_and_takes_no_step_budget() -> None:
    """One history of 64 blocks evicted, then re-sent: the request waits for its load (10 ms
    a chunk) and then computes only its new tokens."""
    first = request(0, 0.0, HISTORY_TOKENS, 2, ((100, HISTORY_TOKENS),))
    # A stranger big enough to evict the history from a 70-block GPU cache.
    evictor = request(1, 1.0, 1000, 2)
    again = request(2, 2.0, HISTORY_TOKENS + 16, 2, ((100, HISTORY_TOKENS), (200, 16)))
    cfg = _cfg(num_gpu_blocks=70, max_num_batched_tokens=2048, cpu_offload_blocks=500,
               offload_load_seconds_per_block=0.01)
    res = simulate([first, evictor, again], cfg, fixed_step_cost())
    # The GPU evicts a chain tail first: its head is a GPU hit, the rest comes from CPU.
    assert res.prefix_hit_tokens + res.cpu_hit_tokens == HISTORY_TOKENS
    assert res.cpu_hit_tokens >= HISTORY_TOKENS * 3 // 4
    ttft = res.first_token_seconds[2] - res.arrival_seconds[2]
    load = res.cpu_hit_tokens // 16 * 0.01
    # The load, then the first step that sees it computes the 16 new tokens.
    assert load <= ttft <= load + 2 * STEP_SECONDS + 1e-9


def _stored(tier: CPUTier, req: RequestOffload, keys: list[int], now: float = 0.0) -> None:
    """Offer ``keys`` as the request's prompt chunks from the first; the writes start
    with the next step and are reported done."""
    tier.store(req, keys, 0, 16)
    tier.begin_step(now)
    tier.complete(now + 1e9)


def test_the_cpu_tier_is_vllms_lru_of_its_capacity() -> None:
    """vLLM's LRUCachePolicy: a running request's chunks rank by its one rank, tail before
    head; once it finishes they become the most recent, head last."""
    tier = CPUTier(capacity_blocks=4, seconds_per_block=0.5)
    a = RequestOffload([1, 2, 3])
    _stored(tier, a, a.keys)
    assert tier.lookup(a.keys, 0, 3) == 3
    tier.finish(a)
    b = RequestOffload([7, 8])
    _stored(tier, b, b.keys)  # 3 + 2 > 4: one of a's goes, its tail
    tier.check_invariants()
    assert (tier.size, tier.stored_blocks, tier.evicted_blocks) == (4, 5, 1)
    assert tier.lookup(a.keys, 0, 3) == 2  # its head stays
    # b, still running, took its rank after a's refresh: a's chunks are older, tail first.
    c = RequestOffload([9])
    _stored(tier, c, c.keys)
    assert tier.lookup(b.keys, 0, 2) == 2
    assert tier.lookup(a.keys, 0, 2) == 1
    # Loads queue on the link: the second waits for the first.
    assert tier.load(a, [1], 0, 16, 0.0) == pytest.approx(0.5)
    assert tier.load(b, [7, 8], 0, 16, 0.2) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="capacity_blocks=0"):
        CPUTier(0, 1.0)


def test_chunks_being_written_or_read_are_neither_found_nor_evicted() -> None:
    tier = CPUTier(capacity_blocks=2, seconds_per_block=1.0)
    a = RequestOffload([1, 2])
    tier.store(a, a.keys, 0, 16)
    assert tier.lookup(a.keys, 0, 2) is None  # still being written: defer
    tier.begin_step(0.0)
    tier.complete(1.0)
    assert tier.lookup(a.keys, 0, 2) is None  # the write of 2 chunks takes 2 s
    tier.complete(2.0)
    assert tier.lookup(a.keys, 0, 2) == 2 and a.jobs == 0
    reader = RequestOffload([1, 2])
    tier.load(reader, [1, 2], 0, 16, 2.0)
    b = RequestOffload([5])
    tier.store(b, b.keys, 0, 16)  # no idle chunk to evict: dropped, offered again
    assert (b.next_chunk, tier.size, tier.evicted_blocks) == (0, 2, 0)
    assert tier.lookup(a.keys, 0, 2) is None  # being loaded for another request
    tier.complete(4.0)
    tier.store(b, b.keys, 0, 16)
    assert (b.next_chunk, tier.evicted_blocks) == (1, 1)
    tier.check_invariants()


def test_many_stores_keep_the_lru_consistent() -> None:
    rng = np.random.default_rng(3)
    tier = CPUTier(capacity_blocks=50, seconds_per_block=0.0)
    for i in range(400):
        start = int(rng.integers(0, 200))
        req = RequestOffload(list(range(start, start + int(rng.integers(1, 30)))))
        tier.store(req, req.keys, 0, 16)
        tier.begin_step(float(i))
        tier.complete(float(i))
        found = tier.lookup(req.keys, 0, len(req.keys))
        if found:
            tier.load(req, req.keys[:found], 0, 16, float(i))
            tier.complete(float(i))
        tier.finish(req)
        tier.check_invariants()


def test_offload_with_nothing_to_reuse_is_exactly_the_run_without_it() -> None:
    """Requests that share nothing: the tier stores every prompt, finds nothing, and the
    run is the one without it, step for step (synchronous: with two batches in flight
    vLLM's KV connector changes preemption, ``test_async_offload_never_preempts_...``). The
    times agree to rounding: with the tier the simulator steps exactly."""
    reqs = [request(i, 0.05 * i, 300 + 37 * (i % 5), 20 + i % 7) for i in range(60)]
    cost = fixed_step_cost()
    off = simulate(reqs, _cfg(num_gpu_blocks=120, async_scheduling=False), cost)
    tier = Scheduler(reqs, _cfg(num_gpu_blocks=120, cpu_offload_blocks=100,
                                offload_load_seconds_per_block=1e-3, async_scheduling=False),
                     cost)
    on = tier.run()
    assert tier.offload is not None and tier.offload.stored_blocks > 0
    assert on.cpu_hit_tokens == 0
    assert_same_times(on, off)
    assert (on.preemptions, on.prefix_hit_tokens, on.resume_hit_tokens) == (
        off.preemptions, off.prefix_hit_tokens, off.resume_hit_tokens)


def test_async_offload_never_preempts_a_request_of_the_step_in_flight() -> None:
    """vLLM 0.33 with a KV connector and async scheduling defers freeing blocks the step
    in flight may still write (``defer_block_free``): a request scheduled in the step
    before is never preempted; the request that needs a block waits instead (until an
    empty step has processed the step in flight: records skip empty steps, so a few such
    victims remain visible). Without the tier the same traffic preempts many more."""
    reqs = _slice("mooncake", 4.0, 150, 0)
    cfg = _cfg(num_gpu_blocks=1000, max_num_seqs=32, max_num_batched_tokens=1024,
               max_model_len=32768)

    def in_flight_victims(run: RunRecord) -> int:
        return sum(1 for prev, step in zip(run.steps, run.steps[1:], strict=False)
                   for rid in step.preempted if rid in dict(prev.scheduled))

    off = kvtune_steps(reqs, cfg, fixed_step_cost())
    on = kvtune_steps(reqs, dataclasses.replace(cfg, cpu_offload_blocks=3000,
                                                offload_load_seconds_per_block=2e-4),
                      fixed_step_cost())
    assert on.preemptions > 0
    assert in_flight_victims(on) * 3 < in_flight_victims(off)
    assert on.cpu_loads and on.cpu_stored > 0


def test_offload_off_is_the_default_engine() -> None:
    reqs = _multi_turn()
    cost = fixed_step_cost()
    plain = simulate(reqs, _cfg(), cost)
    zero = simulate(reqs, _cfg(cpu_offload_blocks=0, offload_load_seconds_per_block=1.0), cost)
    _same(plain, zero)
    assert Scheduler(reqs, _cfg(cpu_offload_blocks=10), cost).offload is not None
    # Offload needs the prefix cache's keys: without caching there is no tier.
    no_cache = _cfg(enable_prefix_caching=False, cpu_offload_blocks=10)
    assert Scheduler(reqs, no_cache, cost).offload is None


def test_the_engine_sizes_the_tier_as_vllm() -> None:
    """8B on one H100 at 16-token blocks: a block of all layers is 2 MiB (bf16: 32 layers x
    2 x 8 heads x 128 x 2 bytes x 16 tokens); 10 GiB hold 5,120 chunks; one loads over
    PCIe Gen5 (64 GB/s each way) in 2 MiB / 64e9 s."""
    req = PlanRequest(model=get_model(MODEL),
                      gpu=get_gpu_class("H100"), profile=preset_profile("chat"))
    plan = plan_pool(req).plan.model_copy(update={
        "kv_offloading_size_gib": 10.0, "block_size": 16, "kv_cache_dtype": "auto"})
    blocks, seconds = offload_tier(req, plan, 2 * 2**20)
    assert blocks == 5120
    assert seconds == pytest.approx(2 * 2**20 / 64e9)
    sim = simulated_plan(req, plan, "with offload")
    assert sim.engine.cpu_offload_blocks == 5120
    off = simulated_plan(req, plan.model_copy(update={"kv_offloading_size_gib": None}), "off")
    assert off.engine.cpu_offload_blocks == 0
    assert dataclasses.replace(sim.engine, cpu_offload_blocks=0,
                               offload_load_seconds_per_block=0.0) == off.engine


def test_kvtune_simulate_takes_an_offload_size_and_reports_cpu_hits() -> None:
    """``kvtune simulate --config kv_offloading_size_gib=N`` replays with the CPU tier (0:
    off); the JSON reports the tier's chunks and the tokens it served (``--engine vllm``
    with the knob: ``tests/oracle/test_oracle_offload.py``)."""
    assert parse_overrides(["kv-offloading-size-gib=64"]) == {"kv_offloading_size_gib": 64.0}
    args = ["simulate", "--trace", str(MOONCAKE_TRACE), "--model", MODEL, "--gpu", "H100",
            "--limit", "300", "--compare", "custom", "--score-sample", "0", "-o", "json",
            "--config", "kv_offloading_size_gib=256"]
    runner = CliRunner()
    ok = runner.invoke(cli, args)
    assert ok.exit_code == 0, ok.output
    row = json.loads(ok.output)["configurations"][0]
    assert row["engine"]["cpu_offload_blocks"] > 0
    assert "--kv-offloading-size=256" in row["vllm_args"]
    assert row["cpu_hit_tokens"] >= 0
    off = runner.invoke(cli, [*args[:-1], "kv_offloading_size_gib=0"])
    assert off.exit_code == 0, off.output
    row_off = json.loads(off.output)["configurations"][0]
    assert row_off["engine"]["cpu_offload_blocks"] == 0 and row_off["cpu_hit_tokens"] == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("speed", "gpu_blocks", "seconds_per_block"), [
    (4.0, 1500, 2e-5),   # tight: preemptions, loads beside them
    (1.0, 3000, 1e-3),   # a slow link: loads queue, requests wait on them
])
@pytest.mark.slow
def test_offload_fast_path_equals_exact_stepping(
    speed: float, gpu_blocks: int, seconds_per_block: float, async_scheduling: bool,
) -> None:
    """The decoding cohort and decode runs stop for a load that arrives as they stop for an
    arrival: with the CPU tier on, every request's times equal exact stepping; the block
    pool and the tier keep their invariants at every step, and every request finishes."""
    reqs = _slice("mooncake", speed, 300, 0)
    cfg = EngineConfig(num_gpu_blocks=gpu_blocks, block_size=16, max_num_seqs=64,
                       max_num_batched_tokens=2048, max_model_len=32768,
                       enable_prefix_caching=True, async_scheduling=async_scheduling,
                       cpu_offload_blocks=20000, offload_load_seconds_per_block=seconds_per_block)
    fast = Scheduler(reqs, cfg, ROOFLINE).run()
    checked = {"steps": 0}

    def check(s: Scheduler) -> None:
        s.pool.check_invariants()
        assert s.offload is not None
        if checked["steps"] % 50 == 0:  # O(chunks): every 50th step
            s.offload.check_invariants()
        checked["steps"] += 1

    exact = Scheduler(reqs, cfg, ROOFLINE, decode_runs=False, on_step=check).run()
    assert exact.cpu_hit_tokens > 0 and checked["steps"] > 0
    assert fast.cpu_hit_tokens == exact.cpu_hit_tokens
    assert fast.preemptions == exact.preemptions
    assert fast.prefix_hit_tokens == exact.prefix_hit_tokens
    assert_same_times(fast, exact)
    done = [f for f, o in zip(exact.finish_seconds, exact.output_tokens, strict=True) if o]
    assert all(f == f for f in done), "a request never finished"


def test_async_scheduling_sees_a_finished_load_one_step_later() -> None:
    """vLLM learns of a finished load from a step's output. Synchronous, the next schedule
    sees it; async, the next schedule runs before that output is processed, so the request
    starts one step later. A decoder keeps steps going while the load runs."""
    first = request(0, 0.0, HISTORY_TOKENS, 2, ((100, HISTORY_TOKENS),))
    evictor = request(1, 1.0, 1000, 2)
    ticker = request(2, 1.5, 16, 400)
    again = request(3, 2.0, HISTORY_TOKENS + 16, 2, ((100, HISTORY_TOKENS), (200, 16)))
    reqs = [first, evictor, ticker, again]
    ttft = {}
    for mode in (False, True):
        cfg = _cfg(num_gpu_blocks=72, max_num_batched_tokens=2048, cpu_offload_blocks=500,
                   offload_load_seconds_per_block=0.00333, async_scheduling=mode)
        res = simulate(reqs, cfg, fixed_step_cost())
        assert res.cpu_hit_tokens > 0
        ttft[mode] = res.first_token_seconds[3] - res.arrival_seconds[3]
    assert ttft[True] == pytest.approx(ttft[False] + STEP_SECONDS)
