"""vLLM 0.33.0's own config code on the checkpoints kvtune reads (issue 14): whether vLLM
finds a quantization file beside config.json without a flag, and what ``--kv-cache-dtype``
it resolves on a checkpoint that declares a KV-cache scheme. Runs on CPU: vLLM's ModelConfig
with a user-given method, its HF config loader, its ModelOpt normalisation and
``resolve_kv_cache_dtype_string`` (the quantization kernels themselves do not import without
CUDA; the compressed-tensors rule that lives in the Attention layer is read from the wheel).
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Any

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

_REPO_TESTS = Path(__file__).resolve().parents[1]


def _fixtures() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "qfiles", _REPO_TESTS / "tuner" / "facts" / "test_tuner_quantization_files.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kv_scheme_fixtures() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "kvscheme", _REPO_TESTS / "tuner" / "planner" / "test_tuner_checkpoint_kv_scheme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _folder(tmp_path: Path, name: str, config: dict[str, Any], **files: dict[str, Any]
            ) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for file, doc in files.items():
        (folder / file).write_text(json.dumps(doc))
    return folder


def _vllm_resolves(folder: Path, kv_cache_dtype: str) -> tuple[str | None, str]:
    """(the quantization method vLLM normalises from the checkpoint's config, the cache dtype
    it resolves ``kv_cache_dtype`` to), through vLLM's own functions."""
    import vllm.config  # noqa: F401  (import order: the convertor module needs it first)
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )
    from vllm.utils.torch_utils import resolve_kv_cache_dtype_string

    hf_config = get_config(str(folder), trust_remote_code=False)
    quant = ModelArchConfigConvertorBase._normalize_quantization_config(
        None, hf_config)  # type: ignore[arg-type]  # a method that reads only its argument
    model_config: Any = types.SimpleNamespace(hf_config=hf_config)
    return ((quant or {}).get("quant_method"),
            resolve_kv_cache_dtype_string(kv_cache_dtype, model_config))


def test_vllm_reads_quantize_config_json_only_with_the_flag_kvtune_renders(
        vllm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from vllm.config import ModelConfig

    q = _fixtures()
    folder = _folder(tmp_path, "gptq", q.LLAMA2_7B, **{"quantize_config.json": q.GPTQ_FILE})
    # Without --quantization vLLM sees an unquantized float16 model (it would then fail to
    # load the packed qweight tensors); kvtune's flag makes it read the file.
    assert ModelConfig(model=str(folder), skip_tokenizer_init=True).quantization is None
    load = get_model(str(folder)).quantization
    assert load is not None and load.config_file == "quantize_config.json"
    flagged = ModelConfig(model=str(folder), skip_tokenizer_init=True,
                          quantization=load.method)
    assert flagged.quantization == "gptq"
    # The file name vLLM's AutoGPTQConfig looks for, and the keys its from_config reads
    # (importing the class pulls CUDA kernels: read the wheel's source).
    source = (Path(vllm.__file__).parent / "model_executor" / "layers" / "quantization"
              / "auto_gptq.py").read_text()
    assert re.search(r'def get_config_filenames.*?return \["quantize_config\.json"\]', source,
                     re.S)
    for key in ("bits", "group_size", "desc_act", "sym"):
        assert f'cls.get_from_keys(config, ["{key}"])' in source


def test_vllm_resolves_auto_on_a_modelopt_checkpoint_as_kvtune_sizes_it(
        vllm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    q, kv = _fixtures(), _kv_scheme_fixtures()
    for name, folder in (
        ("legacy", _folder(tmp_path, "legacy", q.LLAMA2_7B,
                           **{"hf_quant_config.json": q.MODELOPT_FILE})),
        ("config.json", _folder(tmp_path, "embedded", kv.LLAMA_8B_MODELOPT)),
    ):
        method, resolved = _vllm_resolves(folder, "auto")
        model = get_model(str(folder))
        assert model.quantization is not None and model.quantization.method == method, name
        assert model.auto_kv_cache_dtype == resolved == "fp8_e4m3", name
        assert kv_bytes_per_token(model, "auto", 1) == kv_bytes_per_token(model, resolved, 1)
        # An explicit dtype passes through vLLM untouched: kvtune's 16-bit by name holds.
        assert _vllm_resolves(folder, "bfloat16")[1] == "bfloat16"


def test_compressed_tensors_kv_scheme_is_fp8_in_vllms_attention_layer(
        vllm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    kv = _kv_scheme_fixtures()
    folder = _folder(tmp_path, "ct", kv.LLAMA_8B_FP8_KV)
    method, resolved = _vllm_resolves(folder, "auto")
    # The engine args leave auto alone here; the Attention layer then turns it into fp8 when
    # the quantization config declares a kv_cache_scheme (and an explicit dtype wins).
    assert (method, resolved) == ("compressed-tensors", "auto")
    # (The layer's module imports CUDA kernels: read the wheel's source.)
    init = (Path(vllm.__file__).parent / "model_executor" / "layers" / "attention"
            / "attention.py").read_text()
    assert re.search(r'if kv_cache_scheme is not None and kv_cache_dtype == "auto":\s+'
                     r'kv_cache_dtype = "fp8"', init)
    model = get_model(str(folder))
    assert model.auto_kv_cache_dtype == "fp8"
    assert kv_bytes_per_token(model, "auto", 1) == kv_bytes_per_token(model, "fp8", 1)
