"""Request streams and comparison helpers shared by the differential tests (not a test
module)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from kvtune.oracle.steps import RunRecord
from kvtune.tuner.simulator.workload import SimRequest, requests_from_trace
from kvtune.tuner.traces import load_trace

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
MOONCAKE = TRACES / "synthetic_trace.jsonl"
AZURE = TRACES / "AzureLLMInferenceTrace_conv.csv"


@cache
def trace_slice(path: Path, limit: int, start: int = 0, speed: float = 1.0
                ) -> tuple[SimRequest, ...]:
    return tuple(requests_from_trace(load_trace(path), speed=speed, limit=limit, start=start))


def first_difference(a: RunRecord, b: RunRecord) -> str:
    """'' when the runs agree in every step; else the first step that differs, readable."""
    for i, (x, y) in enumerate(zip(a.steps, b.steps, strict=False)):
        if x != y:
            return f"step {i}:\n  kvtune {x}\n  vllm   {y}"
    if len(a.steps) != len(b.steps):
        return f"kvtune took {len(a.steps)} steps, vllm {len(b.steps)}"
    if a.rejected != b.rejected:
        return f"rejected: kvtune {a.rejected}, vllm {b.rejected}"
    return ""
