"""The CPU tier sized from observed reuse against the tier at the policy's budget.

Plans the Mooncake trace (bench/oracle.py's offload setting by default: 8B on an H100, the
first 800 requests at 0.5x, 256 GiB of CPU per GPU) with the capacity search run to the end
(no budget), then measures the capacity at SLO of the searched plan with its chosen tier, with
the tier at the budget, and with none, each on its own ladder to 0.5 %, and prints what
prefix reuse saves.

    .venv/bin/python bench/offload_size.py [--cpu-gib 256] [--speed 0.5]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from kvtune.e2e.traces import MOONCAKE_TRACE
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.prices import price_for
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.capacity import GoodputScore
from kvtune.tuner.planner.cost import priced
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.planner.search_budget import UNBOUNDED
from kvtune.tuner.simulator import search_job, tier_choice
from kvtune.tuner.simulator.goodput_search import TrafficScorer, plan_by_goodput
from kvtune.tuner.simulator.workload import requests_from_trace
from kvtune.tuner.traces import Trace, load_trace

TOLERANCE = 0.005


def capacity(scorer: TrafficScorer, request: PlanRequest, plan: KVPlan
             ) -> tuple[float, GoodputScore]:
    """The plan's capacity at SLO (req/s per replica, to TOLERANCE) and its score at the
    trace's own rate (remembered from the climb, not replayed again). bench/kv_tiers.py
    uses it too."""
    return tier_choice.capacity_at_slo(request, plan, scorer, TOLERANCE)


def mooncake_slice(speed: float, requests: int) -> Trace:
    """The shipped Mooncake trace's first ``requests`` requests, arriving at ``speed`` x its
    recorded rate."""
    full = load_trace(MOONCAKE_TRACE)
    reqs = tuple(dataclasses.replace(r, arrival_seconds=r.arrival_seconds / speed)
                 for r in full.requests[:requests])
    return dataclasses.replace(full, requests=reqs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-gib", type=int, default=256, help="policy CPU budget per GPU")
    ap.add_argument("--speed", type=float, default=0.5)
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--save", help="write the searched plan's JSON here")
    args = ap.parse_args()
    trace = mooncake_slice(args.speed, args.requests)
    gpu = get_gpu_class(args.gpu)
    request = PlanRequest(
        model=get_model(args.model), gpu=gpu, profile=profile_from_trace(trace),
        policy=PlanPolicy(slo=SLO(ttft_p95_seconds=5.0, tpot_p95_seconds=0.05),
                          cpu_offload_budget_bytes=args.cpu_gib * 2**30))
    p = request.profile
    print(f"reuse: gap {p.prefix_reuse_gap_seconds}; distance {p.prefix_reuse_distance_tokens}; "
          f"session gap {p.session_gap_seconds}")
    cpu0 = time.process_time()
    pool = priced(plan_by_goodput(request, trace=trace, budget=UNBOUNDED),
                  price_for(gpu.name))
    print(f"search CPU {time.process_time() - cpu0:.1f} s")
    assert pool.search is not None
    reuse = pool.search.reuse
    chosen = pool.plan.kv_offloading_size_gib
    print("plan:", " ".join(pool.vllm_args()))
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            f.write(pool.model_dump_json())
    message = search_job.encode(search_job.SearchOutcome(digest="0" * 64, plan=pool))
    back = search_job.decode(message)
    fits = back is not None and back.plan is not None
    print(f"search Job answer: {len(message.encode())} bytes (limit "
          f"{search_job.TERMINATION_MESSAGE_MAX_BYTES}); {'fits' if fits else 'TOO LARGE'}")
    for r in pool.reasons:
        if r.knob == "kv-offloading-size":
            print("reason:", r.message)
    scorer = TrafficScorer(tuple(requests_from_trace(trace)))
    budget = float(args.cpu_gib)
    for label, size in (("chosen", chosen), ("budget", budget), ("off", None)):
        cap, _ = capacity(scorer, request, pool.plan.with_offload(size))
        print(f"{label}: {size or 0:g} GiB, capacity at SLO {cap:.3f} req/s per replica")
    if reuse is not None:
        print(f"hit rates: GPU {reuse.gpu_prefix_hit_rate:.1%}, CPU {reuse.cpu_prefix_hit_rate:.1%}"
              f"; saves {reuse.prefill_gpu_seconds_saved_per_day:,.0f} prefill GPU-s/day, "
              f"${reuse.usd_saved_per_day or 0:,.2f}/day ({reuse.gpu_price_source})")


if __name__ == "__main__":
    main()
