"""The differential suite: vLLM 0.33.0's own scheduler against kvtune's simulator.

vLLM comes with the ``kvtune[vllm]`` extra that ``scripts/setup.sh`` installs; without it
these tests fail (they are never skipped: a skip would count as passing). Importing vLLM's
scheduler costs ~10-20 s of CPU, paid once per session by the ``vllm`` fixture.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulator"))


@pytest.fixture(scope="session")
def vllm() -> Any:
    from kvtune.tuner.errors import KVTuneError

    try:
        from kvtune.oracle.vllm_engine import import_vllm

        return import_vllm()
    except KVTuneError as exc:
        pytest.fail(f"{exc} (scripts/setup.sh installs it)", pytrace=False)
