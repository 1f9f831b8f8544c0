"""`kvtune plan` on the cases that used to run away (issue 22 item 3): an impossible SLO
answers at once from the closed-form bound; a spent search budget is one line, not a
traceback."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from kvtune.cli.main import cli

BASE = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
        "--workload", "chat", "--no-progress"]


def test_an_impossible_ttft_at_5000_rps_is_unreachable_at_once() -> None:
    t0 = time.process_time()
    result = CliRunner().invoke(cli, [*BASE, "--request-rate", "5000", "--ttft-p95", "0.001",
                                      "-o", "json"])
    assert result.exit_code == 0, result.output
    assert time.process_time() - t0 < 10
    doc = json.loads(result.stdout)
    assert doc["search"] is None
    u = doc["slo_unreachable"]
    assert u["ttft_floor_seconds"] > u["ttft_target_seconds"] == 0.001
    table = CliRunner().invoke(cli, [*BASE, "--request-rate", "5000", "--ttft-p95", "0.001"])
    assert "SLO unreachable on H100" in table.stdout and "best attainable is TTFT" in table.stdout


def test_a_search_budget_spent_before_any_score_is_one_line() -> None:
    # 10,000 requests/s (the ceiling): the stream is capped (1e9 used to ask numpy for
    # terabytes); a budget too small for one score ends with one line naming the budget and
    # how to raise it.
    result = CliRunner().invoke(cli, [*BASE, "--request-rate", "10000",
                                      "--search-cpu-seconds", "0.001"])
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: the capacity search was stopped before scoring any "
                           "candidate: its CPU budget of 0.001 s was spent"), line
    assert "--search-cpu-seconds" in line
