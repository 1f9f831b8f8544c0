"""Whether this tree's simulator gives the results of an earlier commit's, request by request.

A change to the simulator's hot path (``scheduler``, ``cohort``, ``blocks``, ``timing``,
``offload``) made to speed it up must not move what it predicts. This runs both on the same
requests (the earlier commit's hot path read with ``git show``, as ``simulate_bench.py`` does)
for the traces the project ships, on two GPU classes, at two loads each, under a spread of
engine settings: vLLM 0.33's defaults (async scheduling), synchronous scheduling, prefix
caching off, block size 32, a pool small enough to preempt, a small batched-token budget,
and a CPU KV tier. Per configuration it prints the largest relative difference of a
request's first-token and finish time (a fast path that takes several steps at once sums
their times in closed form, so taking them in other groups moves a time by rounding only:
up to 1e-12 counts as the same), the mean KV use and running requests (which a run samples
once for all its steps: up to 0.2 % counts as the same), and whether preemptions, prefix
hits, rejected requests, peak running requests and engine steps are equal. Exit status 1 if
any configuration differs.

    .venv/bin/python bench/simulate_identity.py --against 7b09f75
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from simulate_bench import _old_cost, _plan, _previous

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE, TRACES_DIR
from kvtune.tuner.simulator.engine import SimulatedPlan
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.scheduler import EngineConfig, Scheduler
from kvtune.tuner.simulator.workload import SimRequest, requests_from_trace
from kvtune.tuner.traces import load_trace

SAME_TIME = 1e-12
SAME_MEAN = 2e-3
# Counters that must be equal.
_COUNTS = ("preemptions", "prefix_hit_tokens", "resume_hit_tokens", "cpu_hit_tokens",
           "rejected", "peak_running")


def _variants(engine: EngineConfig, small_pool_blocks: int) -> Iterator[tuple[str, EngineConfig]]:
    rep = dataclasses.replace
    yield "defaults", engine
    yield "sync", rep(engine, async_scheduling=False)
    yield "no caching", rep(engine, enable_prefix_caching=False)
    yield "block 32", rep(engine, block_size=32, num_gpu_blocks=engine.num_gpu_blocks // 2)
    yield "small pool", rep(engine, num_gpu_blocks=small_pool_blocks)
    yield "budget 2K", rep(engine, max_num_batched_tokens=2048, max_num_seqs=64)
    yield "CPU tier", rep(engine, cpu_offload_blocks=20_000,
                          offload_load_seconds_per_block=2e-5)


def _worst_time_gap(a: SimResult, b: SimResult) -> float:
    worst = 0.0
    for xs, ys in ((a.first_token_seconds, b.first_token_seconds),
                   (a.finish_seconds, b.finish_seconds)):
        for x, y in zip(xs, ys, strict=True):
            if math.isnan(x) or math.isnan(y):
                if math.isnan(x) != math.isnan(y):
                    return math.inf  # reached in one run only
                continue
            if x != y:
                worst = max(worst, abs(x - y) / max(abs(x), abs(y)))
    return worst


def _compare(reqs: Sequence[SimRequest], sim: SimulatedPlan, before: ModuleType
             ) -> tuple[list[str], float]:
    """What differs between this tree's run and the earlier commit's (empty: the same), and
    the worst relative gap in a request's times."""
    now = Scheduler(reqs, sim.engine, sim.cost)
    ours = now.run()
    old = before.Scheduler(reqs, sim.engine, _old_cost(before, sim).cost)
    theirs = old.run()
    diffs = []
    gap = _worst_time_gap(ours, theirs)
    if gap > SAME_TIME:
        diffs.append(f"request times differ by up to {gap:.2g}")
    for name in ("mean_kv_usage", "mean_running"):
        x, y = getattr(ours, name), getattr(theirs, name)
        if abs(x - y) > SAME_MEAN * max(abs(x), abs(y)):
            diffs.append(f"{name} {x:.6g} vs {y:.6g}")
    diffs += [f"{name} {getattr(ours, name)} vs {getattr(theirs, name)}" for name in _COUNTS
              if getattr(ours, name) != getattr(theirs, name)]
    if now.steps != old.steps:
        diffs.append(f"engine steps {now.steps} vs {old.steps}")
    return diffs, gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the commit to compare with")
    ap.add_argument("--data", type=Path, default=TRACES_DIR)
    ap.add_argument("--azure-requests", type=int, default=6000,
                    help="the first this many Azure requests (the whole trace is 19,366)")
    ap.add_argument("--only", default="",
                    help="only configurations whose label holds this text, e.g. 'Mooncake H100'")
    args = ap.parse_args()
    before = _previous(args.against)
    if before is None:
        sys.exit(f"--against {args.against}: not a commit of this git checkout with the "
                 "simulator; give a commit id from `git log`")
    traces = (("Azure conv", load_trace(args.data / AZURE_TRACE.name), (1.0, 4.0), 600),
              ("Mooncake", load_trace(args.data / MOONCAKE_TRACE.name), (1.0, 0.25), 9000))
    differ = total = 0
    worst = 0.0
    for label, trace, speeds, min_pool in traces:
        for gpu in ("H100", "L40S"):
            sim = _plan(trace, gpu)
            small = max(sim.engine.num_gpu_blocks // 6, min_pool)
            for speed in speeds:
                reqs = requests_from_trace(trace, speed=speed)
                if label.startswith("Azure"):
                    reqs = reqs[:args.azure_requests]
                for variant, engine in _variants(sim.engine, small):
                    name = f"{label} {gpu} {speed:g}x {variant}"
                    if args.only not in name:
                        continue
                    t0 = time.process_time()
                    diffs, gap = _compare(reqs, dataclasses.replace(sim, engine=engine), before)
                    worst = max(worst, gap)
                    total += 1
                    differ += bool(diffs)
                    print(f"{'DIFFERS' if diffs else 'same':<8} {name}: {len(reqs)} requests "
                          f"({time.process_time() - t0:.1f} s)"
                          + (f": {'; '.join(diffs)}" if diffs else ""), flush=True)
    print(f"{total - differ} of {total} configurations give the results of {args.against} "
          f"(worst relative gap in a request's time: {worst:.2g})")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
