"""A checkpoint that declares a KV-cache scheme (issue 14): vLLM 0.33 serves
``--kv-cache-dtype auto`` there at the scheme (fp8), so kvtune sizes auto so, never renders
auto for 16-bit KV (it names the dtype, which wins over the scheme), and refuses a scheme vLLM
refuses. vLLM's own resolution of the same files: tests/oracle/test_oracle_checkpoint_files.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import Pins, PlanPolicy
from kvtune.tuner.planner.presets import fixed_session_profile
from kvtune.tuner.simulator.engine import simulated_plan, vllm_default_plan

# An llm-compressor FP8 export of Llama 3.1 8B with an FP8 KV cache (the shape of
# RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 with kv_cache_scheme, as llm-compressor writes it).
_TENSOR = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None,
           "num_bits": 8, "observer": "minmax", "observer_kwargs": {}, "strategy": "tensor",
           "symmetric": True, "type": "float"}
LLAMA_8B_FP8_KV: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 128256,
    "quantization_config": {
        "config_groups": {"group_0": {"input_activations": _TENSOR, "output_activations": None,
                                      "targets": ["Linear"], "weights": _TENSOR}},
        "format": "float-quantized", "ignore": ["lm_head"], "kv_cache_scheme": _TENSOR,
        "quant_method": "compressed-tensors", "quantization_status": "compressed",
    },
}
# ModelOpt 0.31+: the scheme in config.json's quantization_config.
LLAMA_8B_MODELOPT: dict[str, Any] = {
    **{k: v for k, v in LLAMA_8B_FP8_KV.items() if k != "quantization_config"},
    "quantization_config": {"producer": {"name": "modelopt", "version": "0.33.0"},
                            "quant_algo": "FP8", "quant_method": "modelopt",
                            "kv_cache_scheme": {"dynamic": False, "num_bits": 8,
                                                "type": "float"},
                            "ignore": ["lm_head"]},
}
H100 = get_gpu_class("H100")
BF16_TOKEN = 32 * 2 * 8 * 128 * 2  # 131,072 bytes: 32 layers, K and V, 8 heads of 128


def _model(config: dict[str, Any]) -> ModelArchitecture:
    return ModelArchitecture.from_hf_config(config, "test/llama-8b-fp8-kv")


def _request(model: ModelArchitecture, **policy: Any) -> PlanRequest:
    return PlanRequest(model=model, gpu=H100, profile=fixed_session_profile(8192),
                       policy=PlanPolicy(**policy))


@pytest.mark.parametrize(("config", "scheme"), [(LLAMA_8B_FP8_KV, "fp8"),
                                                (LLAMA_8B_MODELOPT, "fp8_e4m3")])
def test_auto_is_sized_as_the_declared_scheme(config: dict[str, Any], scheme: str) -> None:
    model = _model(config)
    assert model.auto_kv_cache_dtype == scheme
    assert kv_bytes_per_token(model, "auto", 1) == kv_bytes_per_token(model, "fp8", 1) \
        == BF16_TOKEN // 2
    assert kv_bytes_per_token(model, "bfloat16", 1) == BF16_TOKEN
    # vLLM's defaults (no KV flag) get the fp8 cache: twice the tokens of 16-bit KV.
    defaults = vllm_default_plan(_request(model))
    assert defaults.kv_cache_dtype == "auto"
    sixteen = defaults.model_copy(update={"kv_cache_dtype": "bfloat16"})
    tokens = simulated_plan(_request(model), defaults, "defaults").engine.kv_cache_tokens
    tokens16 = simulated_plan(_request(model), sixteen, "bf16").engine.kv_cache_tokens
    assert tokens == pytest.approx(2 * tokens16, rel=0.01)


def test_sixteen_bit_kv_is_rendered_by_name_and_sized_at_16_bits() -> None:
    model = _model(LLAMA_8B_FP8_KV)
    pool = plan_pool(_request(model, lowest_kv_precision="bf16"))
    assert pool.plan.kv_cache_dtype == "bfloat16"
    assert "--kv-cache-dtype=bfloat16" in pool.plan.vllm_args()
    assert pool.expected.kv_bytes_per_token == BF16_TOKEN
    # Unconstrained, whatever is chosen is rendered by a name vLLM stores as sized.
    free = plan_pool(_request(model, lowest_kv_precision="fp8"))
    assert free.plan.kv_cache_dtype != "auto"
    assert free.expected.kv_bytes_per_token == kv_bytes_per_token(
        model, free.plan.kv_cache_dtype, 1)
    # The same shapes without the scheme keep auto for 16-bit, as before.
    plain = copy.deepcopy(LLAMA_8B_FP8_KV)
    del plain["quantization_config"]["kv_cache_scheme"]
    assert plan_pool(_request(_model(plain), lowest_kv_precision="bf16")
                     ).plan.kv_cache_dtype == "auto"


def test_a_pinned_auto_is_the_scheme_and_says_so() -> None:
    model = _model(LLAMA_8B_FP8_KV)
    pool = plan_pool(_request(model, pins=Pins(kv_cache_dtype="auto")))
    assert pool.plan.kv_cache_dtype == "auto"
    assert pool.expected.kv_bytes_per_token == BF16_TOKEN // 2
    assert any("kv-cache-dtype auto on test/llama-8b-fp8-kv is fp8" in w and "pin bfloat16" in w
               for w in pool.warnings)


def test_the_dtype_table_compares_against_16_bit_by_name(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B_FP8_KV))
    result = CliRunner().invoke(cli, ["plan", "-m", str(tmp_path), "-g", "H100", "-o", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["kv_cache_dtype"]: r for r in json.loads(result.stdout)["kv_dtype_comparison"]}
    assert "auto" not in rows  # it is fp8 here; fp8's row speaks for it
    assert rows["bfloat16"]["kv_bytes_per_token"] == BF16_TOKEN
    assert rows["bfloat16"]["vs_16bit"] == 1.0 and rows["fp8"]["vs_16bit"] > 1.9
    # The gate's verdict in the table quotes the checkpoint's scales for fp8 only.
    assert "the checkpoint carries calibrated KV scales" in rows["fp8"]["quality"]["detail"]
    assert "calibrated" not in rows["int8_per_token_head"]["quality"]["detail"]


@pytest.mark.parametrize(("scheme", "field"), [
    ({**_TENSOR, "num_bits": 4, "type": "int"}, "quantization_config.kv_cache_scheme"),
    ({**_TENSOR, "strategy": "channel"}, "quantization_config.kv_cache_scheme.strategy"),
])
def test_a_scheme_vllm_refuses_is_refused(scheme: dict[str, Any], field: str) -> None:
    config = copy.deepcopy(LLAMA_8B_FP8_KV)
    config["quantization_config"]["kv_cache_scheme"] = scheme
    with pytest.raises(InvalidInput) as err:
        _model(config)
    assert err.value.field == field and "\n" not in str(err.value)


def test_an_unknown_modelopt_kv_algo_falls_back_to_16_bit_as_vllm_does() -> None:
    config = copy.deepcopy(LLAMA_8B_MODELOPT)
    config["quantization_config"]["kv_cache_scheme"] = {"num_bits": 8, "type": "int"}
    model = _model(config)
    assert model.auto_kv_cache_dtype is None
    assert kv_bytes_per_token(model, "auto", 1) == BF16_TOKEN


def test_an_older_compression_config_is_read_as_vllm_reads_it() -> None:
    # llm-compressor's first exports: the same settings under compression_config.
    config = copy.deepcopy(LLAMA_8B_FP8_KV)
    config["compression_config"] = config.pop("quantization_config")
    model = _model(config)
    assert model.quantization is not None and model.quantization.weight_bits == 8
    assert model.auto_kv_cache_dtype == "fp8"


@pytest.mark.parametrize(("config", "words"), [
    (LLAMA_8B_FP8_KV, "compressed-tensors float8 tensor"), (LLAMA_8B_MODELOPT, "modelopt float8")])
def test_unmeasured_fp8_quotes_the_checkpoints_calibrated_scales(
        config: dict[str, Any], words: str) -> None:
    # Issue 15: the checkpoint's own evidence is shown; fp8 stays unverified by measurement.
    pool = plan_pool(_request(_model(config), lowest_kv_precision="fp8"))
    assert pool.plan.kv_cache_dtype == "fp8"
    reason = next(r for r in pool.reasons if r.knob == "kv-cache-dtype").message
    assert "quality: unverified: by measurement (no KV-quality measurement" in reason
    assert f"the checkpoint carries calibrated KV scales (its config declares the KV scheme " \
           f"{words}; vLLM uses them instead of 1.0)" in reason
    # The same shapes without the scheme: no such claim.
    plain = copy.deepcopy(config)
    plain["quantization_config"].pop("kv_cache_scheme")
    bare = plan_pool(_request(_model(plain), lowest_kv_precision="fp8"))
    reason = next(r for r in bare.reasons if r.knob == "kv-cache-dtype").message
    assert "quality: unverified: no KV-quality measurement" in reason
    assert "calibrated" not in reason
