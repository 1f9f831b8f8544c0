"""The one parser of a checkpoint's declared KV-cache scheme (``facts/kv_scheme.py``): what
vLLM 0.33 serves ``--kv-cache-dtype auto`` at, the scheme in words for the quality report, and
a scheme vLLM refuses carried as its one-line error (the planner raises it, the quality report
still describes the checkpoint). vLLM's own resolution: tests/oracle/
test_oracle_checkpoint_files.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvtune.tuner.facts.kv_scheme import declared_kv_scheme, method_name

_FP8_TENSOR = {"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": True,
               "dynamic": False}


@pytest.mark.parametrize(("q", "words", "auto_dtype"), [
    ({"quant_method": "compressed-tensors", "kv_cache_scheme": _FP8_TENSOR},
     "compressed-tensors float8 tensor", "fp8"),
    ({"quant_method": "compressed_tensors",
      "kv_cache_scheme": {**_FP8_TENSOR, "strategy": "attn_head"}},
     "compressed-tensors float8 attn_head", "fp8"),
    ({"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}, "modelopt FP8", "fp8_e4m3"),
    ({"quant_method": "modelopt", "kv_cache_quant_algo": "NVFP4"}, "modelopt NVFP4", "nvfp4"),
    # ModelOpt 0.31+: a scheme mapping in config.json (no strategy key).
    ({"producer": {"name": "modelopt"}, "quant_algo": "FP8",
      "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}},
     "modelopt float8", "fp8_e4m3"),
    # ModelOpt <= 0.29: hf_quant_config.json's inner quantization block.
    ({"producer": {"name": "modelopt", "version": "0.27.0"},
      "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}},
     "modelopt FP8", "fp8_e4m3"),
    # vLLM maps an unknown ModelOpt algo to auto: declared, served 16-bit.
    ({"quant_method": "modelopt", "kv_cache_quant_algo": "INT8"}, "modelopt INT8", None),
    # Declared on a method whose config vLLM reads no KV scheme from: auto stays 16-bit.
    ({"quant_method": "fp8", "kv_cache_scheme": _FP8_TENSOR}, "fp8 float8 tensor", None),
])
def test_a_declared_scheme_in_words_and_as_vllm_serves_auto(
        q: dict[str, Any], words: str, auto_dtype: str | None) -> None:
    declared = declared_kv_scheme(q)
    assert declared is not None and declared.refusal is None
    assert (declared.words, declared.auto_dtype) == (words, auto_dtype)


def test_no_declaration_is_none() -> None:
    assert declared_kv_scheme({"quant_method": "gptq", "bits": 4}) is None
    assert declared_kv_scheme({"quant_method": "modelopt", "kv_cache_quant_algo": ""}) is None
    assert declared_kv_scheme({"quant_method": "compressed-tensors"}) is None


def test_a_config_only_in_text_config_is_not_read_by_vllms_resolver() -> None:
    q = {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}
    declared = declared_kv_scheme(q, method_name(q), top_level=False)
    assert declared is not None and declared.words == "modelopt FP8"
    assert declared.auto_dtype is None


@pytest.mark.parametrize(("scheme", "field"), [
    ({**_FP8_TENSOR, "num_bits": 4, "type": "int"}, "quantization_config.kv_cache_scheme"),
    ({**_FP8_TENSOR, "strategy": "channel"}, "quantization_config.kv_cache_scheme.strategy"),
])
def test_a_refused_scheme_is_described_and_carries_its_error(
        scheme: dict[str, Any], field: str) -> None:
    declared = declared_kv_scheme({"quant_method": "compressed-tensors",
                                   "kv_cache_scheme": scheme})
    assert declared is not None and declared.auto_dtype is None
    assert declared.words.startswith("compressed-tensors ")
    assert declared.refusal is not None and declared.refusal.field == field
    assert "\n" not in str(declared.refusal)
