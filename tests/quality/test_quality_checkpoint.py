"""Checkpoint evidence: the KV scheme in config.json, the k/v scale tensors in the index and
in the safetensors themselves, and the scales vLLM would use per layer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvtune.quality import checkpoint
from kvtune.quality.measure import LoadedModel, checkpoint_scales, layer_scales

CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64}


def _write(path: Path, config: dict[str, object], index: dict[str, object] | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if index is not None:
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    return path


def test_bf16_checkpoint_has_no_scales(tmp_path: Path) -> None:
    ev = checkpoint.read(_write(tmp_path, CONFIG, {"model.layers.0.self_attn.k_proj.weight":
                                                   "a.safetensors"}))
    assert (ev.quantization_method, ev.kv_scheme, ev.scale_tensors) == (None, None, 0)
    assert not ev.calibrated
    assert "k_scale = v_scale = 1.0" in ev.summary()


def test_compressed_tensors_kv_scheme_with_scales_for_every_layer(tmp_path: Path) -> None:
    config = {**CONFIG, "quantization_config": {
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "tensor",
                            "symmetric": True}}}
    index = {f"model.layers.{i}.self_attn.{s}_scale": "m.safetensors"
             for i in range(2) for s in ("k", "v", "q")}
    ev = checkpoint.read(_write(tmp_path, config, index))
    assert ev.kv_scheme == "compressed-tensors float8 tensor"
    assert (ev.scale_tensors, ev.layers_with_scales, ev.layers) == (4, 2, 2)
    assert ev.calibrated


def test_scales_for_some_layers_only_are_not_calibrated(tmp_path: Path) -> None:
    index = {"model.layers.1.self_attn.k_proj.k_scale": "m", "model.layers.1.self_attn."
             "v_proj.v_scale": "m"}
    ev = checkpoint.read(_write(tmp_path, {**CONFIG, "quantization_config": {
        "quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}}, index))
    assert ev.kv_scheme == "modelopt FP8" and ev.layers_with_scales == 1
    assert not ev.calibrated
    assert "only 1 of 2 layers" in ev.summary()


def test_scales_read_from_safetensors_as_vllm_applies_them(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    model_dir = _write(tmp_path, CONFIG, None)
    save_file({
        "model.layers.0.self_attn.k_scale": np.array(0.02, np.float32),
        "model.layers.0.self_attn.v_scale": np.array(0.005, np.float32),
        "model.layers.1.self_attn.kv_scale": np.array([0.03], np.float32),  # deprecated form
        "model.layers.0.self_attn.k_proj.weight": np.zeros((2, 2), np.float32),
    }, str(model_dir / "model.safetensors"))
    ev = checkpoint.read(model_dir)
    assert ev.index_read and ev.layers_with_scales == 2 and ev.calibrated
    loaded = LoadedModel(model=None, tokenizer=None, name="t", weights="checkpoint",
                         evidence=ev, scales=checkpoint_scales(model_dir),
                         activation_dtype="bfloat16", device="cpu")
    # No q_scale in the checkpoint: vLLM uses k_scale for Q (kv_cache.py line 147).
    assert layer_scales(loaded, 0) == pytest.approx((0.02, 0.005, 0.02))
    # A lone kv_scale is used for both K and V.
    assert layer_scales(loaded, 1) == pytest.approx((0.03, 0.03, 0.03))
    # A layer without scales: 1.0 everywhere.
    assert layer_scales(loaded, 5) == (1.0, 1.0, 1.0)


def test_the_scheme_is_read_by_the_tuners_parser_beside_config_json(tmp_path: Path) -> None:
    # A ModelOpt <= 0.29 export keeps its KV scheme in hf_quant_config.json, which vLLM reads
    # unasked; the quality report reads the same file as the planner's facts.
    model_dir = _write(tmp_path, CONFIG, None)
    (model_dir / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.27.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}))
    ev = checkpoint.read(model_dir)
    assert ev.kv_scheme == "modelopt FP8"
    assert ev.calibrated  # declared, and no index to contradict it
    assert "declares a KV scheme (modelopt FP8)" in ev.summary()


def test_a_scheme_vllm_refuses_is_still_described(tmp_path: Path) -> None:
    # The planner refuses it (the one-line error); the quality report still says what the
    # checkpoint declares.
    ev = checkpoint.read(_write(tmp_path, {**CONFIG, "quantization_config": {
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": {"type": "int", "num_bits": 4, "strategy": "tensor"}}}, None))
    assert ev.kv_scheme == "compressed-tensors int4 tensor"


def test_quality_and_the_planner_agree_on_the_declaration() -> None:
    from kvtune.tuner.facts.models import ModelArchitecture

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
              "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 4096}
    for q, declared in (
            ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
             True),
            ({"quant_method": "modelopt", "quant_algo": "FP8"}, False)):
        model = ModelArchitecture.from_hf_config({**config, "quantization_config": q}, "t/m")
        _, words = checkpoint.kv_scheme({"quantization_config": q})
        assert (words is not None) is declared is (model.auto_kv_cache_dtype is not None)
