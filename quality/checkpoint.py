"""Does a checkpoint carry calibrated KV-cache scales? Read from its files, no torch needed.

What vLLM 0.33.0 does with them (``vllm/model_executor/layers/quantization/kv_cache.py``):
an attention layer starts with k_scale = v_scale = -1.0 ("not loaded", line 66-71); after
loading, positive checkpoint scales are used as they are (line 118-124), a lone ``kv_scale``
is used for both (line 130-140, remapped by ``maybe_remap_kv_scale_name`` in
``model_loader/weight_utils.py`` line 1745), and with none the scales are 1.0 (line 125-129,
with the warning "Using KV cache scaling factor 1.0 for fp8_e4m3", line 164-169). A checkpoint
without any quantization config never creates the parameters: ``set_default_quant_scales``
(``layers/attention/attention.py`` line 133) leaves 1.0. vLLM 0.33.0 has no flag that
computes scales at start-up: ``--calculate-kv-scales`` is gone (no ``calculate_kv_scales``
anywhere in the wheel), so without calibrated scales fp8 KV divides by 1.0 — values below
2⁻⁹ (0.00195) vanish and the smallest normal step is 2⁻⁶, fine for K and V of typical
magnitude and a loss for layers whose V is small. The per-token-head dtypes compute their
scales per (token, head) at write time (line 100-111) and need none.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from kvtune.tuner.facts import catalog
from kvtune.tuner.facts.kv_scheme import declared_kv_scheme

_LAYER = re.compile(r"layers\.(\d+)\.")
_SCALE_SUFFIXES = (".k_scale", ".v_scale", ".kv_scale", ".q_scale")


class CheckpointKVScales(BaseModel):
    """What a checkpoint says about its KV-cache scales."""

    model_config = ConfigDict(frozen=True)

    quantization_method: str | None = None  # quantization_config.quant_method
    kv_scheme: str | None = None  # e.g. "compressed-tensors float8 tensor", "modelopt FP8"
    scale_tensors: int = 0  # k_scale/v_scale/kv_scale tensors listed in the weight index
    layers_with_scales: int = 0
    layers: int | None = None  # num_hidden_layers from config.json
    index_read: bool = False  # a model.safetensors.index.json (or single file) was read

    @property
    def calibrated(self) -> bool:
        """Scales for every layer (or a declared KV scheme whose tensors we could not list)."""
        if self.layers and self.layers_with_scales >= self.layers:
            return True
        return self.kv_scheme is not None and not self.index_read

    def summary(self) -> str:
        if self.calibrated and self.scale_tensors:
            scheme = self.kv_scheme or "no declared scheme"
            return (f"calibrated KV scales in the checkpoint ({scheme}; k/v scales for "
                    f"{self.layers_with_scales} of {self.layers} layers): vLLM uses them "
                    "for fp8")
        if self.calibrated:
            return (f"the checkpoint declares a KV scheme ({self.kv_scheme}) but its tensor "
                    "index was not available to confirm the scales")
        if self.scale_tensors:
            return (f"KV scales for only {self.layers_with_scales} of {self.layers} layers: "
                    "vLLM uses 1.0 in the others")
        return ("no calibrated KV scales in the checkpoint: vLLM 0.33.0 stores fp8 KV with "
                "k_scale = v_scale = 1.0 (it has no flag that computes them at start-up)")


def kv_scheme(config: dict[str, Any], quantization_file: dict[str, Any] | None = None
              ) -> tuple[str | None, str | None]:
    """(quantization method, KV scheme in words) from a config.json's quantization_config (an
    older llm-compressor export's compression_config), else from ``quantization_file``: the
    file beside it that vLLM reads (ModelOpt's hf_quant_config.json). The scheme is parsed by
    the tuner's facts (``kvtune.tuner.facts.kv_scheme``), the one reader of it: the planner
    sizes ``--kv-cache-dtype auto`` from the same declaration."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        qc = config.get("compression_config")
    if not isinstance(qc, dict):
        qc = quantization_file
    if not isinstance(qc, dict):
        return None, None
    method = qc.get("quant_method")
    declared = declared_kv_scheme(qc)
    return (method if isinstance(method, str) else None,
            declared.words if declared is not None else None)


def scale_tensor_names(index: dict[str, Any]) -> list[str]:
    weight_map = index.get("weight_map")
    names = weight_map.keys() if isinstance(weight_map, dict) else index.keys()
    return sorted(n for n in names if n.endswith(_SCALE_SUFFIXES))


def read(model_dir: Path) -> CheckpointKVScales:
    """The evidence in ``model_dir`` (config.json, model.safetensors.index.json or a single
    model.safetensors' header)."""
    config_path = model_dir / "config.json" if model_dir.is_dir() else model_dir
    config = json.loads(config_path.read_text())
    found = catalog.quantization_file(config, lambda name: _text(config_path.parent / name),
                                      str(config_path.parent))
    method, scheme = kv_scheme(config, found[1] if found else None)
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) \
        else config
    layers = text_config.get("num_hidden_layers")
    names: list[str] = []
    index_read = False
    root = config_path.parent
    index_path = root / "model.safetensors.index.json"
    if index_path.exists():
        names = scale_tensor_names(json.loads(index_path.read_text()))
        index_read = True
    elif (root / "model.safetensors").exists():
        names = scale_tensor_names(safetensors_header(root / "model.safetensors"))
        index_read = True
    kv_names = [n for n in names if not n.endswith(".q_scale")]
    layer_ids = {int(m.group(1)) for n in kv_names if (m := _LAYER.search(n))}
    return CheckpointKVScales(
        quantization_method=method, kv_scheme=scheme, scale_tensors=len(kv_names),
        layers_with_scales=len(layer_ids), layers=layers if isinstance(layers, int) else None,
        index_read=index_read)


def _text(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (tensor names, dtypes, shapes)."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header
