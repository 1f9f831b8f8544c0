"""The operator's CPU and memory for planning N searched pools: in-process vs search Jobs
(issue 22 item 4; docs/search-jobs.md).

    .venv/bin/python bench/search_jobs_rss.py [--pools 1 4 16] [--cpu-seconds 5]

Each (mode, N) runs in its own process, which plays the operator's plan stage for N pools of
the sample chat spec (each pool its own arrival rate, so no search is a cache hit):

- *inProcess*: ``plan_one_pool`` for each pool, the goodput search in the process, under the
  operator's budget (``--cpu-seconds`` per search, as the chart's ``search.cpuSeconds``);
- *job*: what the operator does instead with ``search.mode: job``: the search document, its
  digest, the input ConfigMap and the Job for each pool (the API calls themselves are left
  out: a handful of small requests per pool, the same in both modes' reconciles), and then
  prices and reads back one answer per pool as a finished Job leaves it (its termination
  message), which is what the operator holds when it plans from the Job.

Prints per run the CPU seconds and the peak resident set (``ru_maxrss``) and the growth over
the process's baseline after imports (what the searches added).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(mode: str, pools: int, cpu_seconds: float) -> dict[str, float]:
    sys.path.insert(0, os.path.join(REPO, "tests"))
    import copy

    from op_samples import SAMPLE_SPEC

    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.api.workloads import declared_profile
    from kvtune.operator.rollout import plan as plan_stage
    from kvtune.operator.search import search_budget, search_job_flow, search_jobs
    from kvtune.tuner.simulator import search_job

    search_budget.CONFIG.cpu_seconds = cpu_seconds
    spec_d = copy.deepcopy(SAMPLE_SPEC)
    spec_d["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    spec = InferenceDeploymentSpec.model_validate(spec_d)
    model = plan_stage.resolve_model(spec, "bench", None)
    policy = plan_stage.policy_for(spec)
    pool = spec.pools[0]
    # One small answer made once, outside the measurement, for the job mode's read-back.
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    settings = search_jobs.JobSettings(mode="job", image="kvtune:bench")
    for i in range(pools):
        profile = declared_profile(spec.workload).model_copy(
            update={"request_rate_per_second": 2.0 + 0.25 * i})
        if mode == "inProcess":
            plan_stage.plan_one_pool(spec, pool, model, profile, policy)
            continue
        request = plan_stage.plan_request(spec, pool, model, profile, policy)
        doc = search_job_flow.search_input(request, None, 1)
        name = search_jobs.resource_name("chat", f"pool{i}", doc.digest())
        labels = search_jobs.labels("chat", f"pool{i}", doc.digest())
        json.dumps([search_jobs.input_config_map(name=name, namespace="bench", doc=doc,
                                                 labels=labels),
                    search_jobs.render_job(name=name, namespace="bench", doc=doc, s=settings,
                                           labels=labels)])
        answer = search_job.SearchOutcome(digest=doc.digest(), plan=plan_stage._plan_by_rules(
            request))
        got = search_job.decode(search_job.encode(answer))
        assert got is not None and got.plan is not None
    cpu = time.process_time() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"cpu_seconds": cpu, "peak_rss_mib": peak / 1024, "grown_mib": (peak - base_rss) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--cpu-seconds", type=float, default=5.0)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "POOLS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]), args.cpu_seconds)))
        return
    print(f"{'mode':>10} {'pools':>5} {'CPU s':>7} {'peak RSS MiB':>13} {'grown MiB':>10}")
    for pools in args.pools:
        for mode in ("inProcess", "job"):
            out = subprocess.run([sys.executable, __file__, "--child", mode, str(pools),
                                  "--cpu-seconds", str(args.cpu_seconds)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{mode:>10} {pools:>5} {r['cpu_seconds']:>7.1f} {r['peak_rss_mib']:>13.0f} "
                  f"{r['grown_mib']:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
