"""The simulator's speed as Python and compiled by mypyc (``kvtune compile-simulator``).

Per trace, simulated requests per second of CPU time (the goal: >= 10,000 on every trace) for
the scheduler run from this tree's Python sources and for the same sources compiled by mypyc
(built once and cached by the sources' digest), under vLLM 0.33's defaults for Llama-3.1-8B on
one H100. Each figure is the best of ``--repeat`` runs; the two builds' runs alternate, each in
a process of its own (so one's import of numba, its compiled loops or the compiled modules does
not weigh on the other), and each run's requests are checked equal across the two builds:
the first-token and finish time of every request, to the last bit.

With ``--image`` the two builds are the operator image's, as it ships (``kvtune.e2e.images``
builds it here, cached): the compiled one run as the chart runs it (user 65532, read-only
root), the Python one in the same image after ``kvtune compile-simulator --remove``. Run:

    .venv/bin/python bench/simulate_mypyc_bench.py [--image] [--trace PATH@SPEED ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _child(path: Path, speed: float) -> None:
    """One timed run, printed as JSON (runs in the process the parent starts)."""
    from simulate_bench import _plan  # this folder is the child's sys.path[0]

    from kvtune.tuner.simulator.compiled import is_mypyc_compiled
    from kvtune.tuner.simulator.scheduler import Scheduler
    from kvtune.tuner.simulator.workload import requests_from_trace
    from kvtune.tuner.traces import load_trace

    trace = load_trace(path)
    sim = _plan(trace, "H100")
    reqs = requests_from_trace(trace, speed=speed)
    Scheduler(reqs[:200], sim.engine, sim.cost).run()  # numba's loops loaded, not timed
    sched = Scheduler(reqs, sim.engine, sim.cost)
    cpu0 = time.process_time()
    result = sched.run()
    cpu = time.process_time() - cpu0
    times = json.dumps([result.first_token_seconds, result.finish_seconds]).encode()
    print(json.dumps({"compiled": is_mypyc_compiled(), "requests": len(reqs), "cpu": cpu,
                      "digest": hashlib.sha256(times).hexdigest()}))


def _run(path: Path, speed: float, site: Path | None, env_with_site: Any
         ) -> dict[str, object]:
    env = None if site is None else env_with_site(site)
    done = subprocess.run([sys.executable, __file__, "--child", f"{path}@{speed}"], env=env,
                          cwd=site or REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"simulate_mypyc_bench: a run failed:\n{done.stderr[-2000:]}")
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _image_runner() -> tuple[str, Any]:
    """What ``--image`` runs: a child in the operator image, compiled or not."""
    from kvtune.e2e.images import ensure_images, run_argv

    built = ensure_images(REPO)

    def run(path: Path, speed: float, compiled: bool) -> dict[str, object]:
        child = f"python3 /bench/{Path(__file__).name} --child /traces/{path.name}@{speed}"
        if not compiled:
            child = f"kvtune compile-simulator --remove >/dev/null && {child}"
        argv = run_argv(built.store, built.operator, ["-c", child], entrypoint="sh",
                        read_only=compiled, user=None if compiled else "0",
                        volumes=[f"{REPO / 'bench'}:/bench:ro", f"{path.parent}:/traces:ro"])
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"simulate_mypyc_bench: a run in the image failed:\n"
                             f"{done.stderr[-2000:]}")
        out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return out

    return f"the operator image {built.operator}", run


def _checkout_runner() -> tuple[str, Any]:
    """The default: this tree's Python against its compiled build (cached by digest)."""
    spec = importlib.util.spec_from_file_location(
        "compile_simulator", REPO / "scripts" / "compile_simulator.py")
    assert spec is not None and spec.loader is not None
    compile_simulator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compile_simulator)
    site = compile_simulator.compiled_checkout(REPO)

    def run(path: Path, speed: float, compiled: bool) -> dict[str, object]:
        return _run(path, speed, site if compiled else None, compile_simulator.env_with_site)

    return f"the checkout, compiled into {site}", run


def main() -> None:
    from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", default=[], metavar="PATH@SPEED",
                    help="another trace to time, replayed at SPEED x its recorded rate")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--image", action="store_true",
                    help="time the operator image's two builds instead of the checkout's")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        path, _, speed = args.child.rpartition("@")
        _child(Path(path), float(speed))
        return
    start = time.monotonic()
    where, run = _image_runner() if args.image else _checkout_runner()
    print(f"builds: {where} ({time.monotonic() - start:.0f} s; cached)")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    traces = [(AZURE_TRACE, 1.0), (AZURE_TRACE, 4.0), (MOONCAKE_TRACE, 1.0),
              (MOONCAKE_TRACE, 0.25)]
    for spec_text in args.trace:
        path_text, _, speed_text = spec_text.rpartition("@")
        if not path_text:
            raise SystemExit(f"--trace {spec_text}: give PATH@SPEED, e.g. conversation.jsonl@1")
        traces.append((Path(path_text), float(speed_text)))
    print(f"\n{'trace':<28} {'requests':>8} {'python':>9} {'compiled':>9} {'ratio':>6} "
          f"{'same':>5} {'goal':>7}")
    for path, speed in traces:
        best = {False: float("inf"), True: float("inf")}
        digests: set[str] = set()
        n = 0
        for _ in range(args.repeat):
            for compiled in (False, True):
                out = run(path, speed, compiled)
                assert out["compiled"] is compiled, out
                best[compiled] = min(best[compiled], float(str(out["cpu"])))
                digests.add(str(out["digest"]))
                n = int(str(out["requests"]))
        py, cc = n / best[False], n / best[True]
        label = f"{path.stem[:22]} {speed:g}x"
        print(f"{label:<28} {n:>8} {py:>9.0f} {cc:>9.0f} {cc / py:>5.2f}x "
              f"{'yes' if len(digests) == 1 else 'NO':>5} {'met' if cc >= 10_000 else 'MISSED':>7}")
    print(f"load average after: {os.getloadavg()[0]:.2f} (req/s of CPU time, best of "
          f"{args.repeat}; 'same': every request's times equal in every run)")


if __name__ == "__main__":
    main()
