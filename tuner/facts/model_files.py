"""The tuner's one reader of a user's model files: a ``config.json`` on disk (any model, not
only the catalog's) and the quantization file beside it. ``catalog.get_model`` comes here
for a path; the planner itself receives the parsed ``ModelArchitecture``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.models import QUANTIZATION_FILES, ModelArchitecture


def from_path(id_or_path: str) -> ModelArchitecture | None:
    """The model of a ``config.json`` path, or of a folder that holds one; None when
    ``id_or_path`` names neither (then it is no path: the catalog says what is close)."""
    path = Path(id_or_path).expanduser()
    if id_or_path.endswith(".json") or path.is_file():
        if not path.is_file():
            raise InvalidInput("model", id_or_path, "no such file; pass a config.json path")
        return load_config_json(path)
    if path.is_dir() and (path / "config.json").is_file():
        return load_config_json(path / "config.json", hf_id=path.name)
    return None


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
