"""The simulator's headline figures on the real traces (printed as Markdown tables for the
docs/simulator.md):

1. Azure conversation trace: concurrent requests admitted by paged allocation vs
   contiguous allocation (each request reserves max-model-len) at *equal KV memory*, in a
   regime where both are memory-bound (a small KV cache and the trace replayed faster, so
   a queue is always waiting), for several max-model-len values.
2. Mooncake trace: prefix caching's gain against no prefix caching, and the hit rate as
   the KV cache grows (the trace's ideal hit rate with an unbounded cache for reference),
   and per block size.

Llama-3.1-8B-Instruct on one H100 (BF16 weights; the KV dtype as stated per table); step
times from the roofline model in ``tuner/simulator/timing.py``. Run:

    .venv/bin/python bench/simulate_figures.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE, TRACES_DIR
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.simulator.engine import step_cost_for
from kvtune.tuner.simulator.scheduler import EngineConfig, simulate
from kvtune.tuner.simulator.workload import ideal_prefix_hit_rate, requests_from_trace
from kvtune.tuner.traces import load_trace

DATA = TRACES_DIR  # the traces shipped in examples/traces
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def azure_paged_vs_contiguous(data: Path, speed: float, kv_tokens: int) -> None:
    trace = load_trace(data / AZURE_TRACE.name)
    request = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class("H100"),
                          profile=profile_from_trace(trace))
    cost = step_cost_for(request, "auto")
    reqs = requests_from_trace(trace, speed=speed)
    print(f"\n### Azure conversation trace: paged vs contiguous at equal KV memory\n\n"
          f"{len(reqs)} requests replayed at {speed:g}x, KV cache {kv_tokens:,} tokens "
          f"({kv_tokens * cost.kv_bytes_per_token / 2**30:.1f} GiB of BF16 KV) for both, "
          "block 16, max-num-seqs 1024, max-num-batched-tokens 8192, no prefix caching.\n")
    print("| max-model-len | allocation | mean running | peak running | paged / contiguous "
          "(mean) | TTFT p95 s | req/s | preemptions | rejected | fragmentation |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for max_model_len in (4096, 8192, 16384):
        rows = {}
        for allocation in ("paged", "contiguous"):
            cfg = EngineConfig(
                num_gpu_blocks=kv_tokens // 16 + 1, block_size=16, max_num_seqs=1024,
                max_num_batched_tokens=8192, max_model_len=max_model_len,
                enable_prefix_caching=False, allocation=allocation,  # type: ignore[arg-type]
            )
            rows[allocation] = simulate(reqs, cfg, cost, name=allocation).summary()
        ratio = (rows["paged"]["mean_concurrent_sequences"]
                 / rows["contiguous"]["mean_concurrent_sequences"])
        for allocation, s in rows.items():
            print(f"| {max_model_len} | {allocation} | {s['mean_concurrent_sequences']:.1f} | "
                  f"{s['peak_concurrent_sequences']} | "
                  f"{f'{ratio:.2f}x' if allocation == 'paged' else ''} | "
                  f"{s['ttft_p95_seconds']:.1f} | {s['throughput_requests_per_second']:.2f} | "
                  f"{s['preemptions']} | {s['rejected']} | {s['fragmentation_fraction']:.1%} |")


def mooncake_prefix_caching(data: Path, speed: float) -> None:
    trace = load_trace(data / MOONCAKE_TRACE.name)
    request = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class("H100"),
                          profile=profile_from_trace(trace))
    cost = step_cost_for(request, "fp8")
    reqs = requests_from_trace(trace, speed=speed)
    served = [r for r in reqs if r.prompt_tokens < 131072]
    print(f"\n### Mooncake trace: prefix caching vs none\n\n{len(reqs)} requests replayed at "
          f"{speed:g}x, FP8 KV, max-num-seqs 256, max-num-batched-tokens 8192, max-model-len "
          f"131072. Ideal hit rate (a cache that never evicts, block 16, the requests that fit "
          f"max-model-len): {ideal_prefix_hit_rate(served, 16):.1%}.\n")
    print("| KV cache tokens | block | prefix caching | hit rate | TTFT p50 s | TTFT p95 s | "
          "TPOT p95 ms | req/s | peak running | preemptions |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    cases = [(950_000, 16, False), (950_000, 16, True), (950_000, 64, True),
             (950_000, 256, True), (2_000_000, 16, True), (4_000_000, 16, True),
             (8_000_000, 16, True)]
    for kv_tokens, bs, caching in cases:
        cfg = EngineConfig(
            num_gpu_blocks=kv_tokens // bs + 1, block_size=bs, max_num_seqs=256,
            max_num_batched_tokens=8192, max_model_len=131072, enable_prefix_caching=caching,
        )
        s = simulate(reqs, cfg, cost).summary()
        print(f"| {kv_tokens:,} | {bs} | {'on' if caching else 'off'} | "
              f"{s['prefix_hit_rate']:.1%} | {s['ttft_p50_seconds']:.2f} | "
              f"{s['ttft_p95_seconds']:.2f} | {s['tpot_p95_seconds'] * 1000:.0f} | "
              f"{s['throughput_requests_per_second']:.3f} | {s['peak_concurrent_sequences']} | "
              f"{s['preemptions']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--azure-speed", type=float, default=4.0)
    ap.add_argument("--azure-kv-tokens", type=int, default=65_536)
    ap.add_argument("--mooncake-speed", type=float, default=0.25)
    args = ap.parse_args()
    t0 = time.perf_counter()
    azure_paged_vs_contiguous(args.data, args.azure_speed, args.azure_kv_tokens)
    mooncake_prefix_caching(args.data, args.mooncake_speed)
    print(f"\n(all runs: {time.perf_counter() - t0:.0f} s wall)")


if __name__ == "__main__":
    main()
