"""The model catalog: real ``config.json`` facts of well-known models, shipped as data
(``tuner/facts/data/models/*.json``, one file per model, each with the URL it came from).

``get_model`` takes a catalog id (the Hugging Face id, case-insensitive, or its last part:
``Llama-3.3-70B-Instruct``) or a path to any ``config.json``. The lookup is here; the files
are read elsewhere: the catalog's through ``data_files`` (package data), a user's
``config.json`` through ``model_files`` (the tuner's one reader of a user's model files).
"""

from __future__ import annotations

import difflib
from functools import cache
from typing import Any

from kvtune.tuner.errors import UnknownName
from kvtune.tuner.facts import data_files, model_files

# Re-exported: the readers of a model's files live in model_files (cli, quality and the
# operator import them here).
from kvtune.tuner.facts.model_files import load_config_json, quantization_file
from kvtune.tuner.facts.models import ModelArchitecture

__all__ = ["get_model", "list_models", "load_config_json", "quantization_file"]


@cache
def _catalog() -> dict[str, ModelArchitecture]:
    models: dict[str, ModelArchitecture] = {}
    for name in data_files.names("data", "models"):
        if not name.endswith(".json"):
            continue
        doc: dict[str, Any] = data_files.read_json("data", "models", name)
        arch = ModelArchitecture.from_hf_config(
            doc["config"],
            doc["hf_id"],
            parameter_count=doc.get("parameter_count"),
            source=doc.get("source", name),
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


def get_model(id_or_path: str) -> ModelArchitecture:
    """A catalog model by id, or a model from a ``config.json`` path. Raises
    ``UnknownName`` with the close matches."""
    canonical = _aliases().get(id_or_path.strip().lower())
    if canonical is not None:
        return _catalog()[canonical]
    from_disk = model_files.from_path(id_or_path)
    if from_disk is not None:
        return from_disk
    names = list(_aliases())
    close = difflib.get_close_matches(id_or_path.lower(), names, n=5, cutoff=0.5)
    return_ids = list(dict.fromkeys(_aliases()[c] for c in close))
    raise UnknownName(
        "model", id_or_path, return_ids,
        "Use a catalog id (`kvtune plan --help` lists them) or the path to the model's "
        "config.json.",
    )
