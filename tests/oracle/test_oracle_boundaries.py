"""vLLM stays an optional extra: the tuner, the CLI and the operator never import vLLM, torch
or kvtune.oracle at import time (the operator's image does not have them)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_module_outside_oracle_imports_vllm_or_torch() -> None:
    pattern = re.compile(r"^\s*(import|from)\s+(vllm|torch|kvtune\.oracle)\b", re.M)
    offenders = []
    for folder in ("tuner", "operator", "cli", "e2e", "kvtune_pkg", "runtime_images"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            for m in pattern.finditer(text):
                line = text[: m.start()].count("\n") + 1
                # The CLI may import the oracle lazily, inside a function (indented).
                if folder == "cli" and m.group(0).startswith((" ", "\t")):
                    continue
                offenders.append(f"{path.relative_to(REPO)}:{line}")
    assert offenders == []


def test_importing_kvtune_loads_neither_vllm_nor_torch() -> None:
    code = (
        "import sys, kvtune.cli.main, kvtune.tuner.simulator.scheduler, "
        "kvtune.tuner.simulator.compare, kvtune.oracle.steps, kvtune.oracle.tokens\n"
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip() == "[]"
