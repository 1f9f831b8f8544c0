"""How fast the KV-cache simulator replays traffic, against baselines measured in the same run.

Per trace, simulated requests per second of CPU time (``req/s cpu``; the goal is >= 10,000 on
every trace) and of wall time, for:

- ``now``: the simulator of this tree (decode runs and the decoding cohort);
- ``before``: the simulator of an earlier commit (``--against``, default the commit before
  the decoding cohort): its ``scheduler.py``, ``blocks.py`` and ``timing.py`` read with
  ``git show`` and run in this process on the same requests, its runs alternating with
  ``now``'s (skipped, and said so, outside a git checkout);
- ``exact``: this tree stepping every request of every step (the reference the fast path is
  tested against), on the first ``--exact-requests`` requests of the Azure trace.

Per trace it also splits a request's time between the block pool's calls (timed; the least of
``--repeat`` runs) and the rest (the scheduler's Python), against the goal's 100 us.

Traces: the Azure conversation trace (19,366 requests) at its recorded rate and at 4x, and the
Mooncake trace (3,993 multi-turn requests, long heavily shared prompts) at 1x and 0.25x with
prefix caching, under vLLM 0.33's defaults for Llama-3.1-8B on one H100; ``--trace
PATH@SPEED`` (repeatable) adds another, e.g. a held-out trace that does not ship.

With ``--offload-blocks N`` each trace also runs with a CPU KV tier of N blocks
(``--kv-offloading-size``, ``offload.py``), interleaved with the run without (``now``), and
prints the ratio of their CPU times (the goal: within 2x). Each figure is the
best of ``--repeat`` runs (the machine is shared: the load average is printed). Last, the
replay exporter (``kvtune replay``, the demo's vLLM stand-in) against the wall clock at 20x:
its worst lag behind the clock on each trace. Run:

    .venv/bin/python bench/simulate_bench.py
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE, TRACES_DIR
from kvtune.replay.exporter import Replay
from kvtune.replay.instance import InstanceConfig
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.simulator.engine import SimulatedPlan, simulated_plan, vllm_default_plan
from kvtune.tuner.simulator.scheduler import Scheduler
from kvtune.tuner.simulator.workload import SimRequest, requests_from_trace
from kvtune.tuner.traces import Trace, load_trace

REPO = Path(__file__).resolve().parents[1]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# The last commit before the decoding cohort (tuner/simulator/cohort.py).
BEFORE_COHORT = "e2902b6"


# The modules of the simulator's hot path, loaded from the earlier commit where it has them
# (the rest, from this tree: workload, metrics and prefix only describe requests and
# results), in import order.
_HOT = ("timing", "blocks", "cohort", "offload_lru", "offload", "sched_state", "sched_core",
        "sched_offload", "sched_exact", "sched_cohort", "sched_runs", "scheduler")


def _previous(rev: str) -> ModuleType | None:
    """The simulator's hot path as of ``rev`` (``_HOT``, those ``rev`` has), each a module of
    its own importing the others of ``rev``; its ``scheduler`` module, or None outside a git
    checkout."""
    mods: dict[str, ModuleType] = {}
    for stem in _HOT:
        path = f"{rev}:tuner/simulator/{stem}.py"
        try:
            if subprocess.run(["git", "cat-file", "-e", path], cwd=REPO,
                              capture_output=True).returncode != 0:
                if stem == "scheduler":
                    return None
                continue  # not there yet at ``rev``
            src = subprocess.run(["git", "show", path], cwd=REPO,
                                 capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        for other in mods:
            src = src.replace(f"from kvtune.tuner.simulator.{other} import",
                              f"from kvtune_bench_{rev}_{other} import")
            src = src.replace(f"from kvtune.tuner.simulator import {other} as",
                              f"import kvtune_bench_{rev}_{other} as")
        name = f"kvtune_bench_{rev}_{stem}"
        spec = importlib.util.spec_from_loader(name, loader=None)
        assert spec is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses and later imports look it up
        exec(compile(src, f"{rev}:tuner/simulator/{stem}.py", "exec"), mod.__dict__)
        mods[stem] = mod
    return mods["scheduler"]


def _old_cost(before: ModuleType, sim: SimulatedPlan) -> SimulatedPlan:
    """``sim`` with its step-time model as the earlier commit's class (the same numbers, as
    far as that class takes them)."""
    timing = sys.modules[before.__name__.replace("_scheduler", "_timing")]
    cost = sim.cost
    # Only the fields the earlier class has (measured ``kernels`` came later: without them
    # the earlier commit times steps by its roofline).
    names = {f.name for f in dataclasses.fields(timing.StepCostModel) if f.init}
    fields = {f.name: getattr(cost, f.name) for f in dataclasses.fields(cost)
              if f.init and f.name in names}
    return dataclasses.replace(sim, cost=timing.StepCostModel(**fields))


def _best(make: Any, reqs: Sequence[SimRequest], sim: SimulatedPlan, repeat: int
          ) -> tuple[float, float, Any]:
    best_cpu, best_wall, sched = float("inf"), float("inf"), None
    for _ in range(repeat):
        sched = make(reqs, sim.engine, sim.cost)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        sched.run()
        best_cpu = min(best_cpu, time.process_time() - cpu0)
        best_wall = min(best_wall, time.perf_counter() - wall0)
    return best_cpu, best_wall, sched


def _best_alternating(runs: Sequence[tuple[Any, SimulatedPlan]], reqs: Sequence[SimRequest],
                      repeat: int) -> list[tuple[float, float, Any]]:
    """``_best`` of each (scheduler class, plan), their runs alternating, one of each per
    round (the machine's drift and its load favour none: on a shared machine the load can
    move a figure by 2x within minutes)."""
    best: list[tuple[float, float, Any]] = [(float("inf"), float("inf"), None)] * len(runs)
    for _ in range(repeat):
        for i, (make, plan) in enumerate(runs):
            cpu, wall, sched = _best(make, reqs, plan, 1)
            best[i] = (min(best[i][0], cpu), min(best[i][1], wall), sched)
    return best


def _extra_traces(specs: Sequence[str], gpu: str
                  ) -> list[tuple[str, Trace, SimulatedPlan, float]]:
    """``--trace PATH@SPEED`` as (label, trace, plan, speed)."""
    out = []
    for spec in specs:
        path, _, speed = spec.rpartition("@")
        if not path:
            raise SystemExit(f"--trace {spec}: give PATH@SPEED, e.g. conversation.jsonl@1")
        trace = load_trace(Path(path))
        out.append((f"{Path(path).stem} {float(speed):g}x", trace, _plan(trace, gpu),
                    float(speed)))
    return out


# The block pool's operations (``blocks.BlockPool``): what a request's blocks cost, timed per
# call on one run to split the time between them and the rest (the scheduler's Python).
_POOL_CALLS = ("get_new_blocks", "cache_full_blocks", "free_request_blocks", "touch",
               "find_longest_cache_hit", "num_free_among")


def _pool_seconds(reqs: Sequence[SimRequest], sim: SimulatedPlan) -> float:
    """One run with the pool's calls timed: the seconds spent in them. (The timing wraps
    the instance's methods; the wrappers' own cost falls mostly outside the calls.)"""
    sched = Scheduler(reqs, sim.engine, sim.cost)
    spent = [0.0]

    def timed(fn: Any) -> Any:
        def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent[0] += time.perf_counter() - t0
        return call

    for name in _POOL_CALLS:
        setattr(sched.pool, name, timed(getattr(sched.pool, name)))
    sched.run()
    return spent[0]


def _line(label: str, n: int, cpu: float, wall: float, sched: Any) -> str:
    return (f"  {label:<7} {n / cpu:>8.0f} req/s cpu {n / wall:>8.0f} req/s wall  "
            f"({cpu:5.2f} s cpu; {sched.steps} engine steps in {sched.events} iterations)")


def _replay_lag(trace_path: Path, speed: float, seconds: float) -> tuple[float, int]:
    """The replay exporter's simulator against the wall clock at ``speed``x for ``seconds``:
    the worst lag behind the clock (model seconds) and the requests finished."""
    replay = Replay(InstanceConfig(), trace_path, speed=speed, engine="simulator")
    t0, worst = time.monotonic(), 0.0
    while time.monotonic() - t0 < seconds:
        replay.tick()
        worst = max(worst, replay.state().lag_model_seconds)
        time.sleep(0.05)
    return worst, replay.state().finished


def _plan(trace: Trace, gpu: str) -> SimulatedPlan:
    request = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class(gpu),
                          profile=profile_from_trace(trace))
    return simulated_plan(request, vllm_default_plan(request), "defaults")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=TRACES_DIR)
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--against", default=BEFORE_COHORT,
                    help="the commit whose simulator is the 'before' baseline")
    ap.add_argument("--exact-requests", type=int, default=1500)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--replay-speed", type=float, default=20.0)
    ap.add_argument("--replay-seconds", type=float, default=8.0)
    ap.add_argument("--trace", action="append", default=[], metavar="PATH@SPEED",
                    help="another trace to time, replayed at SPEED x its recorded rate")
    ap.add_argument("--offload-blocks", type=int, default=0,
                    help="also time each trace with a CPU KV tier of this many blocks")
    ap.add_argument("--offload-seconds-per-block", type=float, default=2e-5)
    ap.add_argument("--no-replay", action="store_true", help="skip the replay exporter's lag")
    args = ap.parse_args()

    before = _previous(args.against)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(a shared machine: wall times are noisy)")
    if before is None:
        print(f"no git checkout: the 'before' baseline ({args.against}) is skipped")
    azure = load_trace(args.data / AZURE_TRACE.name)
    mooncake = load_trace(args.data / MOONCAKE_TRACE.name)
    asim, msim = _plan(azure, args.gpu), _plan(mooncake, args.gpu)
    print(f"configuration: {MODEL} on {args.gpu}, vLLM 0.33 defaults "
          f"({' '.join(asim.plan.vllm_args())}), {asim.engine.num_gpu_blocks} blocks")
    rows: list[tuple[str, float, float | None]] = []
    for label, trace, sim, speed in (("Azure conv 1x", azure, asim, 1.0),
                                     ("Azure conv 4x", azure, asim, 4.0),
                                     ("Mooncake 1x", mooncake, msim, 1.0),
                                     ("Mooncake 0.25x", mooncake, msim, 0.25),
                                     *_extra_traces(args.trace, args.gpu)):
        reqs = requests_from_trace(trace, speed=speed)
        n = len(reqs)
        print(f"{label}: {n} requests")
        # This tree, the CPU tier (if asked) and the earlier commit, alternating.
        runs: list[tuple[Any, SimulatedPlan]] = [(Scheduler, sim)]
        if args.offload_blocks:
            runs.append((Scheduler, dataclasses.replace(
                sim, engine=dataclasses.replace(
                    sim.engine, cpu_offload_blocks=args.offload_blocks,
                    offload_load_seconds_per_block=args.offload_seconds_per_block))))
        if before is not None:
            runs.append((before.Scheduler, _old_cost(before, sim)))
        best = _best_alternating(runs, reqs, args.repeat)
        cpu, wall, sched = best[0]
        print(_line("now", n, cpu, wall, sched))
        if args.offload_blocks:
            ocpu, owall, osched = best[1]
            print(_line("offload", n, ocpu, owall, osched))
            print(f"  with the CPU tier ({args.offload_blocks} blocks): {ocpu / cpu:.2f}x "
                  "the CPU time without (the goal: within 2x)")
        old_rate = None
        if before is not None:
            bcpu, bwall, bsched = best[-1]
            print(_line("before", n, bcpu, bwall, bsched))
            old_rate = n / bcpu
        rows.append((label, n / cpu, old_rate))
        pool = min(_pool_seconds(reqs, sim) for _ in range(args.repeat))
        print(f"  where the time goes: {1e6 * cpu / n:.0f} us/request (the goal: 100), "
              f"{1e6 * pool / n:.0f} in the block pool's calls ({pool / cpu:.0%}), "
              f"{1e6 * (cpu - pool) / n:.0f} in the rest (the scheduler's Python)")

    sub = requests_from_trace(azure)[: args.exact_requests]
    print(f"Azure conv, first {len(sub)} requests:")
    cpu, wall, sched = _best(Scheduler, sub, asim, args.repeat)
    print(_line("now", len(sub), cpu, wall, sched))

    def exact(reqs: Sequence[SimRequest], engine: Any, cost: Any) -> Scheduler:
        return Scheduler(reqs, engine, cost, decode_runs=False)

    ecpu, ewall, esched = _best(exact, sub, asim, args.repeat)
    print(_line("exact", len(sub), ecpu, ewall, esched))
    print(f"  fast path over exact stepping: {ecpu / cpu:.1f}x cpu")

    print(f"\n{'trace':<16} {'req/s cpu now':>14} {'before':>10} {'ratio':>7} {'goal':>8}")
    for label, rate, old in rows:
        ratio = f"{rate / old:.2f}x" if old else "-"
        print(f"{label:<16} {rate:>14.0f} {old or 0:>10.0f} {ratio:>7} "
              f"{'met' if rate >= 10_000 else 'MISSED':>8}")

    if args.no_replay:
        return
    # `kvtune replay` (the demo's and the e2e tests' vLLM stand-in) runs the simulator
    # against the wall clock; one tick's chunk is a model second, so keeping up means a
    # worst lag under a few model seconds.
    print(f"\nreplay at {args.replay_speed:g}x for {args.replay_seconds:g} s of wall time:")
    for label, path in (("Azure conv", args.data / AZURE_TRACE.name),
                        ("Mooncake", args.data / MOONCAKE_TRACE.name)):
        worst, finished = _replay_lag(path, args.replay_speed, args.replay_seconds)
        print(f"  {label:<12} worst lag {worst:6.2f} model s, {finished} requests finished "
              f"({'keeps up' if worst < 5.0 else 'FALLS BEHIND'})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
