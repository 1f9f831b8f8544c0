"""Which KV tier beyond the GPU pays, and how many GiB of it (issue 27 item 1): vLLM's native
CPU tier and LMCache's CPU, local-disk and remote tiers, each replayed over its own link
(``tuner/facts/kv_tiers.py``) on the plan the capacity search chose without a tier.

Mooncake at 0.5x by default (bench/offload_size.py's setting: 8B on an H100, the first 800
requests); each row is a capacity ladder to 0.5 % at the SLO, with the hit rates at the
trace's own rate.

    .venv/bin/python bench/kv_tiers.py [--speed 0.5] [--requests 800]
"""

from __future__ import annotations

import argparse
import time

from offload_size import capacity, mooncake_slice

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan_tier import KVTier
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.planner.search_budget import UNBOUNDED
from kvtune.tuner.simulator.goodput_search import TrafficScorer, plan_by_goodput
from kvtune.tuner.simulator.workload import requests_from_trace

REMOTE = "lm://lmcache-server:65432"


def _rows(native_gib: float) -> list[tuple[str, float | None, KVTier | None]]:
    """(label, native GiB, LMCache tier) for each tier weighed."""
    big = (256.0, 1024.0, 4096.0)
    return [
        ("off", None, None),
        (f"native-cpu {native_gib:g} GiB", native_gib, None),
        (f"lmcache-cpu {native_gib:g} GiB", None, KVTier(kind="lmcache-cpu",
                                                          size_gib=native_gib)),
        *((f"lmcache-disk {g:g} GiB", None, KVTier(kind="lmcache-disk", size_gib=g,
                                                   buffer_gib=5.0)) for g in big),
        *((f"lmcache-remote {g:g} GiB", None, KVTier(kind="lmcache-remote", size_gib=g,
                                                     buffer_gib=5.0, remote_url=REMOTE))
          for g in big),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-gib", type=float, default=64.0, help="native/LMCache CPU tier GiB")
    ap.add_argument("--speed", type=float, default=0.5)
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct")
    ap.add_argument("--gpu", default="H100")
    args = ap.parse_args()
    trace = mooncake_slice(args.speed, args.requests)
    request = PlanRequest(
        model=get_model(args.model), gpu=get_gpu_class(args.gpu),
        profile=profile_from_trace(trace),
        policy=PlanPolicy(slo=SLO(ttft_p95_seconds=5.0, tpot_p95_seconds=0.05)))
    pool = plan_by_goodput(request, trace=trace, budget=UNBOUNDED)
    base = pool.plan.with_offload(None)
    print("plan without a tier:", " ".join(pool.vllm_args()))
    stream = tuple(requests_from_trace(trace))
    for label, native, tier in _rows(args.cpu_gib):
        cpu0 = time.process_time()
        scorer = TrafficScorer(stream, tier=tier)
        cap, at = capacity(scorer, request, base.with_offload(native))
        print(f"{label:26s} capacity at SLO {cap:6.3f} req/s; at the trace's rate: GPU hits "
              f"{at.prefix_hit_rate:5.1%}, tier hits {at.cpu_hit_rate:5.1%}, TTFT p95 "
              f"{at.ttft_p95_seconds:.2f} s ({time.process_time() - cpu0:.0f} CPU s)",
              flush=True)


if __name__ == "__main__":
    main()
