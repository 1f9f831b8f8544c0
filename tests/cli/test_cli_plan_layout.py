"""`kvtune plan --gpus-per-replica N` (and --tp/--dp/--ep pins): the layout chosen, shown and
rendered with flags vLLM 0.33's own argument parser accepts (docs/layouts.md)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli

DSV3 = ["plan", "-m", "deepseek-ai/DeepSeek-V3"]


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def plan_json(*args: str) -> dict[str, Any]:
    code, out, err = run(*args, "-o", "json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_deepseek_v3_on_8_h200_chooses_dp8_ep_and_lists_the_layouts() -> None:
    doc = plan_json(*DSV3, "-g", "H200", "--gpus-per-replica", "8")
    assert doc["layout"] == {"tensor_parallel": 1, "data_parallel": 8, "expert_parallel": True,
                             "decode_context_parallel": 1, "pipeline_parallel": 1,
                             "nodes_per_replica": 1, "label": "DP8+EP"}
    assert doc["vllm_args"][:3] == [
        "--tensor-parallel-size=1", "--data-parallel-size=8", "--enable-expert-parallel"]
    rows = {r["label"]: r for r in doc["layouts_considered"]}
    assert set(rows) == {"TP8", "TP4xDP2+EP", "TP2xDP4+EP", "DP8+EP"}
    assert rows["DP8+EP"]["chosen"] and not rows["TP8"]["chosen"]
    assert rows["TP8"]["kv_copies"] == 8 and rows["DP8+EP"]["kv_copies"] == 1
    assert rows["DP8+EP"]["kv_cache_tokens_per_replica"] > (
        5 * rows["TP8"]["kv_cache_tokens_per_replica"])
    assert doc["reasons"][0]["knob"] == "layout"
    # The KV dtype comparison is of the chosen layout (TP1 per engine), not of the request.
    assert doc["kv_dtype_comparison"] and all(
        r["concurrent_sequences"] > 0 for r in doc["kv_dtype_comparison"])


def test_table_shows_the_layouts_weighed() -> None:
    code, out, _ = run(*DSV3, "-g", "H200", "--gpus-per-replica", "8")
    assert code == 0
    assert "x DP8+EP" in out and "Layouts of 8 H200 GPUs per replica" in out
    for label in ("TP8", "TP4xDP2+EP", "TP2xDP4+EP", "DP8+EP *"):
        assert label in out
    assert "--data-parallel-size=8 --enable-expert-parallel" in out


def test_8_h100_says_which_gpu_count_fits_and_16_plans() -> None:
    code, _, err = run(*DSV3, "-g", "H100", "--gpus-per-replica", "8")
    assert code == 1
    assert "fits no layout of 8 H100 GPUs" in err
    assert "--gpus-per-replica 16" in err and "no single change fits" not in err
    doc = plan_json(*DSV3, "-g", "H100", "--gpus-per-replica", "16")
    assert doc["layout"]["label"] == "DP16+EP"


def test_tp_dp_ep_pin_the_layout() -> None:
    doc = plan_json(*DSV3, "-g", "H200", "--gpus-per-replica", "8", "--tp", "2")
    assert doc["layout"]["label"] == "TP2xDP4+EP" and len(doc["layouts_considered"]) == 1
    assert doc["reasons"][0]["code"] == "Pinned"
    # --dp without --gpus-per-replica: TP x DP GPUs, EP as pinned.
    doc = plan_json(*DSV3, "-g", "H200", "--tp", "4", "--dp", "2", "--no-ep")
    assert doc["layout"]["label"] == "TP4xDP2"
    assert "--enable-expert-parallel" not in doc["vllm_args"]
    # --pp pins pipeline stages: TP x PP GPUs; with --gpus-per-replica the rest is chosen.
    doc = plan_json(*DSV3, "-g", "H200", "--tp", "4", "--pp", "2")
    assert doc["layout"]["label"] == "TP4+PP2"
    assert doc["vllm_args"][:2] == ["--tensor-parallel-size=4", "--pipeline-parallel-size=2"]
    doc = plan_json(*DSV3, "-g", "H200", "--gpus-per-replica", "8", "--pp", "2")
    assert all(o["layout"]["pipeline_parallel"] == 2 for o in doc["layouts_considered"])
    assert {o["label"] for o in doc["layouts_considered"]} == {
        "TP4+PP2", "TP2xDP2+EP+PP2", "DP4+EP+PP2"}
    args_out = run(*DSV3, "-g", "H200", "--dp", "8", "--tp", "1", "-o", "args")[1]
    assert args_out.replace("\\\n", " ").split()[3:6] == [
        "--tensor-parallel-size=1", "--data-parallel-size=8", "--enable-expert-parallel"]


@pytest.mark.parametrize(("args", "expect"), [
    (["-m", "meta-llama/Llama-3.3-70B-Instruct", "--ep", "--dp", "2"], "--ep=True"),
    (["-m", "deepseek-ai/DeepSeek-V3", "--gpus-per-replica", "8", "--tp", "3"], "--tp=3"),
    (["-m", "deepseek-ai/DeepSeek-V3", "--gpus-per-replica", "8", "--dp", "3"], "--dp=3"),
    (["-m", "meta-llama/Llama-3.3-70B-Instruct", "--tp", "8", "--dcp", "2"], "--dcp=2"),
    (["-m", "deepseek-ai/DeepSeek-V3", "--gpus-per-replica", "8", "--pp", "3"], "--pp=3"),
    (["-m", "deepseek-ai/DeepSeek-V3", "--gpus-per-replica", "8", "--pp", "2", "--tp", "8"],
     "--tp=8"),
    (["-m", "google/gemma-3-27b-it", "--tp", "2", "--pp", "2"], "--pp=2"),
    (["-m", "meta-llama/Llama-3.1-405B-Instruct", "--tp", "8", "--pp", "3",
      "--nodes-per-replica", "2"], "--nodes-per-replica=2"),
])
def test_impossible_layout_pins_fail_in_one_line_naming_the_option(
        args: list[str], expect: str) -> None:
    code, _, err = run("plan", "-g", "H200", *args)
    assert code == 1
    line = err.strip().removeprefix("Error: ")
    assert "\n" not in line and line.startswith(expect), err
    if "--pp" in args and expect == "--tp=8":
        assert "under PP 2 a stage has 4 of the 8 GPUs" in line


def test_a_replica_over_nodes_is_planned_with_its_stage_sends_on_the_nic() -> None:
    """--nodes-per-replica, as the pool's nodesPerReplica: TP2 x PP2 over two nodes sends
    between its stages over the RDMA NIC (the rate: tests/tuner/planner/
    test_tuner_pipeline_parallel.py), and the plan's expectations move with it."""
    args = ["plan", "-m", "meta-llama/Llama-3.3-70B-Instruct", "-g", "H100", "--tp", "2",
            "--pp", "2"]
    split, local = plan_json(*args, "--nodes-per-replica", "2"), plan_json(*args)
    assert (split["layout"]["nodes_per_replica"], local["layout"]["nodes_per_replica"]) == (2, 1)
    assert split["expected"] != local["expected"]
    # The nodes are the pool's, not a vLLM flag (the LeaderWorkerSet's launch flags are).
    assert not any("node" in a for a in split["vllm_args"])
    code, _, err = run("plan", "-m", "meta-llama/Llama-3.3-70B-Instruct", "-g", "H100",
                       "--tp", "auto", "--nodes-per-replica", "2")
    assert code == 2 and "drop --nodes-per-replica" in err


