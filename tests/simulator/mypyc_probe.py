"""Run the simulator on slices of the shipped traces and print every result as JSON.

``tests/simulator/test_sim_mypyc.py`` runs this twice, once on the Python sources and once on
the mypyc-compiled scheduler (``scripts/compile_simulator.py``), and holds the two outputs
equal; ``tests/runtime/test_images_run.py`` runs it in the operator image, whose simulator
``kvtune compile-simulator`` compiled. Run as a script: ``python mypyc_probe.py TRACES_DIR``
(the checkout's examples/traces: a wheel does not ship them).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.simulator import disaggregated, stepwise  # noqa: F401  (their classes load)
from kvtune.tuner.simulator.compiled import is_mypyc_compiled
from kvtune.tuner.simulator.engine import simulated_plan, vllm_default_plan
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.sched_state import EngineConfig
from kvtune.tuner.simulator.scheduler import simulate
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import requests_from_trace
from kvtune.tuner.traces import Trace, load_trace

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _variants(engine: EngineConfig) -> Iterator[tuple[str, EngineConfig]]:
    rep = dataclasses.replace
    yield "defaults", engine
    yield "sync", rep(engine, async_scheduling=False)
    yield "no caching", rep(engine, enable_prefix_caching=False)
    yield "block 32", rep(engine, block_size=32, num_gpu_blocks=engine.num_gpu_blocks // 2)
    yield "small pool", rep(engine, num_gpu_blocks=600)
    yield "budget 512", rep(engine, max_num_batched_tokens=512, max_num_seqs=64)
    yield "CPU tier", rep(engine, cpu_offload_blocks=5_000, offload_load_seconds_per_block=2e-5)
    yield "pipeline 2", rep(engine, pipeline_parallel=2)


def _plan(trace: Trace) -> tuple[EngineConfig, StepCostModel]:
    request = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class("H100"),
                          profile=profile_from_trace(trace))
    sim = simulated_plan(request, vllm_default_plan(request), "defaults")
    return sim.engine, sim.cost


def _outcome(result: SimResult) -> dict[str, Any]:
    return {"first_token": result.first_token_seconds, "finish": result.finish_seconds,
            "preemptions": result.preemptions, "prefix_hit_tokens": result.prefix_hit_tokens,
            "cpu_hit_tokens": result.cpu_hit_tokens, "rejected": result.rejected,
            "peak_running": result.peak_running, "mean_running": result.mean_running,
            "mean_kv_usage": result.mean_kv_usage}


def main(traces: Path) -> None:
    out: dict[str, Any] = {"compiled": is_mypyc_compiled()}
    for path, limit, speed in ((AZURE_TRACE, 1500, 4.0), (MOONCAKE_TRACE, 300, 1.0)):
        trace = load_trace(traces / path.name)
        engine, cost = _plan(trace)
        reqs = requests_from_trace(trace, speed=speed)[:limit]
        for label, config in _variants(engine):
            out[f"{path.name} {label}"] = _outcome(simulate(reqs, config, cost))
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
