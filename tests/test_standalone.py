"""A clone stands alone: nothing outside docs/ reads the development machine's shared folder
beside the repository, and the traces that tests, demo and benchmarks replay ship inside it,
byte-exact, with their licenses."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE, TRACES_DIR

REPO = Path(__file__).resolve().parents[1]
# Spelled in pieces so that this file does not match itself.
_SHARED = "sha" + "red"
READS_SHARED = re.compile(
    rf"\.\./{_SHARED}\b|/work/{_SHARED}\b|\b{_SHARED}/data\b|[\"']{_SHARED}[\"']\s*/"
)


def _tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode()
    return [REPO / name for name in listed.split("\0") if name]


def test_no_tracked_file_outside_docs_reads_the_shared_folder() -> None:
    offenders = []
    for path in _tracked_files():
        rel = path.relative_to(REPO)
        if rel.parts[0] == "docs" or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        offenders += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                      if READS_SHARED.search(line)]
    assert not offenders, f"reads ../{_SHARED} (ship the file in the repository):\n" + "\n".join(
        offenders)


def test_the_pattern_catches_the_old_readers() -> None:
    # The spellings the tests and benchmarks used before the traces were shipped.
    for old in (f'DATA = REPO.parent / "{_SHARED}" / "data"', f"--trace ../{_SHARED}/data/x.csv",
                f'Path("/work/{_SHARED}/data")'):
        assert READS_SHARED.search(old), old
    assert not READS_SHARED.search("shared_prefix_tokens: int")
    assert not READS_SHARED.search("sharedPrefixTokens: 3000")


def _sources_table() -> dict[str, tuple[int, str, str]]:
    rows: dict[str, tuple[int, str, str]] = {}
    for line in (TRACES_DIR / "SOURCES.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and re.fullmatch(r"[0-9a-f]{64}", cells[5]):
            rows[cells[0]] = (int(cells[4]), cells[5], cells[6])
    return rows


@pytest.mark.parametrize("trace", [AZURE_TRACE, MOONCAKE_TRACE], ids=lambda p: p.name)
def test_shipped_traces_are_the_attributed_bytes(trace: Path) -> None:
    table = _sources_table()
    assert trace.name in table, f"{trace.name} has no row in examples/traces/SOURCES.md"
    size_bytes, sha256, license_name = table[trace.name]
    data = trace.read_bytes()
    assert len(data) == size_bytes
    assert hashlib.sha256(data).hexdigest() == sha256
    if license_name == "Apache-2.0":
        # Apache-2.0 section 4(a): recipients get a copy of the license with the work.
        assert "Apache License" in (TRACES_DIR / "LICENSE-Apache-2.0.txt").read_text()
    else:
        assert license_name == "CC BY 4.0"
        assert "creativecommons.org/licenses/by/4.0" in (TRACES_DIR / "SOURCES.md").read_text()
