"""SLO-goodput (DistServe's definition: requests per second meeting both their TTFT and TPOT
targets) from a run, and `kvtune simulate --ttft-p95/--tpot-p95/--per-request`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from simhelpers import fixed_step_cost, request

from kvtune.cli.main import cli
from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.tuner.simulator.metrics import SimResult, SLOTargets
from kvtune.tuner.simulator.scheduler import EngineConfig, simulate


def _run() -> SimResult:
    # Budget 16 tokens a step (10 ms): request 0 (16-token prompt, 3 tokens) prefills in
    # step 1 and decodes in steps 2 and 3; request 1 (32-token prompt, 2 tokens) gets the
    # 15 tokens of budget left in steps 2 and 3 and its last 2 in step 4: first token at
    # 0.04 s, second at 0.05 s. Request 2 is longer than max-model-len.
    reqs = [request(0, 0.0, 16, 3), request(1, 0.0, 32, 2), request(2, 0.0, 900, 1)]
    cfg = EngineConfig(num_gpu_blocks=9, block_size=16, max_num_seqs=4,
                       max_num_batched_tokens=16, max_model_len=512)
    return simulate(reqs, cfg, fixed_step_cost())


def test_per_request_times_and_the_slo_flags() -> None:
    res = _run()
    per = res.per_request(SLOTargets(ttft_seconds=0.02, tpot_seconds=0.0101))
    # Request 0: first token at the end of step 1 (0.01 s); then one token a step while
    # request 1 prefills, so (0.03 - 0.01) / 2 = 0.01 s between tokens.
    assert per.ttft_seconds[0] == pytest.approx(0.01)
    assert per.tpot_seconds[0] == pytest.approx(0.01)
    # Request 1: TTFT 0.04 s (misses 0.02), one gap of 0.01 s.
    assert per.ttft_seconds[1] == pytest.approx(0.04)
    assert per.tpot_seconds[1] == pytest.approx(0.01)
    # Request 2 is rejected (longer than max-model-len): no times, never meets anything.
    assert math.isnan(per.ttft_seconds[2]) and math.isnan(per.tpot_seconds[2])
    assert per.met_slo.tolist() == [True, False, False]
    rate, attainment = res.goodput(SLOTargets(ttft_seconds=0.02, tpot_seconds=0.0101))
    span = max(f for f in res.finish_seconds if not math.isnan(f))
    assert attainment == pytest.approx(1 / 3)
    assert rate == pytest.approx(1 / span)
    # A looser TTFT target counts request 1 too; a TPOT target below 10 ms counts nobody.
    assert res.goodput(SLOTargets(ttft_seconds=0.05))[1] == pytest.approx(2 / 3)
    assert res.goodput(SLOTargets(tpot_seconds=0.005))[1] == 0.0
    summary = res.summary(SLOTargets(ttft_seconds=0.02))
    assert summary["goodput_requests_per_second"] == pytest.approx(rate)
    assert summary["slo_attainment"] == pytest.approx(1 / 3)
    assert "goodput_requests_per_second" not in res.summary()


def test_cli_goodput_per_configuration_and_per_request_file(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["simulate", "--trace", str(AZURE), "--model", "meta-llama/Llama-3.1-8B-Instruct",
            "--gpu", "H100", "--limit", "300", "--speed", "8", "--score-sample", "0",
            "--compare", "defaults,custom", "--config", "max_num_seqs=8", "-o", "json"]
    per_file = tmp_path / "per.jsonl"
    tight = runner.invoke(cli, [*base, "--ttft-p95", "0.5", "--tpot-p95", "0.03",
                                "--per-request", str(per_file)])
    assert tight.exit_code == 0, tight.output
    loose = runner.invoke(cli, [*base, "--ttft-p95", "60", "--tpot-p95", "1"])
    assert loose.exit_code == 0, loose.output
    rows_t = {c["name"]: c for c in json.loads(tight.stdout)["configurations"]}
    rows_l = {c["name"]: c for c in json.loads(loose.stdout)["configurations"]}
    for name, row in rows_t.items():
        assert 0.0 <= row["slo_attainment"] <= 1.0
        assert row["goodput_requests_per_second"] <= row["throughput_requests_per_second"] + 1e-9
        assert rows_l[name]["goodput_requests_per_second"] >= row["goodput_requests_per_second"]
    # Eight sequences at 8x the recorded rate queue for seconds: the tight TTFT target is
    # missed by many more requests than under vLLM's defaults.
    assert rows_t["custom"]["slo_attainment"] < rows_t["defaults"]["slo_attainment"]
    lines = [json.loads(x) for x in per_file.read_text().splitlines()]
    assert len(lines) == 2 * 300
    for name in ("defaults", "custom"):
        mine = [x for x in lines if x["config"] == name]
        met = sum(x["met_slo"] for x in mine)
        assert met / len(mine) == pytest.approx(rows_t[name]["slo_attainment"])
        assert all(x["met_slo"] == (x["ttft_seconds"] is not None and x["ttft_seconds"] <= 0.5
                                    and (x["tpot_seconds"] is None or x["tpot_seconds"] <= 0.03))
                   for x in mine)


def test_cli_refuses_a_bad_target() -> None:
    bad = CliRunner().invoke(cli, [
        "simulate", "--trace", str(AZURE), "--model", "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu", "H100", "--limit", "10", "--score-sample", "0", "--ttft-p95", "-1"])
    assert bad.exit_code != 0
    assert "--ttft-p95" in bad.output and "x>0" in bad.output
    assert "Traceback" not in bad.output
