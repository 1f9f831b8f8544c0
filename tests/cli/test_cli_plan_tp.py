"""`kvtune plan --tp auto`: the degree and replicas chosen, shown as a table and in -o json,
compared across GPU classes each at its best TP, and rendered with a TP flag vLLM 0.33's own
parser takes (planner/tp_choice.py, docs/planner.md)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli

LLAMA_70B = ["plan", "-m", "meta-llama/Llama-3.3-70B-Instruct", "-g", "H100"]


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def plan_json(*args: str) -> dict[str, Any]:
    code, out, err = run(*args, "-o", "json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_auto_without_a_rate_lists_the_degrees_and_renders_the_chosen_one() -> None:
    doc = plan_json(*LLAMA_70B, "--tp", "auto")
    choice = doc["tp_choice"]
    assert choice["by"] == "sequences" and choice["replicas"] is None
    rows = {o["tensor_parallel"]: o for o in choice["options"]}
    assert set(rows) == {1, 2, 4, 8}
    assert rows[1]["refused"].startswith("does not fit") and not rows[1]["chosen"]
    chosen = [t for t, o in rows.items() if o["chosen"]]
    assert chosen == [doc["tensor_parallel"]] and doc["tensor_parallel"] > 1
    assert doc["vllm_args"][0] == f"--tensor-parallel-size={doc['tensor_parallel']}"
    assert doc["reasons"][0]["knob"] == "tensor-parallel-size"
    # The KV dtype figures are of the chosen degree (TP1 holds no KV: it would show 0).
    assert all(r["concurrent_sequences"] > 0 for r in doc["kv_dtype_comparison"])


def test_auto_table_shows_the_degrees_weighed() -> None:
    code, out, _ = run(*LLAMA_70B, "--tp", "auto")
    assert code == 0
    assert "Tensor parallel on H100 (no rate)" in out
    assert re.search(r"TP1 .*does not fit", out)
    assert re.search(r"TP\d \*", out)


def test_without_auto_there_is_no_choice() -> None:
    doc = plan_json(*LLAMA_70B, "--tp", "4")
    assert "tp_choice" not in doc and doc["tensor_parallel"] == 4


@pytest.mark.parametrize(("args", "needle"), [
    (["--tp", "three"], "--tp"),
    (["--tp", "0"], "--tp"),
    (["--tp", "auto", "--gpus-per-replica", "8"], "drop --gpus-per-replica"),
    (["--tp", "auto", "--replicas", "2"], "drop --replicas"),
    (["--max-replicas", "2"], "pass --tp auto"),
])
def test_bad_combinations_are_usage_errors_in_one_line(args: list[str], needle: str) -> None:
    code, _, err = run(*LLAMA_70B, *args)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert needle in line, err


@pytest.mark.vllm
def test_the_chosen_tp_flag_parses_in_vllms_parser() -> None:
    """The chosen degree's flag, parsed by a parser holding vLLM 0.33's own
    ``--tensor-parallel-size`` argument (as ``EngineArgs.add_cli_args`` adds it), then given
    to its ``ParallelConfig``."""
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import get_kwargs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    doc = plan_json(*LLAMA_70B, "--tp", "auto")
    parser = FlexibleArgumentParser()
    parser.add_argument("--tensor-parallel-size", "-tp",
                        **get_kwargs(ParallelConfig)["tensor_parallel_size"])
    ns, _ = parser.parse_known_args(doc["vllm_args"])
    assert ns.tensor_parallel_size == doc["tensor_parallel"]
    assert ParallelConfig(tensor_parallel_size=ns.tensor_parallel_size).world_size == (
        doc["tensor_parallel"])


@pytest.mark.slow
def test_with_a_rate_compare_gpu_ranks_classes_each_at_its_best_tp() -> None:
    doc = plan_json("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100",
                    "--tp", "auto", "--request-rate", "1", "--compare-gpu", "L4",
                    "--gpu-price", "H100=3,L4=0.8", "--search-cpu-seconds", "3")
    choice = doc["tp_choice"]
    assert choice["by"] == "capacity" and choice["replicas"] >= 1
    chosen = next(o for o in choice["options"] if o["chosen"])
    assert chosen["tensor_parallel"] == doc["tensor_parallel"]
    assert chosen["gpus_needed"] == chosen["replicas_needed"] * chosen["tensor_parallel"]
    rows = doc["gpu_comparison"]
    assert {r["gpu_class"] for r in rows} == {"H100", "L4"}
    costs = [r["cost_per_million_requests_at_rate_usd"] for r in rows]
    assert all(c is not None for c in costs) and costs == sorted(costs)
    assert all("replicas" in r for r in rows)
