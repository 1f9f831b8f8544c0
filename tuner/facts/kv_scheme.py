"""The KV-cache scheme a checkpoint's quantization config declares (llm-compressor's
``kv_cache_scheme``, ModelOpt's ``kv_cache_quant_algo`` / ``kv_cache_scheme``) and what vLLM
0.33 does with it. The one parser of this fact: the planner's facts (``models.py``: what
``--kv-cache-dtype auto`` serves) and the quality report's checkpoint evidence
(``kvtune.quality.checkpoint``: the scheme in words) both read it here.

- ModelOpt (``resolve_kv_cache_dtype_string`` / ``get_kv_cache_quant_algo_string`` in
  vllm/utils/torch_utils.py, on the top-level config only): ``kv_cache_scheme`` or
  ``kv_cache_quant_algo``, in the inner ``quantization`` block first; FP8 -> fp8_e4m3,
  NVFP4 -> nvfp4, a static float8 scheme -> fp8_e4m3, a 4-bit float scheme -> nvfp4,
  anything else -> auto (16-bit).
- compressed-tensors (``Attention.__init__``: a declared ``kv_cache_scheme`` makes auto fp8;
  ``CompressedTensorsKVCacheMethod.validate_kv_cache_scheme`` accepts only 8-bit float, per
  tensor or per attention head, and refuses the rest at start).
- Other methods: vLLM does not read a KV scheme from their config; auto stays 16-bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtune.tuner.errors import InvalidInput

# get_kv_cache_quant_algo_string's map (vllm/utils/torch_utils.py).
_MODELOPT_KV_DTYPES: dict[str, str] = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}


@dataclass(frozen=True)
class DeclaredKVScheme:
    """A KV-cache scheme declared in a checkpoint's quantization config."""

    method: str  # the quantization method as vLLM names it ("compressed-tensors", "modelopt")
    value: object  # the declaration as written (a scheme mapping or an algo name)
    # What vLLM 0.33 serves ``--kv-cache-dtype auto`` at: ``fp8`` / ``fp8_e4m3`` / ``nvfp4``;
    # None: the model's 16-bit dtype (vLLM ignores the declaration).
    auto_dtype: str | None
    # Set when vLLM 0.33 refuses the scheme at start: the one-line error to raise.
    refusal: InvalidInput | None = None

    @property
    def words(self) -> str:
        """e.g. ``compressed-tensors float8 tensor``, ``modelopt FP8``."""
        if isinstance(self.value, Mapping):
            parts = [f"{self.value.get('type')}{self.value.get('num_bits')}"]
            if self.value.get("strategy") is not None:
                parts.append(str(self.value.get("strategy")))
            return f"{self.method} {' '.join(parts)}"
        return f"{self.method} {self.value}"


def modelopt_export(q: Mapping[str, Any]) -> bool:
    """A ModelOpt export's config: its ``producer.name`` or the legacy
    ``quantization.modelopt_quant_config`` says so."""
    producer = q.get("producer")
    inner = q.get("quantization")
    return (isinstance(producer, Mapping) and producer.get("name") == "modelopt") or (
        isinstance(inner, Mapping) and "modelopt_quant_config" in inner)


def method_name(q: Mapping[str, Any]) -> str:
    """The quantization method as vLLM names it: a ModelOpt export is modelopt;
    ``compressed_tensors`` is spelled ``compressed-tensors``."""
    if modelopt_export(q):
        return "modelopt"
    return str(q.get("quant_method", "unknown")).lower().replace(
        "compressed_tensors", "compressed-tensors")


def declared_kv_scheme(q: Mapping[str, Any], method: str | None = None,
                       top_level: bool = True) -> DeclaredKVScheme | None:
    """The KV-cache scheme ``q`` (a quantization_config) declares, None when it declares none.
    ``method``: vLLM's name of the method (``method_name(q)`` when not given); ``top_level``:
    False for a config held only in a multimodal ``text_config``, which vLLM's resolver does
    not read."""
    method = method or method_name(q)
    if method.startswith("modelopt"):
        inner = q.get("quantization", q)
        inner = inner if isinstance(inner, Mapping) else q
        value = (inner.get("kv_cache_scheme") or q.get("kv_cache_scheme")
                 or inner.get("kv_cache_quant_algo") or q.get("kv_cache_quant_algo"))
        if value is None or value == "":
            return None
        return DeclaredKVScheme(method, value, _modelopt_dtype(value) if top_level else None)
    scheme = q.get("kv_cache_scheme")
    if method == "compressed-tensors" and scheme is not None:
        return _compressed_tensors(method, scheme)
    value = scheme or q.get("kv_cache_quant_algo")
    if value is None or value == "":
        return None
    return DeclaredKVScheme(method, value, None)


def _modelopt_dtype(value: object) -> str | None:
    algo = value
    if isinstance(algo, Mapping):
        if (algo.get("dynamic") is False and algo.get("num_bits") == 8
                and algo.get("type") == "float"):
            algo = "fp8"
        elif algo.get("num_bits") == 4 and algo.get("type") == "float":
            algo = "nvfp4"
        else:
            return None
    return _MODELOPT_KV_DTYPES.get(algo.lower()) if isinstance(algo, str) else None


def _compressed_tensors(method: str, scheme: object) -> DeclaredKVScheme:
    if not isinstance(scheme, Mapping) or scheme.get("type") != "float" or (
            scheme.get("num_bits") != 8):
        return DeclaredKVScheme(method, scheme, None, InvalidInput(
            "quantization_config.kv_cache_scheme",
            dict(scheme) if isinstance(scheme, Mapping) else scheme,
            "vLLM 0.33 serves only 8-bit float KV-cache schemes (num_bits 8, type float); "
            "use a checkpoint with an fp8 KV scheme or none"))
    if scheme.get("strategy") not in ("tensor", "attn_head"):
        return DeclaredKVScheme(method, scheme, None, InvalidInput(
            "quantization_config.kv_cache_scheme.strategy", scheme.get("strategy"),
            "vLLM 0.33 serves fp8 KV scales per tensor or per attention head only; use such a "
            "checkpoint"))
    return DeclaredKVScheme(method, scheme, "fp8")
