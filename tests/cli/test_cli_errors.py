"""Bad input gives one line naming the field, the value and the fix, exit 1; usage errors
exit 2; never a traceback (issue 14 item 11). Outputs are checked before any work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kvtune.cli.main import cli
from kvtune.e2e.traces import AZURE_TRACE

REPO = Path(__file__).resolve().parents[2]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _one_line_error(result: Result, *words: str) -> str:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    text = result.output.strip()
    assert len(text.splitlines()) == 1, text
    for word in words:
        assert word in text, text
    return text


@pytest.fixture
def negative_traces(tmp_path: Path) -> dict[str, Path]:
    csv = tmp_path / "neg.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:17:03.9799600,100,10\n2023-11-16 18:17:04.0000000,-5,10\n")
    jsonl = tmp_path / "neg.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 10, "output_length": -2, "hash_ids": []}\n')
    return {"csv": csv, "jsonl": jsonl}


def test_negative_token_counts_in_a_trace(negative_traces: dict[str, Path]) -> None:
    result = CliRunner().invoke(cli, ["plan", "-m", MODEL, "-g", "H100",
                                      "--trace", str(negative_traces["csv"])])
    _one_line_error(result, "neg.csv:3", "ContextTokens", "-5", "cannot be negative")
    result = CliRunner().invoke(cli, ["plan", "-m", MODEL, "-g", "H100",
                                      "--trace", str(negative_traces["jsonl"])])
    _one_line_error(result, "neg.jsonl:1", "output_length", "-2")


def test_replay_with_a_bad_trace(negative_traces: dict[str, Path], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["replay", "--trace", str(negative_traces["csv"]),
                                      "--port", "0"])
    _one_line_error(result, "ContextTokens", "cannot be negative")
    garbage = tmp_path / "trace.txt"
    garbage.write_text("not a trace\n")
    result = CliRunner().invoke(cli, ["replay", "--trace", str(garbage), "--port", "0"])
    _one_line_error(result, "--trace", "unknown format")


@pytest.mark.parametrize(("plot", "words"), [
    ("missing-folder/out.png", ["--plot", "does not exist"]),
    ("out.txt", ["--plot", "unknown image format"]),
])
def test_a_bad_plot_path_fails_before_the_replay(tmp_path: Path, plot: str,
                                                 words: list[str]) -> None:
    result = CliRunner().invoke(cli, [
        "simulate", "--trace", str(AZURE_TRACE), "--model", MODEL, "--gpu", "H100",
        "--limit", "50", "--plot", str(tmp_path / plot)])
    text = _one_line_error(result, *words)
    assert "requests at" not in text  # the comparison table was never computed


def test_alerts_with_bad_yaml_or_an_unwritable_output(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [\n")
    result = CliRunner().invoke(cli, ["alerts", "-f", str(bad)])
    _one_line_error(result, "--file", "not valid YAML", "line 2")
    target = tmp_path / "nope" / "rules.yaml"
    result = CliRunner().invoke(cli, ["alerts", "-f", str(REPO / "examples/support-bot.yaml"),
                                      "--out-file", str(target)])
    _one_line_error(result, "--out-file", "does not exist")
    assert not target.exists()


def _kvtune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    kvtune = Path(sys.executable).parent / "kvtune"
    return subprocess.run([str(kvtune), *args], capture_output=True, text=True, timeout=120,
                          env=env, check=False)


def _no_cluster_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    return env


@pytest.mark.slow
def test_plan_from_cluster_without_a_kubeconfig(tmp_path: Path) -> None:
    done = _kvtune("plan", "--from-cluster", "bot", "-o", "patch", env=_no_cluster_env(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "--from-cluster bot" in done.stderr and "kubeconfig" in done.stderr


BROKEN = "garbage: [\n"
REFUSED = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
users: [{name: u, user: {token: t}}]
"""


@pytest.mark.parametrize(("kubeconfig", "words"), [
    (BROKEN, ["cannot load it"]),
    (REFUSED, ["https://127.0.0.1:1", "did not answer", "Connection refused"]),
], ids=["unparsable", "refused"])
@pytest.mark.slow
def test_operator_with_a_broken_kubeconfig_fails_fast(tmp_path: Path, kubeconfig: str,
                                                      words: list[str]) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig)
    done = _kvtune("operator", "--kubeconfig", str(path), "--standalone", "--metrics-port", "0",
                   env=_no_cluster_env(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"Error: --kubeconfig='{path}'")
    for word in words:
        assert word in line, line


def test_usage_errors_exit_2() -> None:
    result = CliRunner().invoke(cli, ["plan", "-m", MODEL])  # --gpu missing
    assert result.exit_code == 2
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(AZURE_TRACE)])
    assert result.exit_code == 2
