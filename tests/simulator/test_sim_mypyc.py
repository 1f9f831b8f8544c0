"""The scheduler compiled by mypyc (`kvtune compile-simulator`, here on the checkout through
scripts/compile_simulator.py) gives the Python's results.

The compiled scheduler is the same typed sources run as C: a slice of each shipped trace under
eight engine settings (async and sync, caching off, block size 32, a pool that preempts, a
512-token budget, a CPU tier, pipeline parallel) must come out equal to the last bit, every
request's first-token and finish time and every counter. It also shows that mypyc accepts
every module ``compiled.MYPYC_MODULES`` names (an interpreted subclass of a compiled class,
or a value of the wrong type at a typed boundary, fails here) and that the compiled modules
are the ones that run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvtune.e2e.traces import TRACES_DIR
from kvtune.tuner.simulator.compiled import MYPYC_MODULES

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("mypyc_probe.py")


def _compile_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "compile_simulator", REPO / "scripts" / "compile_simulator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _probe(site: Path | None) -> dict[str, Any]:
    env = None if site is None else _compile_script().env_with_site(site)
    done = subprocess.run([sys.executable, str(PROBE), str(TRACES_DIR)], env=env, cwd=site,
                          capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, list):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y, strict=True))
    if isinstance(x, float) and math.isnan(x):
        return isinstance(y, float) and math.isnan(y)
    return bool(x == y)


def test_the_compiled_scheduler_gives_the_pythons_results_bit_for_bit() -> None:
    site = _compile_script().compiled_checkout(REPO)
    for module in MYPYC_MODULES:
        folder = site / Path(*module.split(".")).parent
        name = module.rsplit(".", 1)[1]
        assert list(folder.glob(f"{name}.cpython-*.so")), f"{module} was not compiled"
    python, compiled = _probe(None), _probe(site)
    assert python.pop("compiled") is False and compiled.pop("compiled") is True
    assert len(python) == 16 and python.keys() == compiled.keys()
    differ = [k for k in python if not _same(python[k], compiled[k])]
    assert not differ, differ
    # The comparison can fail: the runs are not all alike.
    assert not _same(python["AzureLLMInferenceTrace_conv.csv defaults"]["finish"],
                     python["AzureLLMInferenceTrace_conv.csv sync"]["finish"])
