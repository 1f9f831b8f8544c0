"""The full plan sweep: every catalog model x every GPU class x tensor parallel {1, 2, 4, 8} x
every weights dtype through ``kvtune plan``'s planner. Each case must be planned (passing
vLLM's pre-flight, with flags the pinned vLLM's own parser accepts) or refused with a reason;
a traceback or a plan vLLM would refuse is counted as a bug (exit 1). Prints the counts, the
refusals by reason, every bug, and the plans per second.

    .venv/bin/python bench/plan_sweep.py [--models N] [--show-refusals]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import sys
import time

from kvtune.e2e.plan_sweep import TENSOR_PARALLEL, WEIGHTS_DTYPES, VllmCli, run_case
from kvtune.tuner.facts.catalog import list_models
from kvtune.tuner.facts.gpus import list_gpu_classes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=None, help="only the first N catalog models")
    ap.add_argument("--show-refusals", action="store_true", help="print one refusal per reason")
    args = ap.parse_args()
    cli = VllmCli()
    models = list_models()[: args.models]
    gpus = list_gpu_classes()
    cases = list(itertools.product(models, gpus, TENSOR_PARALLEL, WEIGHTS_DTYPES))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    outcomes = [run_case(cli, *case) for case in cases]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    kinds = collections.Counter(o.kind for o in outcomes)
    print(f"{len(cases)} cases: {len(models)} models x {len(gpus)} GPU classes x TP "
          f"{list(TENSOR_PARALLEL)} x weights {list(WEIGHTS_DTYPES)}")
    print(f"planned {kinds['planned']}, refused {kinds['refused']}, bugs {kinds['bug']}")
    print(f"{wall:.1f} s wall, {cpu:.1f} s CPU: {len(cases) / wall:.0f} plans/s wall "
          f"(load average {os.getloadavg()[0]:.1f}: a shared machine, wall times are noisy)")
    reasons = collections.Counter(o.reason for o in outcomes if o.kind == "refused")
    print("refusals by reason:")
    for reason, count in reasons.most_common():
        print(f"  {count:6d}  {reason}")
        if args.show_refusals:
            example = next(o for o in outcomes if o.kind == "refused" and o.reason == reason)
            print(f"          e.g. {example.model} {example.gpu} TP{example.tensor_parallel} "
                  f"{example.weights_dtype}: {example.detail[:300]}")
    per_model = collections.Counter(o.model for o in outcomes if o.kind == "planned")
    never = [m for m in models if per_model[m] == 0]
    if never:
        print(f"models never planned anywhere: {', '.join(never)}")
    bugs = [o for o in outcomes if o.kind == "bug"]
    for o in bugs:
        print(f"BUG {o.model} {o.gpu} TP{o.tensor_parallel} {o.weights_dtype}: {o.reason}: "
              f"{o.detail[:400]}")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
