"""How much slower `kvtune simulate --engine vllm` (vLLM 0.33.0's own scheduler) is than the
default engine (kvtune's simulator), and that the two agree, measured in the same run.

On a Mooncake slice (long, heavily shared prompts) and an Azure conversation slice, under
vLLM 0.33's defaults for Llama-3.1-8B on one H100 with a KV cache made small enough
(``--kv-blocks``) that requests queue and get preempted, async scheduling on (vLLM's
default). Prints wall seconds of each engine (the default simulator with decode runs, the
simulator stepping every step, vLLM's scheduler), the slow-down of vLLM against the default,
engine steps per second, and the largest difference in any request's finish time. vLLM's
one-time import and first scheduler construction are printed apart (paid once per process).

    .venv/bin/python bench/vllm_engine_bench.py
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from pathlib import Path

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE, TRACES_DIR
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.simulator.engine import simulated_plan, vllm_default_plan
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.scheduler import Scheduler
from kvtune.tuner.simulator.workload import requests_from_trace
from kvtune.tuner.traces import load_trace

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _max_finish_gap(a: SimResult, b: SimResult) -> float:
    gaps = [abs(x - y) for x, y in zip(a.finish_seconds, b.finish_seconds, strict=True)
            if not (math.isnan(x) and math.isnan(y))]
    return max(gaps, default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=TRACES_DIR)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--speed", type=float, default=4.0)
    ap.add_argument("--kv-blocks", type=int, default=4000)
    args = ap.parse_args()

    t0 = time.perf_counter()
    from kvtune.oracle.vllm_engine import VllmEngine, import_vllm

    import_vllm()
    print(f"vLLM import: {time.perf_counter() - t0:.1f} s wall (once per process); "
          f"load average {os.getloadavg()[0]:.1f}")
    for trace_file in (MOONCAKE_TRACE.name, AZURE_TRACE.name):
        trace = load_trace(args.data / trace_file)
        request = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class("H100"),
                              profile=profile_from_trace(trace))
        sim = simulated_plan(request, vllm_default_plan(request), "defaults")
        engine = dataclasses.replace(sim.engine, num_gpu_blocks=args.kv_blocks)
        reqs = requests_from_trace(trace, speed=args.speed, limit=args.requests)

        t = time.perf_counter()
        fast_sched = Scheduler(reqs, engine, sim.cost)
        fast = fast_sched.run()
        fast_s = time.perf_counter() - t
        t = time.perf_counter()
        exact_sched = Scheduler(reqs, engine, sim.cost, decode_runs=False)
        exact = exact_sched.run()
        exact_s = time.perf_counter() - t
        t = time.perf_counter()
        vllm = VllmEngine(reqs, engine, sim.cost)
        build_s = time.perf_counter() - t
        t = time.perf_counter()
        vllm.run()
        theirs = vllm.result()
        vllm_s = time.perf_counter() - t

        steps = exact_sched.steps
        print(f"\n{trace.name}: {len(reqs)} requests at {args.speed:g}x, {engine.num_gpu_blocks}"
              f" blocks of {engine.block_size}, {steps} engine steps, "
              f"{theirs.preemptions} preemptions, {theirs.prefix_hit_tokens} prefix-hit tokens")
        for label, secs in (("kvtune simulator (default, decode runs)", fast_s),
                            ("kvtune simulator, every step exact", exact_s),
                            ("vLLM 0.33.0 scheduler (--engine vllm)", vllm_s)):
            print(f"  {label:<42} {secs:8.3f} s  {steps / secs:>9.0f} steps/s  "
                  f"x{secs / fast_s:6.1f} the default")
        print(f"  (vLLM scheduler construction {build_s:.2f} s, not counted above)")
        print(f"  largest finish-time difference, default vs vLLM: "
              f"{_max_finish_gap(fast, theirs):.2e} s; exact vs vLLM: "
              f"{_max_finish_gap(exact, theirs):.2e} s")


if __name__ == "__main__":
    main()
