"""The model catalog: real ``config.json`` facts of well-known models, shipped as data
(``tuner/facts/data/models/*.json``, one file per model, each with the URL it came from).

``get_model`` takes a catalog id (the Hugging Face id, case-insensitive, or its last part:
``Llama-3.3-70B-Instruct``) or a path to any ``config.json``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from kvtune.tuner.errors import InvalidInput, UnknownName
from kvtune.tuner.facts.models import QUANTIZATION_FILES, ModelArchitecture


@cache
def _catalog() -> dict[str, ModelArchitecture]:
    models: dict[str, ModelArchitecture] = {}
    folder = resources.files("kvtune.tuner.facts").joinpath("data", "models")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        doc: dict[str, Any] = json.loads(entry.read_text(encoding="utf-8"))
        arch = ModelArchitecture.from_hf_config(
            doc["config"],
            doc["hf_id"],
            parameter_count=doc.get("parameter_count"),
            source=doc.get("source", entry.name),
        )
        models[arch.hf_id] = arch
    return models


@cache
def _aliases() -> dict[str, str]:
    """Lower-cased full ids and their last path part -> canonical id."""
    out: dict[str, str] = {}
    for hf_id in _catalog():
        out[hf_id.lower()] = hf_id
        out.setdefault(hf_id.split("/")[-1].lower(), hf_id)
    return out


def list_models() -> list[str]:
    """Catalog ids (Hugging Face ids), sorted."""
    return sorted(_catalog())


def load_config_json(path: Path, hf_id: str | None = None) -> ModelArchitecture:
    """A model from a ``config.json`` file on disk (any model, not only the catalog's)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, or bytes that are not UTF-8
        raise InvalidInput("model", str(path), f"cannot read it as JSON: {exc}; pass the "
                           "model's config.json (from its Hugging Face repository)") from exc
    if not isinstance(config, dict):
        raise InvalidInput(
            "model", str(path),
            f"its JSON is {type(config).__name__ if config is not None else 'null'}, not an "
            "object: pass the model's config.json (from its Hugging Face repository)",
        )
    name = hf_id or str(config.get("_name_or_path") or path.parent.name or path.stem)
    return ModelArchitecture.from_hf_config(
        config, name, source=str(path),
        quantization_file=quantization_file(config, lambda f: _read_beside(path, f),
                                            where=str(path.parent)))


def _read_beside(config_path: Path, name: str) -> str | None:
    candidate = config_path.parent / name
    if not candidate.is_file():
        return None
    try:
        return candidate.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(name, str(candidate), f"cannot read it: {exc}") from exc


def _declares_quantization(config: dict[str, Any]) -> bool:
    text = config.get("text_config")
    return any(isinstance(c, dict) and (c.get("quantization_config") is not None
                                         or c.get("compression_config") is not None)
               for c in (config, text))


def quantization_file(config: dict[str, Any], read: Callable[[str], str | None], where: str
                      ) -> tuple[str, dict[str, Any]] | None:
    """The quantization file beside ``config.json`` that vLLM reads when config.json has no
    quantization_config (``models.QUANTIZATION_FILES``, in vLLM's order of preference).
    ``read(name)`` gives a file's text or None (a folder on disk, a ConfigMap's keys);
    ``where`` names that place in errors."""
    if _declares_quantization(config):
        return None
    for name in QUANTIZATION_FILES:
        text = read(name)
        if text is None:
            continue
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(name, where, f"cannot read it as JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidInput(name, where, "not a JSON object; pass the checkpoint's own "
                               "file")
        return name, doc
    return None


def get_model(id_or_path: str) -> ModelArchitecture:
    """A catalog model by id, or a model from a ``config.json`` path. Raises
    ``UnknownName`` with the close matches."""
    canonical = _aliases().get(id_or_path.strip().lower())
    if canonical is not None:
        return _catalog()[canonical]
    path = Path(id_or_path).expanduser()
    if id_or_path.endswith(".json") or path.is_file():
        if not path.is_file():
            raise InvalidInput("model", id_or_path, "no such file; pass a config.json path")
        return load_config_json(path)
    if path.is_dir() and (path / "config.json").is_file():
        return load_config_json(path / "config.json", hf_id=path.name)
    names = list(_aliases())
    close = difflib.get_close_matches(id_or_path.lower(), names, n=5, cutoff=0.5)
    return_ids = list(dict.fromkeys(_aliases()[c] for c in close))
    raise UnknownName(
        "model", id_or_path, return_ids,
        "Use a catalog id (`kvtune plan --help` lists them) or the path to the model's "
        "config.json.",
    )
