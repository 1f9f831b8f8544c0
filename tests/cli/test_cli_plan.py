"""`kvtune plan` end to end through click (the real command, no mocks)."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.e2e.traces import TRACES_DIR
from kvtune.tuner.planner.search import CAPACITY_TIE

ARTICLE = ["plan", "--model", "meta-llama/Llama-3.3-70B-Instruct", "--gpu", "H200",
           "--weights-dtype", "fp8", "--context-tokens", "4096"]


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_json_is_stable_for_scripts() -> None:
    code, out, _ = run(*ARTICLE, "-o", "json")
    assert code == 0
    doc = json.loads(out)
    for key in ("kv_bytes_per_token", "kv_cache_tokens", "concurrent_sequences", "plan",
                "vllm_args", "reasons", "warnings", "kv_dtype_comparison"):
        assert key in doc
    assert doc["kv_bytes_per_token"] == 163_840
    assert doc["plan"]["kv_cache_dtype"] == "fp8"
    assert all(r["message"] for r in doc["reasons"])
    by_dtype = {r["kv_cache_dtype"]: r for r in doc["kv_dtype_comparison"]}
    assert by_dtype["auto"]["kv_bytes_per_token"] == 327_680
    assert by_dtype["int8_per_token_head"]["scale_overhead"] == pytest.approx(0.03125)


def test_yaml_matches_json() -> None:
    _, out_json, _ = run(*ARTICLE, "-o", "json")
    _, out_yaml, _ = run(*ARTICLE, "-o", "yaml")
    assert yaml.safe_load(out_yaml) == json.loads(out_json)


def test_args_are_the_exact_vllm_flags() -> None:
    code, out, _ = run("plan", "-m", "deepseek-ai/DeepSeek-V3", "-g", "H200", "--tp", "8",
                       "--block-size", "64", "-o", "args")
    assert code == 0
    assert out.startswith("vllm serve deepseek-ai/DeepSeek-V3")
    assert "--tensor-parallel-size=8" in out
    assert "--block-size=64" in out and "--kv-cache-dtype=" in out


def test_table_shows_the_plan_and_the_dtype_comparison() -> None:
    code, out, _ = run(*ARTICLE, "--lowest-kv-precision", "int4")
    assert code == 0
    for text in ("kv-cache-dtype", "gpu-memory-utilization", "KV bytes per token", "163,840",
                 "int4_per_token_head", "scale overhead", "vllm serve flags"):
        assert text in out


@pytest.mark.parametrize(
    ("trace", "expect"),
    [("synthetic_trace.jsonl", "prefix hit rate"), ("AzureLLMInferenceTrace_conv.csv", "unknown")],
)
def test_trace_profiles(trace: str, expect: str) -> None:
    path = TRACES_DIR / trace
    # The profile alone (--no-search: the capacity search has its own tests below).
    code, out, _ = run("plan", "-m", "Qwen/Qwen3-32B", "-g", "H100", "--trace", str(path),
                       "-o", "json", "--no-search")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["profile"]["source"] == "trace"
    assert doc["search"] is None
    reason = next(r for r in doc["reasons"] if r["knob"] == "enable-prefix-caching")
    assert expect in reason["message"]


def test_unknown_names_list_close_matches() -> None:
    # A bad name is bad input: exit 1 (usage errors exit 2).
    code, _, err = run("plan", "-m", "Qwen3-32", "-g", "H200")
    assert code == 1 and "Qwen/Qwen3-32B" in err
    code, _, err = run("plan", "-m", "Qwen/Qwen3-32B", "-g", "H2000")
    assert code == 1 and "H200" in err


def test_no_fit_quotes_bytes_and_fixes() -> None:
    code, _, err = run("plan", "-m", "Qwen/Qwen3-235B-A22B", "-g", "H100", "--weights-dtype",
                       "bf16")
    assert code == 1
    assert "GiB" in err and "tensor parallel" in err


def test_list() -> None:
    code, out, _ = run("plan", "--list")
    assert code == 0 and "google/gemma-3-27b-it" in out and "B200" in out


@pytest.mark.slow
def test_trace_plans_by_capacity_and_shows_the_alternatives() -> None:
    # The Azure trace at its recorded rate on an H200: the search replays the trace under
    # the candidates and ranks them by capacity at SLO; a narrower KV dtype wins only by
    # raising capacity by more than the tie (with the 16-bit dtype pinned, the best plan's
    # capacity is lower by more than that), else the wider precision is kept.
    path = TRACES_DIR / "AzureLLMInferenceTrace_conv.csv"
    args = ("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H200", "--trace",
            str(path), "--ttft-p95", "2", "--tpot-p95", "0.05")
    code, out, _ = run(*args, "-o", "json")
    assert code == 0, out
    doc = json.loads(out)
    search = doc["search"]
    assert search["slo_met"] and search["slo_attainment"] >= 0.95
    assert search["capacity_requests_per_second"] > 0
    if doc["plan"]["kv_cache_dtype"] != "auto":
        code, pinned_out, _ = run(*args, "--kv-cache-dtype", "auto", "-o", "json")
        assert code == 0, pinned_out
        pinned = json.loads(pinned_out)["search"]["capacity_requests_per_second"]
        assert search["capacity_requests_per_second"] > pinned * (1 + CAPACITY_TIE), pinned
    assert "goodput_requests_per_second" not in search
    # Capacity and attainment at the observed rate agree: meeting the SLO there means a
    # capacity of at least the observed rate, and the replicas needed follow from it.
    assert search["slo_met"] == (search["capacity_requests_per_second"]
                                 >= search["rate_per_replica_per_second"])
    assert search["replicas_needed"] == math.ceil(
        search["observed_rate_per_second"] / search["capacity_requests_per_second"] - 1e-9)
    assert doc["expected"]["capacity_requests_per_second"] == (
        search["capacity_requests_per_second"])
    assert search["alternatives"] and all(a["why_lost"] for a in search["alternatives"])
    code, table, _ = run(*args)
    assert code == 0
    assert "capacity search:" in table and "Little's law" in table and "why not chosen" in table


@pytest.mark.slow
def test_plan_shows_the_front_with_costs_from_the_price_given() -> None:
    args = ("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100", "--workload",
            "chat", "--request-rate", "4", "--ttft-p95", "1", "--tpot-p95", "0.05")
    code, out, _ = run(*args, "--gpu-price", "H100=2.5", "-o", "json")
    assert code == 0, out
    search = json.loads(out)["search"]
    cost = search["cost"]
    assert cost["usd_per_gpu_hour"] == 2.5 and cost["price_source"] == "--gpu-price H100=2.5"
    assert cost["cost_per_million_output_tokens_usd"] == pytest.approx(
        2.5 / (search["output_tokens_per_second"] * 3600) * 1e6)
    assert [p for p in search["front"] if p["chosen"]]
    assert all(p["cost_per_million_good_requests_usd"] for p in search["front"])
    # The shipped list price, with its source, when none is given; in the table too.
    code, out, _ = run(*args)
    assert code == 0 and "Pareto front on H100" in out and "$3/GPU-hour" in out
    assert "mercatus" in out.lower()


@pytest.mark.slow
def test_compare_gpu_ranks_the_classes_by_cost_and_prices_reorder_them() -> None:
    args = ("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100", "--workload",
            "chat", "--request-rate", "4", "--ttft-p95", "1", "--tpot-p95", "0.05",
            "--compare-gpu", "H200", "-o", "json")

    def order(prices: str) -> list[str]:
        code, out, err = run(*args, "--gpu-price", prices)
        assert code == 0, err
        rows = json.loads(out)["gpu_comparison"]
        assert {r["gpu_class"] for r in rows} == {"H100", "H200"}
        assert all(r["slo_met"] for r in rows)
        costs = [r["cost_per_million_good_requests_usd"] for r in rows]
        assert costs == sorted(costs)
        return [r["gpu_class"] for r in rows]

    # Both classes meet the SLO at 4 req/s: the cheaper hour wins, whichever it is.
    assert order("H100=1,H200=9") == ["H100", "H200"]
    assert order("H100=9,H200=1") == ["H200", "H100"]
    code, _, err = run(*args[:-2], "--no-search", "-o", "json")
    assert code == 2 and "--compare-gpu" in err


@pytest.mark.parametrize("price", ["H100", "H100=cheap", "H100=-2"])
def test_a_bad_gpu_price_is_one_line_naming_the_option(price: str) -> None:
    code, _, err = run("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100",
                         "--gpu-price", price)
    assert code == 1
    assert err.count("\n") == 1 and "--gpu-price=" in err and "CLASS=USD" in err


@pytest.mark.slow
def test_an_unreachable_slo_is_a_line_in_plan() -> None:
    # A 50 ms TTFT for RAG prompts: no rate meets it; plan says so instead of picking the
    # least bad silently.
    code, out, _ = run("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100",
                       "--workload", "rag", "--request-rate", "5", "--ttft-p95", "0.05",
                       "--tpot-p95", "0.03")
    assert code == 0, out
    assert "SLO at risk" in out and "no request rate meets the SLO" in out
