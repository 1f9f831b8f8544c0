"""Quantization settings that live beside config.json, not in it (issue 14): AutoGPTQ's
``quantize_config.json``, AutoAWQ's ``quant_config.json`` and ModelOpt's
``hf_quant_config.json``, read as vLLM 0.33 reads them (``get_quant_config``,
``transformers_utils/config.py``). vLLM's own ModelConfig on the same files is in
tests/oracle/test_oracle_checkpoint_files.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.weights import weights_bytes_per_gpu, weights_load
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.presets import fixed_session_profile

# TheBloke/Llama-2-7B-GPTQ as first published (main branch, 2023): config.json without a
# quantization_config, the settings in AutoGPTQ's quantize_config.json.
LLAMA2_7B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.30.2",
    "use_cache": True, "vocab_size": 32000,
}
GPTQ_FILE: dict[str, Any] = {
    "bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": False, "sym": True,
    "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model",
}
# TheBloke/Llama-2-7B-AWQ's quant_config.json (AutoAWQ).
AWQ_FILE: dict[str, Any] = {"zero_point": True, "q_group_size": 128, "w_bit": 4,
                            "version": "GEMM"}
# A ModelOpt <= 0.29 FP8 export: hf_quant_config.json with an FP8 KV cache.
MODELOPT_FILE: dict[str, Any] = {
    "producer": {"name": "modelopt", "version": "0.27.0"},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                     "exclude_modules": ["lm_head"]},
}


def checkpoint(tmp_path: Path, config: dict[str, Any], **files: dict[str, Any]) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    for name, doc in files.items():
        (folder / name).write_text(json.dumps(doc))
    return folder


def _args(model: Any, weights: str = "auto") -> list[str]:
    pool = plan_pool(PlanRequest(model=model, gpu=get_gpu_class("L4"),
                                 weights_dtype=weights, profile=fixed_session_profile(4096)))
    return pool.plan.vllm_args()


def test_gptq_settings_only_in_quantize_config_json_are_read_and_rendered(
        tmp_path: Path) -> None:
    folder = checkpoint(tmp_path, LLAMA2_7B, **{"quantize_config.json": GPTQ_FILE})
    model = get_model(str(folder))
    q = model.quantization
    assert q is not None and (q.method, q.weight_bits, q.group_size) == ("gptq", 4, 128)
    assert q.config_file == "quantize_config.json"
    # Embeddings and lm_head at 16 bits, everything else 4 bits plus a scale and zero per
    # 128 weights: 2 * 32000 * 4096 * 2 B + 6.48 B params * 0.53125 B = 3.97 GB. The
    # published model.safetensors is 3.90 GB.
    embed = 2 * 32000 * 4096
    assert weights_bytes_per_gpu(model, "auto", 1) == (
        embed * 2 + int((model.parameter_count - embed) * 0.53125))
    assert 3.85e9 < weights_bytes_per_gpu(model, "auto", 1) < 4.0e9
    # vLLM reads quantize_config.json only when --quantization names the method.
    for weights in ("auto", "gptq", "int4"):
        assert "--quantization=gptq" in _args(model, weights)
    assert weights_load(model, "auto").method == "gptq"
    # The same config.json alone is a 16-bit checkpoint: no flag, 3.4x the bytes.
    plain = get_model(str(checkpoint(tmp_path / "plain", LLAMA2_7B)))
    assert plain.quantization is None
    assert not any(a.startswith("--quantization") for a in _args(plain))
    assert weights_bytes_per_gpu(plain, "auto", 1) == 2 * plain.parameter_count


def test_autoawq_quant_config_json_renders_its_method(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path, LLAMA2_7B, **{"quant_config.json": AWQ_FILE})
    model = get_model(str(folder / "config.json"))
    assert model.quantization is not None and model.quantization.method == "awq"
    assert model.quantization.group_size == 128
    assert "--quantization=awq" in _args(model)


def test_config_json_quantization_config_wins_over_a_file_beside_it(tmp_path: Path) -> None:
    # TheBloke's later uploads carry both; vLLM detects config.json's and needs no flag.
    config = {**LLAMA2_7B, "quantization_config": {**GPTQ_FILE, "quant_method": "gptq"}}
    model = get_model(str(checkpoint(tmp_path, config, **{"quantize_config.json": GPTQ_FILE})))
    assert model.quantization is not None and model.quantization.config_file is None
    assert not any(a.startswith("--quantization") for a in _args(model))


def test_modelopt_hf_quant_config_json_is_read_without_a_flag(tmp_path: Path) -> None:
    model = get_model(str(checkpoint(tmp_path, LLAMA2_7B,
                                     **{"hf_quant_config.json": MODELOPT_FILE})))
    q = model.quantization
    assert q is not None and (q.method, q.weight_bits, q.config_file) == ("modelopt", 8, None)
    assert q.kv_cache_dtype == "fp8_e4m3"  # kv_cache_quant_algo FP8: auto is fp8 KV
    assert not any(a.startswith("--quantization") for a in _args(model))


@pytest.mark.parametrize(("change", "field", "fix"), [
    ({"desc_act": True}, "quantize_config.json:desc_act", "desc_act false"),
    ({"sym": False}, "quantize_config.json:bits/sym", "symmetric 4- or 8-bit"),
    ({"bits": 3}, "quantize_config.json:bits/sym", "symmetric 4- or 8-bit"),
])
def test_gptq_settings_vllm_refuses_are_one_line(tmp_path: Path, change: dict[str, Any],
                                                 field: str, fix: str) -> None:
    folder = checkpoint(tmp_path, LLAMA2_7B,
                        **{"quantize_config.json": {**GPTQ_FILE, **change}})
    result = CliRunner().invoke(cli, ["plan", "-m", str(folder), "-g", "L4", "-o", "json"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and fix in lines[0], lines


def test_gptq_and_awq_files_without_a_setting_vllm_requires_are_one_line(
        tmp_path: Path) -> None:
    # AutoGPTQConfig.from_config reads sym with get_from_keys: no default, vLLM raises.
    gptq = {k: v for k, v in GPTQ_FILE.items() if k != "sym"}
    awq = {k: v for k, v in AWQ_FILE.items() if k != "zero_point"}
    for name, doc, field in (("quantize_config.json", gptq, "quantize_config.json:sym"),
                             ("quant_config.json", awq, "quant_config.json:zero_point")):
        folder = checkpoint(tmp_path / name, LLAMA2_7B, **{name: doc})
        result = CliRunner().invoke(cli, ["plan", "-m", str(folder), "-g", "L4"])
        assert result.exit_code == 1, result.output
        assert field in result.stderr and "without a default" in result.stderr


def test_desc_act_with_one_group_per_channel_is_served(tmp_path: Path) -> None:
    # group_size -1: activation order is a no-op, vLLM clears desc_act (gptq_utils.py).
    folder = checkpoint(tmp_path, LLAMA2_7B, **{"quantize_config.json": {
        **GPTQ_FILE, "desc_act": True, "group_size": -1}})
    assert "--quantization=gptq" in _args(get_model(str(folder)))


def test_an_unreadable_quantization_file_is_one_line(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path, LLAMA2_7B)
    (folder / "quantize_config.json").write_text("{not json")
    result = CliRunner().invoke(cli, ["plan", "-m", str(folder), "-g", "L4"])
    assert result.exit_code == 1
    assert "quantize_config.json" in result.stderr and "Traceback" not in result.output
