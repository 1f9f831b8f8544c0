"""vLLM stays an optional extra: importing kvtune's CLI, tuner and simulator loads neither vLLM
nor torch (the operator's image has neither). Which module may import what is the
import-linter contract "vllm-is-optional" (scripts/lint_imports.sh)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_kvtune_loads_neither_vllm_nor_torch() -> None:
    code = (
        "import sys, kvtune.cli.main, kvtune.tuner.simulator.scheduler, "
        "kvtune.tuner.simulator.compare, kvtune.oracle.steps, kvtune.oracle.tokens\n"
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip() == "[]"
