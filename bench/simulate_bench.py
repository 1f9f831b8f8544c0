"""How fast the KV-cache simulator replays traffic, with a baseline in the same run.

Prints simulated requests per second of wall (and CPU) time for:

- the full Azure conversation trace (19,366 requests) under vLLM 0.33's defaults for
  Llama-3.1-8B on one H100 (the figure the issue asks for: under 5 s);
- the same configuration on the first ``--baseline-requests`` requests, once with decode
  runs (the shipped fast path) and once stepping every engine step exactly (the reference
  the fast path is tested against): the ratio is the speed-up of the fast path;
- the Mooncake trace (3,993 multi-turn requests, long heavily shared prompts: ~960 blocks
  of 16 tokens each) with prefix caching on, at its recorded rate and at 0.25x.

Per trace, the figure is simulated requests per second of CPU time (``req/s cpu``; the
goal is >= 10,000 on every trace) and of wall time. The machine is shared: the load
average is printed with the figures. Run:

    .venv/bin/python bench/simulate_bench.py
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE, TRACES_DIR
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.simulator.engine import SimulatedPlan, simulated_plan, vllm_default_plan
from kvtune.tuner.simulator.scheduler import Scheduler
from kvtune.tuner.simulator.workload import SimRequest, requests_from_trace
from kvtune.tuner.traces import load_trace

DATA = TRACES_DIR  # the traces shipped in examples/traces
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _timed(reqs: Sequence[SimRequest], sim: SimulatedPlan, decode_runs: bool = True
           ) -> tuple[float, float, Scheduler]:
    sched = Scheduler(reqs, sim.engine, sim.cost, name=sim.name, decode_runs=decode_runs)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    sched.run()
    return time.perf_counter() - wall0, time.process_time() - cpu0, sched


def _line(label: str, n: int, wall: float, cpu: float, sched: Scheduler) -> str:
    return (f"{label:<46} {n:>6} req  cpu {cpu:6.2f} s  {n / cpu:>7.0f} req/s cpu  "
            f"{n / wall:>7.0f} req/s wall  {sched.steps:>9} engine steps in "
            f"{sched.events} loop iterations")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--baseline-requests", type=int, default=1500)
    ap.add_argument("--gpu", default="H100")
    args = ap.parse_args()

    azure = load_trace(args.data / AZURE_TRACE.name)
    request = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class(args.gpu),
                          profile=profile_from_trace(azure))
    sim = simulated_plan(request, vllm_default_plan(request), "defaults")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(a shared machine: wall times are noisy)")
    print(f"configuration: {MODEL} on {args.gpu}, vLLM 0.33 defaults "
          f"({' '.join(sim.plan.vllm_args())}), {sim.engine.num_gpu_blocks} blocks")

    reqs = requests_from_trace(azure)
    wall, cpu, sched = _timed(reqs, sim)
    print(_line("Azure conv, full trace, decode runs", len(reqs), wall, cpu, sched))
    fast = requests_from_trace(azure, speed=4.0)
    wall, cpu, sched = _timed(fast, sim)
    print(_line("Azure conv, full trace at 4x, decode runs", len(fast), wall, cpu, sched))

    sub = reqs[: args.baseline_requests]
    fast_wall, fast_cpu, fast = _timed(sub, sim)
    print(_line("Azure conv, first N, decode runs", len(sub), fast_wall, fast_cpu, fast))
    ref_wall, ref_cpu, ref = _timed(sub, sim, decode_runs=False)
    print(_line("Azure conv, first N, exact steps (baseline)", len(sub), ref_wall, ref_cpu,
                ref))
    print(f"speed-up of decode runs over exact stepping: {ref_wall / fast_wall:.1f}x wall, "
          f"{ref_cpu / fast_cpu:.1f}x cpu")

    mooncake = load_trace(args.data / MOONCAKE_TRACE.name)
    mreq = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class(args.gpu),
                       profile=profile_from_trace(mooncake))
    msim = simulated_plan(mreq, vllm_default_plan(mreq), "defaults")
    for speed in (1.0, 0.25):
        mreqs = requests_from_trace(mooncake, speed=speed)
        wall, cpu, sched = _timed(mreqs, msim)
        print(_line(f"Mooncake, full trace at {speed:g}x, prefix caching", len(mreqs), wall,
                    cpu, sched))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