def test_without_layout_options_the_plan_is_tp_alone_as_before() -> None:
    doc = plan_json(*DSV3, "-g", "H200", "--tp", "8")
    assert "layout" not in doc and "layouts_considered" not in doc
    assert doc["vllm_args"][0] == "--tensor-parallel-size=8"
    assert not any(a.startswith("--data-parallel") for a in doc["vllm_args"])


@pytest.mark.vllm
@pytest.mark.parametrize("extra", [["--gpus-per-replica", "8"], ["--tp", "2", "--dp", "4"],
                                   ["--tp", "4", "--dp", "2", "--no-ep"],
                                   ["--tp", "8", "--dcp", "8"],
                                   ["--gpus-per-replica", "8", "--dcp", "2"],
                                   ["--tp", "4", "--pp", "2"],
                                   ["--gpus-per-replica", "8", "--pp", "2"]])
def test_layout_flags_parse_in_vllms_own_parser_into_its_parallel_config(
        extra: list[str]) -> None:
    """The rendered layout flags, parsed by a ``FlexibleArgumentParser`` holding vLLM 0.33's
    own ``ParallelConfig`` arguments exactly as ``EngineArgs.add_cli_args`` adds them (the
    whole EngineArgs parser needs a device), then given to ``ParallelConfig``."""
    from pathlib import Path

    import vllm
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import get_kwargs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    doc = plan_json(*DSV3, "-g", "H200", *extra)
    layout_args = [a for a in doc["vllm_args"] if a.split("=", 1)[0] in (
        "--tensor-parallel-size", "--data-parallel-size", "--enable-expert-parallel",
        "--decode-context-parallel-size", "--pipeline-parallel-size")]
    source = (Path(vllm.__file__).parent / "engine" / "arg_utils.py").read_text()
    kwargs = get_kwargs(ParallelConfig)
    parser = FlexibleArgumentParser()
    for flags, field in ((("--tensor-parallel-size", "-tp"), "tensor_parallel_size"),
                         (("--data-parallel-size", "-dp"), "data_parallel_size"),
                         (("--enable-expert-parallel", "-ep"), "enable_expert_parallel"),
                         (("--decode-context-parallel-size", "-dcp"),
                          "decode_context_parallel_size"),
                         (("--pipeline-parallel-size", "-pp"), "pipeline_parallel_size")):
        # EngineArgs.add_cli_args: parallel_group.add_argument("--flag", "-x",
        #                                                      **parallel_kwargs["field"])
        assert re.search(r'add_argument\(\s*"' + flags[0] + r'",\s*"' + flags[1]
                         + r'",\s*\*\*parallel_kwargs\["' + field + r'"\]', source), flags
        parser.add_argument(*flags, **kwargs[field])
    ns = parser.parse_args(layout_args)
    layout = doc["layout"]
    assert (ns.tensor_parallel_size, ns.data_parallel_size, bool(ns.enable_expert_parallel),
            ns.decode_context_parallel_size, ns.pipeline_parallel_size) == (
        layout["tensor_parallel"], layout["data_parallel"], layout["expert_parallel"],
        layout["decode_context_parallel"], layout["pipeline_parallel"])
    # ParallelConfig's own checks (tp % dcp == 0 among them) pass.
    config = ParallelConfig(tensor_parallel_size=ns.tensor_parallel_size,
                            data_parallel_size=ns.data_parallel_size,
                            enable_expert_parallel=bool(ns.enable_expert_parallel),
                            decode_context_parallel_size=ns.decode_context_parallel_size,
                            pipeline_parallel_size=ns.pipeline_parallel_size)
    # One engine's workers are TP (x PP); the replica's GPUs are that times DP.
    assert config.world_size * config.data_parallel_size == 8


