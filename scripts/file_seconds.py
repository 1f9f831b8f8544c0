"""Write tests/file_seconds.json, each test file's measured seconds, from a pytest JUnit XML
report (``pytest --junitxml=report.xml``): tests/conftest.py runs the slowest files first so
that the two xdist workers of ``make test`` finish together (docs/testing.md).

Usage: .venv/bin/python scripts/file_seconds.py report.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "file_seconds.json"


def test_file(classname: str) -> str | None:
    """``tests.operator.test_x.TestY`` -> ``tests/operator/test_x.py`` (the longest prefix
    that is a file here)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (REPO / candidate).is_file():
            return candidate
    return None


def file_seconds(report: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        path = test_file(case.get("classname", ""))
        if path is not None:
            seconds[path] += float(case.get("time", "0"))
    return {path: round(s, 1) for path, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: scripts/file_seconds.py REPORT.xml (pytest --junitxml=REPORT.xml)",
              file=sys.stderr)
        return 2
    seconds = file_seconds(Path(argv[0]))
    if not seconds:
        print(f"scripts/file_seconds.py: no test of this checkout in {argv[0]}", file=sys.stderr)
        return 1
    OUT.write_text(json.dumps(seconds, indent=0) + "\n")
    print(f"{OUT.relative_to(REPO)}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
