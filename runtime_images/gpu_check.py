#!/usr/bin/env python3
"""Run the runtime entrypoint's checks on a real GPU machine, without starting vLLM.

Prints what NVML reports for each visible GPU next to what the plan expects, then the
entrypoint's decision (the memory fraction it would use, the KV cache it would get, the
`vllm serve` command) or its refusal, with the same exit codes as the entrypoint.

    python runtime_images/gpu_check.py --plan plan.json      # a PoolPlan JSON (kvtune plan -o json)
    KVTUNE_PLAN="$(cat plan.json)" python runtime_images/gpu_check.py
    python runtime_images/gpu_check.py                       # a sample plan for the GPU found

Needs kvtune importable (``pip install --no-deps kvtune``) and nvidia-ml-py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from kvtune.runtime.decisions import (
    DEFAULT_CONTEXT_RESERVE_BYTES,
    PlanDoesNotFit,
    build_command,
    decide,
)
from kvtune.runtime.gpus import GIB, GpuInfo, class_of, read_gpus
from kvtune.runtime.runtime_plan import PLAN_ENV, RuntimePlan, parse_plan

EXIT_REFUSED = 3


def sample_plan(gpu: GpuInfo) -> RuntimePlan:
    """A plan like the tuner's for an 8B model in bf16 at TP 1 on the GPU found, asking for
    gpu-memory-utilization 0.92: enough to see the fraction recomputed on a busy GPU."""
    non_kv = 20 * GIB  # 16 GiB of weights + activations and CUDA graphs
    per_token = 128 * 1024  # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K,V) x 2 bytes
    kv = int(gpu.total_bytes * 0.92) - non_kv
    return RuntimePlan.model_validate({
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "gpu_class": class_of(gpu) or gpu.name,
        "tensor_parallel": 1,
        "plan": {"block_size": 16, "kv_cache_dtype": "auto", "gpu_memory_utilization": 0.92,
                 "max_model_len": 32768, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                 "enable_prefix_caching": True},
        "expected": {"kv_bytes_per_token": per_token, "kv_cache_bytes": kv,
                     "kv_cache_tokens": kv // per_token // 16 * 16,
                     "non_kv_bytes_per_gpu": non_kv},
    })


def _row(label: str, found: str, expected: str) -> str:
    return f"  {label:<22} {found:<38} {expected}"


def report(plan: RuntimePlan, gpus: list[GpuInfo], reserve_bytes: int) -> int:
    print(f"plan: {plan.model_id} on {plan.gpu_class} x {plan.tensor_parallel} "
          f"(gpu-memory-utilization {plan.plan.gpu_memory_utilization}, "
          f"max-model-len {plan.plan.max_model_len}, kv dtype {plan.plan.kv_cache_dtype})")
    for gpu in gpus:
        print(f"GPU {gpu.index}:")
        print(_row("", "NVML reports", "the plan expects"))
        print(_row("product", gpu.name, plan.gpu_class))
        print(_row("class", class_of(gpu) or "unknown", plan.gpu_class.upper()))
        print(_row("compute capability", "{}.{}".format(*gpu.compute_capability), ""))
        print(_row("total memory", f"{gpu.total_bytes / GIB:.2f} GiB", ""))
        asked = gpu.total_bytes * plan.plan.gpu_memory_utilization
        print(_row("free memory", f"{gpu.free_bytes / GIB:.2f} GiB",
                   f">= {asked / GIB:.2f} GiB + {reserve_bytes / GIB:.1f} GiB reserve"))
        print(_row("MIG", str(gpu.mig), ""))
    try:
        decision = decide(plan, gpus, context_reserve_bytes=reserve_bytes)
        command = build_command(plan, decision, [])
    except PlanDoesNotFit as refusal:
        print(f"REFUSED ({refusal.reason}): {refusal.message}")
        return EXIT_REFUSED
    print("decision:")
    print(json.dumps({**decision.to_report(), "command": command}, indent=2))
    return 0


def main(argv: list[str] | None = None, nvml: Any | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--plan", type=Path, help="a PoolPlan JSON file (default: $KVTUNE_PLAN, "
                        "else a sample plan for the GPU found)")
    parser.add_argument("--reserve-bytes", type=int, default=DEFAULT_CONTEXT_RESERVE_BYTES,
                        help="memory kept back for the CUDA context (default 1 GiB)")
    args = parser.parse_args(argv)
    gpus = read_gpus(nvml)
    if not gpus:
        print("NVML reports no visible GPU", file=sys.stderr)
        return EXIT_REFUSED
    if args.plan is not None:
        plan = parse_plan(args.plan.read_text())
    elif os.environ.get(PLAN_ENV):
        plan = parse_plan(os.environ[PLAN_ENV])
    else:
        plan = sample_plan(gpus[0])
    return report(plan, gpus, args.reserve_bytes)


if __name__ == "__main__":
    sys.exit(main())
