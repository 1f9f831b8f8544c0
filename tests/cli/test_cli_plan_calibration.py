"""`kvtune plan --calibration FILE` (cli/plan_calibration.py): the operator's model calibration
offline, from its ConfigMap as kubectl prints it; a file without the request's key fails in one
line naming what it has."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.tuner import model_calibration as mc

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ARGS = ["plan", "--model", MODEL, "--gpu", "H100", "--tpot-p95", "0.03", "-o", "json"]


def _configmap(tmp_path: Path, gpu: str = "H100") -> Path:
    cal = mc.ModelCalibration(
        key=mc.CalibrationKey(model=MODEL, gpu_class=gpu, vllm_version="0.33.0"),
        kv_tokens_scale=0.85, decode_efficiency=0.77, kv_reports=1, decode_tokens=5000)
    doc = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "kvtune-model-calibration"},
           "data": {mc.CONFIG_MAP_KEY: mc.CalibrationSet(calibrations=(cal,)).model_dump_json()}}
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_calibration_shrinks_the_kv_cache_and_the_batch(tmp_path: Path) -> None:
    runner = CliRunner()
    plain = json.loads(runner.invoke(cli, ARGS).output)
    result = runner.invoke(cli, [*ARGS, "--calibration", str(_configmap(tmp_path))])
    assert result.exit_code == 0, result.output
    calibrated = json.loads(result.output)
    ratio = calibrated["expected"]["num_gpu_blocks"] / plain["expected"]["num_gpu_blocks"]
    assert 0.84 < ratio < 0.88  # 0.85 of the KV budget (the batch's non-KV bytes shift it)
    # Steps 1.3x slower under the same TPOT SLO: fewer sequences decode together.
    assert calibrated["plan"]["max_num_seqs"] < plain["plan"]["max_num_seqs"]


def test_a_file_without_the_key_is_refused_naming_what_it_has(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [*ARGS, "--calibration", str(_configmap(tmp_path, "H200"))])
    assert result.exit_code == 2
    assert "has no calibration for meta-llama/Llama-3.1-8B-Instruct@H100/vllm-0.33.0/TP1" \
        in result.output
    assert "@H200/" in result.output


def test_a_file_that_is_no_calibration_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("calibrations: [{key: 3}]\n")
    result = CliRunner().invoke(cli, [*ARGS, "--calibration", str(bad)])
    assert result.exit_code == 2 and "not a model calibration" in result.output
