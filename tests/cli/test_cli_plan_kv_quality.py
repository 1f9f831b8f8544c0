"""`kvtune plan --kv-quality-report`: the planner gated on a `kvtune quality` report."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvtune.cli.main import cli

ARTICLE = ["plan", "-m", "meta-llama/Llama-3.3-70B-Instruct", "-g", "H200",
           "--weights-dtype", "fp8", "--context-tokens", "4096", "-o", "json"]


def _report(tmp_path: Path, fp8_kl: float) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({
        "schema": "kvtune.io/kv-quality/v1", "model": "meta-llama/Llama-3.3-70B-Instruct",
        "weights": "checkpoint", "checkpoint": {"layers": 80, "layers_with_scales": 0},
        "measurements": [
            {"dtype": "fp8", "kl_mean": fp8_kl, "top1_agreement": 0.97,
             "attention_error_max": 0.08, "attention_error_worst_layer": 3},
            {"dtype": "int8_per_token_head", "kl_mean": 2e-4, "top1_agreement": 0.995,
             "attention_error_max": 0.01, "attention_error_worst_layer": 3}]}))
    return path


def _plan(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, [*ARTICLE, *args])
    assert result.exit_code == 0, result.output
    doc: dict[str, object] = json.loads(result.output)
    return doc


def test_a_report_excludes_fp8_and_the_reason_quotes_it(tmp_path: Path) -> None:
    doc = _plan("--kv-quality-report", str(_report(tmp_path, fp8_kl=0.03)))
    # The next 8-bit dtype in kvtune's preference, unmeasured: allowed, and said so.
    assert doc["plan"]["kv_cache_dtype"] == "fp8_per_token_head"  # type: ignore[index]
    reasons = doc["reasons"]
    reason = next(r for r in reasons if r["knob"] == "kv-cache-dtype")  # type: ignore[attr-defined]
    assert "quality: unverified: no KV-quality measurement" in reason["message"]
    assert "fp8 ruled out: measured KL 3.00e-02 nats vs 16-bit KV at k_scale = v_scale = 1.0" \
        in reason["message"]
    comparison = doc["kv_dtype_comparison"]
    rows = {r["kv_cache_dtype"]: r["quality"] for r in comparison}  # type: ignore[attr-defined]
    assert rows["fp8"]["code"] == "ExceedsKVQuantizationKL" and not rows["fp8"]["allowed"]
    assert rows["int8_per_token_head"]["code"] == "MeasuredWithinKL"
    assert rows["int4_per_token_head"]["code"] == "UnverifiedKVQuality"


def test_a_looser_limit_keeps_fp8(tmp_path: Path) -> None:
    doc = _plan("--kv-quality-report", str(_report(tmp_path, fp8_kl=0.03)),
                "--max-kv-quantization-kl", "0.05")
    assert doc["plan"]["kv_cache_dtype"] == "fp8"  # type: ignore[index]


def test_require_measurement_takes_the_measured_dtype(tmp_path: Path) -> None:
    doc = _plan("--kv-quality-report", str(_report(tmp_path, fp8_kl=0.03)),
                "--require-kv-measurement")
    assert doc["plan"]["kv_cache_dtype"] == "int8_per_token_head"  # type: ignore[index]


def test_require_measurement_without_a_report_keeps_16_bit() -> None:
    doc = _plan("--require-kv-measurement")
    assert doc["plan"]["kv_cache_dtype"] == "auto"  # type: ignore[index]
