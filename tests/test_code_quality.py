"""The project's own checks run with the tests: ruff over the tree and mypy --strict on the pure
core (kvtune.tuner). (crds/ and the chart's copy are checked against the API types in
tests/operator and tests/chart.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_is_clean() -> None:
    result = _run(str(BIN / "ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_tuner() -> None:
    result = _run(str(REPO / "scripts" / "mypy.sh"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout
