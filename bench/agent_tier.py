"""An agent's CPU tier sized from its session gaps against offload at the policy's budget, on
capacity per dollar (issue 27's "Done means"), on the shipped synthetic agentic trace
(``examples/traces/agentic_trace.jsonl``, ``scripts/gen_agentic_trace.py``).

The rules plan of the pool (70B fp8 on one H200 by default, TTFT 4 s / TPOT 50 ms), then the
same plan with no tier, with the tier the planner sizes from the session gaps
(``decide_offload_size.session_gap_size``) and with the tier at the budget (256 GiB per GPU),
each on its own capacity ladder over the same stream in this run. A replica's cost is its
GPU's price (``tuner/facts/prices.py``) plus the tier's host memory at ``--host-price``.

    .venv/bin/python bench/agent_tier.py [--budget-gib 256] [--host-price 0.004]
"""

from __future__ import annotations

import argparse
import time

from kvtune.e2e.traces import TRACES_DIR
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.prices import price_for
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.simulator.agent_tier import break_even_host_price, replay, session_size_gib
from kvtune.tuner.simulator.goodput_search import TrafficScorer
from kvtune.tuner.simulator.workload import requests_from_trace
from kvtune.tuner.traces import load_trace

AGENTIC_TRACE = TRACES_DIR / "agentic_trace.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="meta-llama/Llama-3.3-70B-Instruct")
    ap.add_argument("--weights", default="fp8")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--budget-gib", type=float, default=256.0, help="policy CPU budget per GPU")
    ap.add_argument("--host-price", type=float, default=0.004,
                    help="USD per GiB-hour of host memory (an assumption: kvtune ships none)")
    ap.add_argument("--requests", type=int, default=0, help="first N requests (0: all)")
    ap.add_argument("--tolerance", type=float, default=0.005)
    args = ap.parse_args()
    trace = load_trace(AGENTIC_TRACE)
    if args.requests:
        trace = type(trace)(trace.name, trace.format, trace.requests[:args.requests])
    gpu = get_gpu_class(args.gpu)
    request = PlanRequest(
        model=get_model(args.model), gpu=gpu, weights_dtype=args.weights,
        profile=profile_from_trace(trace, kind="agent"),
        policy=PlanPolicy(slo=SLO(ttft_p95_seconds=4.0, tpot_p95_seconds=0.05),
                          cpu_offload_budget_bytes=int(args.budget_gib * 2**30)))
    p = request.profile
    print(f"trace: {len(trace.requests)} calls, {p.request_rate_per_second:.2f} req/s, session "
          f"gap p50 {p.session_gap_seconds.p50 if p.session_gap_seconds else None} s / p90 "
          f"{p.session_gap_seconds.p90 if p.session_gap_seconds else None} s, prompt p50 "
          f"{p.context_tokens.p50:,} tokens")
    base = plan_pool(request).plan.with_offload(None)
    session = session_size_gib(request, base)
    price = price_for(gpu.name)
    assert price is not None and session is not None
    gpu_usd = price.usd_per_gpu_hour * request.tensor_parallel
    scorer = TrafficScorer(tuple(requests_from_trace(trace)))
    runs = []
    for label, size in (("no tier", None), ("session gaps", session),
                        ("budget", args.budget_gib)):
        cpu0 = time.process_time()
        r = replay(request, base, scorer, label, size, args.tolerance)
        runs.append(r)
        print(f"{label:13s} {r.size_gib:6.0f} GiB  capacity {r.capacity_requests_per_second:.3f} "
              f"req/s  ${r.usd_per_hour(gpu_usd, args.host_price):.3f}/h  "
              f"{r.capacity_per_usd(gpu_usd, args.host_price):.4f} req/s per $/h  "
              f"(GPU hits {r.at_observed.prefix_hit_rate:.1%}, tier hits "
              f"{r.at_observed.cpu_hit_rate:.1%}, TTFT p95 {r.at_observed.ttft_p95_seconds:.2f} s;"
              f" {time.process_time() - cpu0:.0f} CPU s)", flush=True)
    _, sized, budget = runs
    ratio = (sized.capacity_per_usd(gpu_usd, args.host_price)
             / budget.capacity_per_usd(gpu_usd, args.host_price))
    even = break_even_host_price(sized, budget, gpu_usd)
    print(f"capacity per dollar, session-gap tier / budget tier: {ratio:.4f} at "
          f"${args.host_price:g}/GiB-h host memory, GPU ${gpu_usd:g}/h ({price.source})")
    print("the session-gap tier wins at any host price above "
          + ("no price" if even is None else f"${even:.6f}/GiB-h"))


if __name__ == "__main__":
    main()
