"""How long `plan_pool` takes: one pool, and a fleet of 1,000 (model, GPU, profile)
combinations. Target: under 5 ms per pool on the development machine.

The baseline, measured in the same run on the same combinations, is the bare memory
arithmetic every planner must do (weights per GPU, KV bytes per token, blocks that fit), so
the planner's own cost (candidates, reasons, pre-flight) reads as the difference.

    .venv/bin/python bench/plan_bench.py [--fleet 1000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import time
from collections.abc import Callable

from kvtune.tuner.errors import KVTuneError
from kvtune.tuner.facts.catalog import get_model, list_models
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token
from kvtune.tuner.facts.weights import weights_bytes_per_gpu
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import PlanPolicy
from kvtune.tuner.planner.presets import PRESET_KINDS, preset_profile

GPUS = ("H100", "H100-NVL", "H200", "B200")


def fleet(size: int, seed: int = 7) -> list[PlanRequest]:
    rng = random.Random(seed)
    combos = []
    for model_id, gpu, kind, tp in itertools.product(list_models(), GPUS, PRESET_KINDS,
                                                      (1, 2, 4, 8)):
        model = get_model(model_id)
        if model.num_attention_heads % tp:
            continue
        combos.append((model, get_gpu_class(gpu), kind, tp))
    rng.shuffle(combos)
    out = []
    for model, gpu, kind, tp in itertools.islice(itertools.cycle(combos), size):
        ctx = rng.choice([None, 2048, 8192, 32768])
        floor = rng.choice(["bf16", "fp8", "int4"])
        out.append(PlanRequest(
            model=model, gpu=gpu, tensor_parallel=tp, weights_dtype=rng.choice(["auto", "fp8"]),
            profile=preset_profile(kind, ctx), policy=PlanPolicy(lowest_kv_precision=floor),
        ))
    return out


def baseline(request: PlanRequest) -> int:
    weights = weights_bytes_per_gpu(request.model, request.weights_dtype,
                                    request.tensor_parallel)
    per_token = kv_bytes_per_token(request.model, "auto", request.tensor_parallel)
    free = int(request.gpu.cuda_total_bytes * 0.92) - weights
    return max(0, free) // (16 * per_token)


def planner(request: PlanRequest) -> int:
    try:
        return plan_pool(request).expected.num_gpu_blocks
    except KVTuneError:
        return 0  # a combination that does not fit is still a planned (refused) pool


def timed(fn: Callable[[PlanRequest], int], requests: list[PlanRequest]) -> list[float]:
    times = []
    for r in requests:
        t0 = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - t0)
    return times


def cpu_seconds(fn: Callable[[PlanRequest], int], requests: list[PlanRequest]) -> float:
    """CPU time of the whole loop: robust to other processes sharing the cores, which
    inflate wall-clock times (the 2-core development machine is shared)."""
    t0 = time.process_time()
    for r in requests:
        fn(r)
    return time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fleet", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()

    one = PlanRequest(
        model=get_model("meta-llama/Llama-3.3-70B-Instruct"), gpu=get_gpu_class("H200"),
        weights_dtype="fp8", profile=preset_profile("chat"),
    )
    plan_pool(one)  # warm caches (catalog, capability data)
    single = timed(planner, [one] * args.repeat)
    single_base = timed(baseline, [one] * args.repeat)
    print(f"one pool (Llama 3.3 70B fp8, H200, chat), {args.repeat} runs:")
    print(f"  planner   median {statistics.median(single) * 1e3:7.3f} ms  "
          f"p95 {sorted(single)[int(0.95 * len(single))] * 1e3:7.3f} ms")
    print(f"  baseline  median {statistics.median(single_base) * 1e3:7.3f} ms  (memory arithmetic "
          "only)")

    requests = fleet(args.fleet)
    refused = sum(1 for r in requests if planner(r) == 0)
    t0 = time.perf_counter()
    times = timed(planner, requests)
    total = time.perf_counter() - t0
    base = timed(baseline, requests)
    cpu = cpu_seconds(planner, requests)
    cpu_base = cpu_seconds(baseline, requests)
    print(f"fleet of {len(requests)} (model, GPU, TP, profile, floor) combinations "
          f"({refused} refused: nothing fits):")
    print(f"  planner   total {total:7.3f} s  mean {statistics.mean(times) * 1e3:7.3f} ms  "
          f"p95 {sorted(times)[int(0.95 * len(times))] * 1e3:7.3f} ms  "
          f"max {max(times) * 1e3:7.3f} ms")
    print(f"  baseline  total {sum(base):7.3f} s  mean {statistics.mean(base) * 1e3:7.3f} ms")
    per_pool_cpu = cpu / len(requests)
    print(f"  CPU time per pool: planner {per_pool_cpu * 1e3:.3f} ms, baseline "
          f"{cpu_base / len(requests) * 1e3:.4f} ms ({os.getloadavg()[0]:.1f} load average)")
    verdict = "meets" if statistics.mean(times) < 0.005 else "MISSES"
    print(f"target < 5 ms per pool: {verdict} ({statistics.mean(times) * 1e3:.3f} ms mean wall, "
          f"{per_pool_cpu * 1e3:.3f} ms CPU)")


if __name__ == "__main__":
    main()
