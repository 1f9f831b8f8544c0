"""The measurement end to end on the CPU: a small Llama-shaped model initialised from a
config.json (random weights: this proves the mechanics, not any model's quality), through
`kvtune quality` and through the calibration Job's entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.quality import measure
from kvtune.quality.run import TERMINATION_MESSAGE_BYTES, main_args
from kvtune.tuner.kv_quality import evidence_from_report

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False}


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY))
    return path


@pytest.fixture
def few_prompts(tmp_path: Path) -> Path:
    rows = [p for p in measure.calibration_prompts() if p.kind in ("chat", "code",
                                                                    "long-context")]
    picked = [next(p for p in rows if p.kind == k) for k in ("chat", "code", "long-context")]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "kind": p.kind, "text": p.text}) + "\n"
                            for p in picked))
    return path


def test_shipped_prompt_set_has_chat_code_and_long_context() -> None:
    prompts = measure.calibration_prompts()
    kinds = {p.kind for p in prompts}
    assert kinds == {"chat", "code", "long-context"}
    assert max(len(p.text) for p in prompts if p.kind == "long-context") > 8000


def test_kvtune_quality_on_a_random_init_model(tiny_config: Path, few_prompts: Path,
                                               tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = CliRunner().invoke(cli, [
        "quality", "--model", str(tiny_config), "--dtypes", "fp8,int8_per_token_head,"
        "int4_per_token_head", "--device", "cpu", "--max-prompt-tokens", "40",
        "--prompts", str(few_prompts), "--out-file", str(out), "--progress"])
    assert result.exit_code == 0, result.output
    assert "random weights initialised from config.json" in result.output
    assert "[kvtune quality] prompt 3/3" in result.stderr  # progress, forced off a terminal
    report = json.loads(out.read_text())
    assert report["weights"] == "random-init" and report["prompt_set"]["tokens"] == 120
    by = {m["dtype"]: m for m in report["measurements"]}
    for m in by.values():
        assert len(m["attention_error_per_layer"]) == 3
        assert m["kl_mean"] >= 0 and 0 <= m["top1_agreement"] <= 1
    # Fewer bits, larger error, in every layer.
    for layer in range(3):
        errs = [by[d]["attention_error_per_layer"][layer]
                for d in ("int8_per_token_head", "fp8", "int4_per_token_head")]
        assert 0 < errs[0] < errs[1] < errs[2], errs
    assert by["int4_per_token_head"]["kl_mean"] > by["int8_per_token_head"]["kl_mean"]


def test_job_entry_point_writes_a_termination_message(tiny_config: Path, few_prompts: Path,
                                                      tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    code = main_args(["--model", str(tiny_config), "--dtypes", "fp8,nvfp4", "--device", "cpu",
                      "--max-prompt-tokens", "24", "--prompts", str(few_prompts),
                      "--revision", "abc123", "--termination-log", str(log)])
    assert code == 0
    text = log.read_text()
    assert len(text.encode()) <= TERMINATION_MESSAGE_BYTES
    report = json.loads(text)
    assert report["revision"] == "abc123"
    evidence = evidence_from_report(report, source="test")
    assert evidence.random_weights and {m.dtype for m in evidence.measurements} == {
        "fp8", "nvfp4"}


def test_bad_inputs_are_one_line_errors(tiny_config: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(cli, ["quality", "--model", str(tiny_config), "--dtypes", "fp9"])
    assert bad.exit_code != 0 and "'fp9' is not a KV dtype" in bad.output
    assert "Traceback" not in bad.output
    missing = runner.invoke(cli, ["quality", "--model", "/nonexistent/model"])
    assert missing.exit_code != 0 and "no such file or directory" in missing.output
    mla = tiny_config.parent / "mla.json"
    mla.write_text(json.dumps({**TINY, "kv_lora_rank": 512}))
    refused = runner.invoke(cli, ["quality", "--model", str(mla), "--device", "cpu"])
    assert refused.exit_code != 0 and "an MLA model" in refused.output
    assert "Traceback" not in refused.output
