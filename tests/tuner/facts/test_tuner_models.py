"""Model architectures from config.json, and the catalog."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvtune.tuner.errors import InvalidInput, UnknownName
from kvtune.tuner.facts.catalog import get_model, list_models
from kvtune.tuner.facts.models import ModelArchitecture

LLAMA_8B: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 128256,
}


def test_catalog_has_the_well_known_models() -> None:
    ids = list_models()
    assert len(ids) >= 12
    for wanted in (
        "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen3-8B",
        "Qwen/Qwen3-32B", "Qwen/Qwen3-235B-A22B", "mistralai/Mistral-7B-Instruct-v0.3",
        "mistralai/Mistral-Small-24B-Instruct-2501", "google/gemma-2-27b-it",
        "google/gemma-3-27b-it", "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V2-Lite",
    ):
        assert wanted in ids
    for model_id in ids:
        assert get_model(model_id).source.startswith("https://huggingface.co/")


@pytest.mark.parametrize(
    ("model_id", "groups"),
    [
        ("meta-llama/Llama-3.3-70B-Instruct", {("full", 80, None)}),
        # Llama 4: every 4th layer global (NoPE), the rest chunked at 8192.
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", {("full", 12, None), ("chunked", 36, 8192)}),
        # Gemma 2 alternates; Gemma 3 has 5 local layers per global one.
        ("google/gemma-2-27b-it", {("full", 23, None), ("sliding_window", 23, 4096)}),
        ("google/gemma-3-27b-it", {("full", 10, None), ("sliding_window", 52, 1024)}),
        # Qwen2.5 carries a window but use_sliding_window: false.
        ("Qwen/Qwen2.5-72B-Instruct", {("full", 80, None)}),
        ("deepseek-ai/DeepSeek-V3", {("mla", 61, None)}),
    ],
)
def test_layer_groups(model_id: str, groups: set[tuple[str, int, int | None]]) -> None:
    model = get_model(model_id)
    assert {(g.kind, g.num_layers, g.window_tokens) for g in model.layer_groups} == groups


def test_deepseek_v3_facts() -> None:
    model = get_model("deepseek-ai/DeepSeek-V3")
    assert model.mla is not None and model.mla.latent_dim == 576
    assert model.quantization is not None
    assert (model.quantization.method, model.quantization.weight_bits) == ("fp8", 8)
    assert model.quantization.weight_block_size == (128, 128)
    assert model.moe is not None and model.moe.num_experts == 256
    # 37B activated per token (model card); the estimate from shapes is within 10%.
    assert 33e9 < model.active_parameter_count < 41e9


@pytest.mark.parametrize(
    "model_id",
    [
        "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.3-70B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen3-8B",
        "Qwen/Qwen3-32B", "Qwen/Qwen3-235B-A22B", "mistralai/Mistral-7B-Instruct-v0.3",
        "mistralai/Mistral-Small-24B-Instruct-2501", "google/gemma-2-27b-it",
        "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V2-Lite",
    ],
)
def test_parameter_estimate_matches_the_published_count(model_id: str) -> None:
    published = get_model(model_id)
    folder = Path(__file__).resolve().parents[3] / "tuner" / "facts" / "data" / "models"
    doc = json.loads((folder / (model_id.replace("/", "--") + ".json")).read_text())
    estimated = ModelArchitecture.from_hf_config(doc["config"], model_id)
    assert estimated.parameter_count_estimated
    assert estimated.parameter_count == pytest.approx(published.parameter_count, rel=0.03)


def test_from_hf_config_names_the_missing_field() -> None:
    config = dict(LLAMA_8B)
    del config["num_hidden_layers"]
    with pytest.raises(InvalidInput, match="num_hidden_layers"):
        ModelArchitecture.from_hf_config(config, "x/y")
    config = dict(LLAMA_8B, num_attention_heads=0)
    with pytest.raises(InvalidInput, match="num_attention_heads"):
        ModelArchitecture.from_hf_config(config, "x/y")


def test_head_dim_derived_and_kv_heads_default_to_heads() -> None:
    config = dict(LLAMA_8B)
    del config["num_key_value_heads"]
    model = ModelArchitecture.from_hf_config(config, "x/mha")
    assert model.head_dim == 128 and model.num_kv_heads == 32


def test_mistral_v01_style_window_applies_to_every_layer() -> None:
    model = ModelArchitecture.from_hf_config(dict(LLAMA_8B, sliding_window=4096), "x/swa")
    assert [(g.kind, g.num_layers, g.window_tokens) for g in model.layer_groups] == [
        ("sliding_window", 32, 4096)]


def test_get_model_accepts_short_names_and_paths(tmp_path: Path) -> None:
    assert get_model("llama-3.3-70b-instruct").hf_id == "meta-llama/Llama-3.3-70B-Instruct"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(LLAMA_8B, _name_or_path="my/llama")))
    model = get_model(str(path))
    assert model.hf_id == "my/llama" and model.num_kv_heads == 8
    assert get_model(str(tmp_path)).num_hidden_layers == 32


def test_unknown_model_lists_close_matches() -> None:
    with pytest.raises(UnknownName) as info:
        get_model("Llama-3.3-70B")
    assert "meta-llama/Llama-3.3-70B-Instruct" in info.value.close_matches
    assert "Did you mean" in str(info.value)


def test_state_space_hybrids_with_a_wrong_pattern_are_refused_not_guessed() -> None:
    # Hybrid Mamba models are sized (tests/tuner/facts/test_tuner_mamba.py); a pattern that
    # does not name every layer, or one without the Mamba shapes, is refused.
    config = dict(LLAMA_8B, hybrid_override_pattern="M-M-M-M*-M-M-M-M*-")
    with pytest.raises(InvalidInput, match="num_hidden_layers") as info:
        ModelArchitecture.from_hf_config(config, "x/hybrid")
    assert info.value.field == "config.json:hybrid_override_pattern"
    config = dict(LLAMA_8B, hybrid_override_pattern="M*" * 16, model_type="nemotron_h")
    with pytest.raises(InvalidInput, match="Mamba") as info:
        ModelArchitecture.from_hf_config(config, "x/hybrid")
    assert info.value.field == "config.json:mamba_num_heads"
    config = dict(LLAMA_8B, hybrid_override_pattern="M*" * 16)
    with pytest.raises(InvalidInput, match="not modelled") as info:
        ModelArchitecture.from_hf_config(config, "x/hybrid")
    assert info.value.field == "config.json:model_type"
