"""The one place the tuner reads its own package data: the facts under ``tuner/facts/data/``
(models, GPU classes, vLLM's capabilities and memory figures, prices, host figures, step
kernels) and the simulator's ``efficiency.json``.

Every facts module asks this loader for parsed JSON and keeps only the lookup (by name, by
version, by GPU class) for itself, so the tuner's pure core reads no file: the loading is
here, at the edge, and a test (``tests/tuner/test_tuner_io_edges.py``) keeps other file
reads out of ``tuner/``. The data ships inside the package (``setup.py`` lists it), so these
reads never touch the user's disk.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

FACTS = "kvtune.tuner.facts"
SIMULATOR = "kvtune.tuner.simulator"


def read_json(*parts: str, package: str = FACTS) -> Any:
    """The parsed JSON of the package data file at ``parts`` (under ``data/`` for the facts:
    ``read_json("data", "gpus.json")``)."""
    return json.loads(resources.files(package).joinpath(*parts).read_text("utf-8"))


def names(*parts: str, package: str = FACTS) -> list[str]:
    """The file names in a package data folder, sorted."""
    return sorted(entry.name for entry in resources.files(package).joinpath(*parts).iterdir())
