"""A model's ConfigMap (``spec.model.config.configMapRef``) may carry, beside its config.json,
the quantization file vLLM reads when config.json has none (issue 14): the operator plans
such a GPTQ checkpoint at 4 bits with ``--quantization=gptq``, as ``kvtune plan`` does on the
folder. (``resolve_model`` reads the ConfigMap's data and hands it to
``model_from_config_map``.)"""

from __future__ import annotations

import json

import pytest

from kvtune.operator.rollout.plan import model_from_config_map
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.weights import weights_bytes_per_gpu, weights_load

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "torch_dtype": "float16",
    "vocab_size": 32000,
}
GPTQ = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def test_a_quantize_config_json_key_beside_config_json_is_read() -> None:
    data = {"config.json": json.dumps(CONFIG), "quantize_config.json": json.dumps(GPTQ)}
    model = model_from_config_map("org/llama-2-7b-gptq", data, "llm", "llama-gptq",
                                  "config.json")
    assert model.quantization is not None and model.quantization.weight_bits == 4
    assert weights_load(model, "auto").vllm_args() == ["--quantization=gptq"]
    plain = model_from_config_map("org/llama-2-7b", {"config.json": json.dumps(CONFIG)},
                                  "llm", "llama", "config.json")
    assert weights_bytes_per_gpu(model, "auto", 1) < 0.32 * weights_bytes_per_gpu(
        plain, "auto", 1)


def test_a_bad_quantization_key_names_the_configmap() -> None:
    data = {"config.json": json.dumps(CONFIG), "quantize_config.json": "[1, 2]"}
    with pytest.raises(InvalidInput) as err:
        model_from_config_map("m", data, "llm", "llama-gptq", "config.json")
    assert "configmap/llama-gptq" in str(err.value) and "quantize_config.json" in str(err.value)
    with pytest.raises(LookupError, match=r"has no key 'config\.json'"):
        model_from_config_map("m", {"other": "{}"}, "llm", "llama", "config.json")
