"""Regressions for the classes of bad input issue 21 item 6 found (120 tried: 11 tracebacks,
11 silently wrong, 2 hangs): each is now one ``Error:`` line naming the option and the value,
exit 2 for a usage error and 1 for a runtime failure, or (the vllm serve lines) correct."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_fuzz import check, invoke
from click.testing import CliRunner, Result

from kvtune.cli.main import cli
from kvtune.e2e.traces import AZURE_TRACE

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PLAN = ["plan", "-m", MODEL, "-g", "H100", "-o", "args"]
SIM = ["simulate", "--trace", str(AZURE_TRACE), "-m", MODEL, "-g", "H100", "--limit", "30",
       "--score-sample", "0"]


def _error(words: list[str], code: int, *parts: str) -> str:
    result = invoke(words, seconds=120)
    check(words, result)
    assert result.exit_code == code, result.output
    line = result.stderr.strip()
    for part in parts:
        assert part in line, line
    return line


@pytest.mark.parametrize("rate", ["1e9", "1e5", "nan", "inf", "0"])
def test_absurd_request_rates_are_refused_before_any_work(rate: str) -> None:
    _error([*PLAN, "--workload", "chat", "--request-rate", rate], 2, "--request-rate",
           "0<x<=10000")


@pytest.mark.parametrize(("words", "parts"), [
    (["--ttft-p95", "nan"], ["--ttft-p95", "'nan' is not a finite number"]),
    (["--tpot-p95", "inf"], ["--tpot-p95", "'inf' is not a finite number"]),
    (["--cpu-offload-gib", "nan"], ["--cpu-offload-gib"]),
    (["--max-kv-quantization-kl", "nan"], ["--max-kv-quantization-kl"]),
    (["--kv-offloading-size", "nan"], ["--kv-offloading-size"]),
    (["--kv-offloading-size", "1e9"], ["--kv-offloading-size", "65536"]),
])
def test_nan_inf_and_absurd_numbers_are_usage_errors(words: list[str], parts: list[str]) -> None:
    _error([*PLAN, *words], 2, *parts)


def test_an_offload_no_node_has_is_refused() -> None:
    _error([*PLAN, "--kv-offloading-size", "60000"], 1, "--kv-offloading-size=60000.0",
           "per GPU")


@pytest.mark.parametrize("pair", ["block_size=-16", "max_num_seqs=0", "max_model_len=0",
                                  "gpu_memory_utilization=-1", "gpu_memory_utilization=nan",
                                  "kv_cache_memory_bytes=-1", "kv_offloading_size_gib=-3",
                                  "kv_offloading_size_gib=1e12"])
def test_negative_zero_or_absurd_config_values(pair: str) -> None:
    _error([*SIM, "--config", pair], 2, "--config", pair.split("=")[0])


@pytest.mark.parametrize("pair", ["num_gpu_blocks=-1", "step_seconds=nan", "block_size=0",
                                  "num_gpu_blocks=1000000000000", "block_size=abc"])
def test_replay_config_values_are_refused_before_it_serves(pair: str) -> None:
    _error(["replay", "--trace", str(AZURE_TRACE), "--port", "0", "--config", pair], 2,
           pair.split("=")[0])


@pytest.fixture
def odd_files(tmp_path: Path) -> dict[str, Path]:
    files = {"binary.csv": bytes(range(256)) * 4,
             "latin1.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe,5,3\n",
             "nan.jsonl": b'{"timestamp": NaN, "input_length": 5, "output_length": 3}\n',
             "huge.jsonl": b'{"timestamp": 0, "input_length": 10000000000000, '
                           b'"output_length": 3}\n'}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in files}


@pytest.mark.parametrize("name", ["binary.csv", "latin1.csv"])
def test_binary_or_non_utf8_traces(odd_files: dict[str, Path], name: str) -> None:
    path = str(odd_files[name])
    _error([*PLAN, "--trace", path, "--no-search"], 1, "--trace", name, "not UTF-8")
    _error([*SIM, "--trace", path], 1, "not UTF-8")  # the last --trace is the one used
    _error(["replay", "--trace", path, "--port", "0"], 1, "not UTF-8")
    _error(["plan", "-m", path, "-g", "H100"], 1, "cannot read it as JSON")


def test_nan_timestamps_and_huge_token_counts(odd_files: dict[str, Path]) -> None:
    _error([*PLAN, "--no-search", "--trace", str(odd_files["nan.jsonl"])], 1, "timestamp",
           "finite")
    _error([*PLAN, "--no-search", "--trace", str(odd_files["huge.jsonl"])], 1,
           "input_length", "more tokens than any model")


@pytest.mark.parametrize(("words", "option"), [
    (["replay", "--trace", str(AZURE_TRACE), "--port", "70000"], "--port"),
    (["replay", "--trace", str(AZURE_TRACE), "--port", "-1"], "--port"),
    (["operator", "--metrics-port", "70000", "--standalone"], "--metrics-port"),
])
def test_out_of_range_ports(words: list[str], option: str) -> None:
    _error(words, 2, option, "0<=x<=65535")


def test_a_missing_then_file_fails_before_the_replay_serves(tmp_path: Path) -> None:
    """It used to fail in a timer thread (a traceback) while the server ran on forever."""
    missing = tmp_path / "missing.csv"
    _error(["replay", "--trace", str(AZURE_TRACE), "--port", "0", "--then", f"{missing}@1"], 2,
           "--then", "no such file")
    _error(["replay", "--trace", str(AZURE_TRACE), "--port", "0", "--then",
            f"{AZURE_TRACE}@nan"], 2, "--then", "SECONDS")


def test_a_then_trace_that_does_not_parse_fails_before_the_replay_serves(
        odd_files: dict[str, Path]) -> None:
    _error(["replay", "--trace", str(AZURE_TRACE), "--port", "0", "--then",
            f"{odd_files['binary.csv']}@1"], 1, "not UTF-8")


@pytest.mark.parametrize("limit", ["-1", "0"])
def test_limit_must_be_positive(limit: str) -> None:
    """--limit -1 used to replay all requests but the last (a Python slice)."""
    _error([*SIM, "--limit", limit], 2, "--limit")


@pytest.mark.parametrize("speed", ["0", "-1", "nan", "inf", "1e300"])
def test_simulate_speed_is_bounded(speed: str) -> None:
    _error([*SIM, "--speed", speed], 2, "--speed")


def test_pins_vllm_refuses_at_start() -> None:
    """vLLM 0.33 refuses max_num_batched_tokens < max_num_seqs (SchedulerConfig): kvtune used
    to print --max-num-batched-tokens=256 for a pin of 100 without a word."""
    _error([*PLAN, "--max-num-batched-tokens", "100", "--max-num-seqs", "256"], 1,
           "--max-num-batched-tokens=100", "max_num_seqs=256", "refuses")
    _error([*SIM, "--compare", "defaults", "--config", "max_num_batched_tokens=1"], 1,
           "max_num_batched_tokens=1", "refuses")
    alone = invoke([*PLAN[:-2], "-o", "json", "--max-num-batched-tokens", "1"], seconds=120)
    assert alone.exit_code == 0, alone.output
    doc = json.loads(alone.stdout)
    seqs = next(r for r in doc["reasons"] if r["knob"] == "max-num-seqs")
    # The pin caps the batch, and the reason says so (it used to blame KV capacity).
    assert doc["plan"]["max_num_seqs"] == 1 and seqs["code"] == "BatchedTokens", seqs


@pytest.mark.slow
def test_simulate_prints_the_tp_and_quantization_flags_plan_prints() -> None:
    """`simulate --tp 2` printed vllm serve lines without --tensor-parallel-size (and the
    defaults line without --quantization for fp8 weights)."""
    words = [*SIM, "--tp", "2", "--weights-dtype", "fp8", "--compare", "defaults,planned"]
    result = CliRunner().invoke(cli, words)
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if "vllm serve" in ln]
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert f"vllm serve {MODEL} --tensor-parallel-size=2 --quantization=fp8_per_tensor" \
            in line, line
    plan = CliRunner().invoke(cli, ["plan", "-m", MODEL, "-g", "H100", "--tp", "2",
                                    "--weights-dtype", "fp8", "-o", "args"])
    planned_flags = plan.stdout.replace("\\\n ", "").split()
    assert planned_flags[:5] == lines[1].split(": ", 1)[1].split()[:5]
    json_run = CliRunner().invoke(cli, [*words, "-o", "json"])
    for row in json.loads(json_run.stdout)["configurations"]:
        assert row["vllm_args"][:2] == ["--tensor-parallel-size=2",
                                        "--quantization=fp8_per_tensor"], row["vllm_args"]


def test_quality_without_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    config = tmp_path / "config.json"
    config.write_text("{}")
    result: Result = CliRunner().invoke(cli, ["quality", "--model", str(config)])
    check(["quality"], result)
    assert result.exit_code == 1
    assert "'torch'" in result.stderr and "kvtune[quality]" in result.stderr, result.stderr


@pytest.mark.parametrize("words", [
    ["plan", "-m", MODEL],                       # a missing option: usage, 2
    ["plan", "-m", MODEL, "-g", "H100", "--tp", "3"],   # refused by the planner: 1
    ["simulate", "--trace", str(AZURE_TRACE)],   # missing options: 2
    ["alerts", "-f", str(AZURE_TRACE)],          # no InferenceDeployment: 1
    ["crds", "--dir", "/nonexistent/x", "--check"],  # stale: 1
])
def test_every_failure_is_one_error_line(words: list[str]) -> None:
    result = invoke(words, seconds=120)
    check(words, result)
    assert result.exit_code in (1, 2)
    assert result.stderr.startswith("Error: ") and result.stdout == "", result.output
