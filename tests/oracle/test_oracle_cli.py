"""`kvtune simulate --engine vllm`: vLLM's own scheduler behind the same command, table and
JSON, equal to the default engine on the same trace slice."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from oraclecases import MOONCAKE

from kvtune.cli.main import cli

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARGS = ["simulate", "--trace", str(MOONCAKE), "--limit", "60", "--speed", "4",
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
        "--compare", "defaults,no-prefix-cache", "--score-sample", "0", "-o", "json"]
# Sampled once per decode run by the default engine (docs/simulator.md: the differences left).
PER_RUN = {"mean_kv_usage": 0.01, "mean_fragmented_tokens": 0.05,
           "fragmentation_fraction": 0.05}


def _rows(engine: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(cli, [*ARGS, "--engine", engine])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, object]] = json.loads(result.stdout)["configurations"]
    return rows


def test_engine_vllm_reports_what_the_default_engine_reports(vllm: object) -> None:
    ours, theirs = _rows("simulator"), _rows("vllm")
    assert [r["name"] for r in ours] == [r["name"] for r in theirs] == [
        "defaults", "no-prefix-cache"]
    for a, b in zip(ours, theirs, strict=True):
        assert a["completed"] == b["completed"] == 60
        for key, value in b.items():
            if key == "wall_seconds" or not isinstance(value, int | float):
                continue
            assert a[key] == pytest.approx(value, rel=PER_RUN.get(key, 1e-9)), key
    assert theirs[0]["prefix_hit_tokens"] > 0 == theirs[1]["prefix_hit_tokens"]


def test_engine_vllm_refuses_the_contiguous_baseline() -> None:
    args = [*ARGS[:-6], "--compare", "contiguous", "--score-sample", "0", "--engine", "vllm"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    assert "--compare: 'contiguous'" in result.output and "paged" in result.output
    assert "Traceback" not in result.output