@pytest.mark.slow
def test_with_a_rate_the_capacity_search_runs_per_layout_and_ranks_them() -> None:
    """Each layout's engine is searched on its DP share of the rate; the replica's capacity
    (engine's x DP) picks the layout."""
    doc = plan_json("plan", "-m", "deepseek-ai/DeepSeek-V2-Lite", "-g", "H100",
                    "--gpus-per-replica", "2", "--request-rate", "4", "--compare-gpu", "H100")
    assert doc["search"] is not None
    rows = doc["layouts_considered"]
    assert [r["label"] for r in rows] == ["TP2", "DP2+EP"]
    chosen = next(r for r in rows if r["chosen"])
    assert chosen["label"] == doc["layout"]["label"]
    assert chosen["score"] == max(r["score"] for r in rows) > 0
    assert "req/s capacity at SLO per replica" in doc["reasons"][0]["message"]
    # The search summary is the replica's (planner/layout_replica.py): its capacity is the
    # layout's score, its replicas are replicas of the layout's GPUs, not engines.
    search = doc["search"]
    assert chosen["score"] == pytest.approx(search["capacity_requests_per_second"], abs=1e-3)
    assert search["replicas"] == 1 and search["cost"]["gpus_per_replica"] == 2
    assert search["replicas_needed"] == math.ceil(4 / search["capacity_requests_per_second"])
    # Every layout that fits is priced at its GPUs' hour over its capacity at SLO.
    for r in rows:
        assert r["usd_per_replica_hour"] == pytest.approx(2 * search["cost"]["usd_per_gpu_hour"])
        assert r["cost_per_million_good_requests_usd"] == pytest.approx(
            r["usd_per_replica_hour"] * 1e6 / 3600 / r["score"], rel=1e-6)
    assert chosen["cost_per_million_good_requests_usd"] == pytest.approx(
        search["cost"]["cost_per_million_good_requests_usd"], rel=1e-3)
    # --compare-gpu lists the same layouts with their capacity and cost.
    compared = doc["gpu_comparison"][0]["layouts"]
    assert [r["label"] for r in compared] == ["TP2", "DP2+EP"]
    assert [r["cost_per_million_good_requests_usd"] for r in compared] == \
        [r["cost_per_million_good_requests_usd"] for r in rows]


def _short_trace(path: Any, requests: int = 60) -> str:
    """A Mooncake-style JSONL trace: a request every 100 ms, 600-2,000-token prompts (blocks
    of 512 tokens, the first shared by every third), 20-90 output tokens."""
    rows = []
    for i in range(requests):
        prompt = 600 + (i * 229) % 1400
        blocks = -(-prompt // 512)
        ids = [0] + [1000 + i * 10 + b for b in range(blocks - 1)] if i % 3 == 0 else [
            1000 + i * 10 + b for b in range(blocks)]
        rows.append(json.dumps({"timestamp": i * 100, "input_length": prompt,
                                "output_length": 20 + (i * 7) % 70, "hash_ids": ids}))
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.mark.slow
def test_a_pinned_pp_engine_gets_the_capacity_search(tmp_path: Any) -> None:
    """``--pp 2 --trace``: the search replays PP's micro-batches (it refused --pp before);
    the engine's cost counts its stages' GPUs."""
    doc = plan_json("plan", "-m", "Qwen/Qwen2.5-7B-Instruct", "-g", "H100", "--tp", "1",
                    "--pp", "2", "--trace", _short_trace(tmp_path / "t.jsonl"))
    assert doc["layout"]["pipeline_parallel"] == 2
    search = doc["search"]
    assert search is not None and search["capacity_requests_per_second"] > 0
    assert search["cost"]["gpus_per_replica"] == 2
    assert "--pipeline-parallel-size=2" in doc["vllm_args"]
