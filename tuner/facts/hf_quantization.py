"""A pre-quantized checkpoint's quantization config read as vLLM 0.33 reads it: the method,
the bits per weight, the layers left in 16 bits, and the KV-cache dtype it implies
(``CheckpointQuantization``). Part of ``hf_config``'s parsing of a ``config.json``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.kv_scheme import declared_kv_scheme, modelopt_export
from kvtune.tuner.facts.models import QUANTIZATION_FILES, CheckpointQuantization


def _unconverted_layers(q: Mapping[str, Any], num_layers: int) -> tuple[int, int]:
    """(layers whose attention, layers whose dense MLP) a quantized checkpoint left in 16 bits,
    from ``modules_to_not_convert`` / ``ignored_layers`` / ``ignore`` entries such as
    ``model.layers.0.self_attn.q_proj`` or ``model.layers.*.self_attn``."""
    entries: list[str] = []
    for key in ("modules_to_not_convert", "ignored_layers", "ignore"):
        value = q.get(key)
        if isinstance(value, list):
            entries += [str(v) for v in value]
    attention: set[int] = set()
    mlp: set[int] = set()
    for entry in entries:
        match = re.search(r"layers\.(\d+|\*)\.(self_attn|mlp)(\.[a-z_]+)?", entry)
        if match is None or (match.group(3) or "").startswith((".router", ".gate.")):
            continue
        layers = range(num_layers) if match.group(1) == "*" else [int(match.group(1))]
        (attention if match.group(2) == "self_attn" else mlp).update(
            i for i in layers if i < num_layers)
    return len(attention), len(mlp)

# What vLLM 0.33's config classes read with get_from_keys (required; any one key of a group).
_GPTQ_SETTINGS: tuple[tuple[str, ...], ...] = (("bits",), ("group_size",), ("desc_act",),
                                               ("sym",))
_AWQ_SETTINGS: tuple[tuple[str, ...], ...] = (("w_bit", "bits"), ("q_group_size", "group_size"),
                                              ("zero_point",))
_REQUIRED_SETTINGS: dict[str, tuple[tuple[str, ...], ...]] = {
    "gptq": _GPTQ_SETTINGS, "auto_gptq": _GPTQ_SETTINGS, "gptq_marlin": _GPTQ_SETTINGS,
    "awq": _AWQ_SETTINGS, "auto_awq": _AWQ_SETTINGS, "awq_marlin": _AWQ_SETTINGS,
}
# ModelOpt's quant_algo -> vLLM's method (model_arch_config_convertor.py
# _normalize_quantization_config) and bits per weight.
_MODELOPT_ALGOS: dict[str, tuple[str, int]] = {
    "FP8": ("modelopt", 8), "FP8_PER_CHANNEL_PER_TOKEN": ("modelopt", 8),
    "FP8_PB_WO": ("modelopt", 8), "NVFP4": ("modelopt_fp4", 4),
}


def _modelopt_method(q: Mapping[str, Any]) -> tuple[str, int] | None:
    """(method, bits) of a ModelOpt config (``producer.name: modelopt`` or the legacy
    ``quantization.modelopt_quant_config``), as vLLM normalises it; None: not ModelOpt."""
    if not modelopt_export(q):
        return None
    inner = q.get("quantization")
    algo = inner.get("quant_algo") if isinstance(inner, Mapping) else None
    if algo is None:
        return None
    found = _MODELOPT_ALGOS.get(str(algo).upper())
    if found is None:
        # vLLM raises "Unknown ModelOpt quant algo" (MIXED_PRECISION's layers are per file).
        raise InvalidInput(
            "quantization_config.quantization.quant_algo", algo,
            f"kvtune sizes ModelOpt {', '.join(_MODELOPT_ALGOS)} checkpoints; this one's "
            "weights cannot be sized: pin kv_cache_memory_bytes or use another checkpoint")
    return found


def _kv_cache_dtype(q: Mapping[str, Any], method: str, top_level: bool
                    ) -> tuple[str | None, str | None]:
    """What vLLM 0.33 serves ``--kv-cache-dtype auto`` at on a checkpoint with this
    quantization config (None: the model's 16-bit dtype), and the declared scheme in words
    when vLLM serves it; a scheme vLLM refuses is refused here. The parsing and vLLM's
    rules: ``kv_scheme.declared_kv_scheme``."""
    declared = declared_kv_scheme(q, method, top_level)
    if declared is None:
        return None, None
    if declared.refusal is not None:
        raise declared.refusal
    if declared.auto_dtype is None:
        return None, None
    return declared.auto_dtype, declared.words


def quantization_facts(cfg: Mapping[str, Any], num_layers: int,
                  quantization_file: tuple[str, Mapping[str, Any]] | None = None,
                  top_level: bool = True) -> CheckpointQuantization | None:
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping):
        # Older llm-compressor exports name it compression_config; vLLM reads that when
        # quantization_config is absent (weight_utils.get_quant_config).
        q = cfg.get("compression_config")
    config_file: str | None = None
    if not isinstance(q, Mapping) and quantization_file is not None:
        name, q = quantization_file
        method_of_file, read_unasked = QUANTIZATION_FILES[name]
        if "quant_method" not in q and _modelopt_method(q) is None:
            # AutoGPTQ/AutoAWQ files name no method: AutoAWQ's keys (w_bit, zero_point) say
            # AWQ in either file name, else the file name says it.
            awq = "w_bit" in q or "zero_point" in q
            q = {**q, "quant_method": "awq" if awq else method_of_file}
        config_file = None if read_unasked else name
        top_level = True
    if not isinstance(q, Mapping):
        return None
    modelopt = _modelopt_method(q)
    method = modelopt[0] if modelopt else str(q.get("quant_method", "unknown")).lower()
    method = method.replace("compressed_tensors", "compressed-tensors")
    bits = modelopt[1] if modelopt else q.get("bits") or q.get("w_bit") or q.get("weight_bits")
    experts_only = False
    if method in ("fp8", "fbgemm_fp8", "modelopt") or (
            isinstance(q.get("fmt"), str) and "e4m3" in str(q.get("fmt"))):
        bits = 8
    if method == "bitsandbytes":
        bits = 4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else bits
    if method == "mxfp4":
        # gpt-oss: the experts in MXFP4 (4-bit values, one 8-bit scale per 32), attention,
        # router, embeddings and lm_head left in 16 bits (its modules_to_not_convert).
        bits, experts_only = 4, True
    if method in ("awq", "gptq", "marlin") and bits is None:
        bits = 4
    if method == "compressed-tensors" and bits is None:
        groups = q.get("config_groups")
        if isinstance(groups, Mapping):
            for group in groups.values():
                w = group.get("weights") if isinstance(group, Mapping) else None
                if isinstance(w, Mapping) and isinstance(w.get("num_bits"), int):
                    bits = w["num_bits"]
                    break
    where = config_file or "config.json:quantization_config"
    if not isinstance(bits, int) or isinstance(bits, bool) or not 0 < bits <= 16:
        # Ignoring it would size a quantized checkpoint as a 16-bit one.
        raise InvalidInput(
            where, method,
            "kvtune cannot tell how many bits this checkpoint stores per weight (no bits, "
            "w_bit, load_in_4bit/8bit or fp8 format); add \"bits\" to its quantization_config",
        )
    required = _REQUIRED_SETTINGS.get(method, ())
    missing = tuple(" or ".join(keys) for keys in required if not any(k in q for k in keys))
    block = q.get("weight_block_size")
    gsize = q.get("group_size") or q.get("q_group_size")
    attention_layers, mlp_layers = _unconverted_layers(q, num_layers)
    kv_cache_dtype, kv_cache_scheme = _kv_cache_dtype(q, method, top_level)
    return CheckpointQuantization(
        method=method,
        weight_bits=bits,
        experts_only=experts_only,
        unquantized_attention_layers=attention_layers,
        unquantized_mlp_layers=mlp_layers,
        weight_block_size=tuple(int(b) for b in block) if isinstance(block, list) else None,
        group_size=int(gsize) if isinstance(gsize, int) and gsize > 0 else None,
        config_file=config_file,
        group_activation_order=bool(q.get("desc_act")) and gsize != -1,
        symmetric=q.get("sym") is not False,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_scheme=kv_cache_scheme,
        missing_settings=missing,
    )
