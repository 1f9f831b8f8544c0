"""The capacity search's budget on the cases that used to run away (issue 22 item 3).

    .venv/bin/python bench/search_budget.py [--timeout-seconds 60] [--kill-above-mib 2048]

Each case runs twice, each run in its own process: *bounded* (kvtune now: the closed-form SLO
bound, the stream-size cap, the default ``SearchBudget``) and *unbounded* (the same code with
the bound off, the warm-up cap lifted and no budget: the search as it was). A run's time is
its wall clock and CPU; its peak memory is its resident set, polled every 50 ms from
``/proc/<pid>/status``. The unbounded baseline is itself bounded so the bench ends: it is
killed after ``--timeout-seconds`` or once it passes ``--kill-above-mib`` (then its figures
are lower bounds, marked ``>=``). Prints one line per run and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

CASES = {
    # The operator's case: an admitted spec with ttftP95 1ms and 5,000 requests/s.
    "ttft-1ms-5000rps": {"rate": 5000.0, "ttft": 0.001, "tpot": 0.05},
    "rate-1e5": {"rate": 1e5, "ttft": None, "tpot": None},  # kvtune plan --request-rate 1e5
    "rate-1e9": {"rate": 1e9, "ttft": None, "tpot": None},  # kvtune plan --request-rate 1e9
}

CHILD = r"""
import json, sys
case, unbounded = json.loads(sys.argv[1]), sys.argv[2] == "1"
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner import search_budget
from kvtune.tuner.simulator import goodput_search, profile_traffic, slo_bound
budget = None
if unbounded:
    profile_traffic.MAX_WARMUP_REQUESTS_PER_REQUEST = 10**15
    slo_bound.slo_unreachable = lambda *a: None
    budget = search_budget.UNBOUNDED
profile = preset_profile("chat").model_copy(update={"request_rate_per_second": case["rate"]})
request = PlanRequest(model=get_model("meta-llama/Llama-3.1-8B-Instruct"),
                      gpu=get_gpu_class("H100"), profile=profile,
                      policy=PlanPolicy(slo=SLO(ttft_p95_seconds=case["ttft"],
                                                tpot_p95_seconds=case["tpot"])))
try:
    pool = goodput_search.plan_by_goodput(request, budget=budget)
    s = pool.search
    out = ("SLOUnreachable" if pool.slo_unreachable is not None else
           f"stopped by budget: {s.stopped_by}" if s is not None and s.stopped_by else
           "searched" if s is not None else "rules")
except Exception as exc:  # the bench reports it; the product turns it into a condition
    out = f"{type(exc).__name__}: {str(exc)[:80]}"
print("RESULT " + out)
"""


@dataclass
class Run:
    wall_seconds: float
    cpu_seconds: float
    peak_rss_mib: float
    killed: str  # "" or why the bench killed it
    result: str


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run(case: dict[str, float | None], unbounded: bool, timeout_s: float,
        kill_mib: float) -> Run:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(case),
                             "1" if unbounded else "0"], stdout=subprocess.PIPE, text=True)
    peak, cpu, killed = 0.0, 0.0, ""
    while proc.poll() is None:
        peak, cpu = max(peak, _rss_mib(proc.pid)), max(cpu, _cpu_seconds(proc.pid))
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s or peak > kill_mib:
            killed = (f"killed after {timeout_s:g} s" if elapsed > timeout_s
                      else f"killed above {kill_mib:g} MiB")
            proc.kill()
            break
        time.sleep(0.05)
    out, _ = proc.communicate()
    result = next((line[7:] for line in out.splitlines() if line.startswith("RESULT ")),
                  killed or "no result")
    return Run(time.monotonic() - t0, cpu, peak, killed, result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-seconds", type=float, default=60.0)
    ap.add_argument("--kill-above-mib", type=float, default=2048.0)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    print("case                 run        wall s     CPU s  peak RSS MiB  result")
    for name in args.cases.split(","):
        runs = {}
        for label, unbounded in (("bounded", False), ("unbounded", True)):
            r = run(CASES[name], unbounded, args.timeout_seconds, args.kill_above_mib)
            runs[label] = r
            mark = ">=" if r.killed else "  "
            print(f"{name:20} {label:9} {mark}{r.wall_seconds:7.1f} {mark}{r.cpu_seconds:6.1f} "
                  f"{mark}{r.peak_rss_mib:10.0f}  {r.result}", flush=True)
        b, u = runs["bounded"], runs["unbounded"]
        rss = u.peak_rss_mib / max(b.peak_rss_mib, 1)
        if u.killed:
            # Killed early: its wall time says when the bench gave up, not when it would end.
            verdict = f"unbounded {u.killed}; peak RSS >= {rss:.1f}x the bounded run's"
        elif u.result.startswith(("searched", "SLOUnreachable", "stopped")):
            verdict = (f"wall {u.wall_seconds / b.wall_seconds:.1f}x, CPU "
                       f"{u.cpu_seconds / max(b.cpu_seconds, 0.01):.1f}x, peak RSS {rss:.1f}x")
        else:
            verdict = f"unbounded failed ({u.result.split(':')[0]}); bounded: {b.result}"
        print(f"{name:20} unbounded vs bounded: {verdict}", flush=True)


if __name__ == "__main__":
    main()
