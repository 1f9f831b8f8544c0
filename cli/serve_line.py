"""The ``vllm serve`` command line of a plan, as every command prints it: ``kvtune plan -o
args`` (and its table's flag line) and ``kvtune simulate``'s per-configuration lines. One
function, so a line never lacks a flag the other has: the tensor-parallel size, then the
weights flags (``--quantization`` for fp8 weights, ``--dtype``), then the KV-cache knobs
(``tuner/knobs.py``'s table, the same path as the operator's Deployment)."""

from __future__ import annotations

from kvtune.tuner import knobs
from kvtune.tuner.plan import KVPlan


def serve_args(tensor_parallel: int, plan: KVPlan) -> list[str]:
    """Everything after ``vllm serve MODEL``."""
    return knobs.serve_args(tensor_parallel, plan.model_dump())


def serve_command(model_id: str, tensor_parallel: int, plan: KVPlan,
                  separator: str = " ") -> str:
    """``vllm serve MODEL --tensor-parallel-size=N ...`` joined with ``separator`` (a
    space, or `` \\\\\\n  `` for a shell line per flag)."""
    return separator.join([f"vllm serve {model_id}", *serve_args(tensor_parallel, plan)])
