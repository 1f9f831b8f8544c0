"""The compiled loops' decorator (``tuner/simulator/compiled.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import pytest

from kvtune.tuner.simulator.compiled import compiled

SOURCE = """
def total(values):
    out = 0
    for v in values:
        out += v
    return out
"""


def _sourceless() -> Callable[..., Any]:
    """A function with no source file: no cache directory can be found for it, as where
    nothing is writable (a read-only image with no writable home)."""
    space: dict[str, Any] = {}
    exec(compile(SOURCE, "<generated>", "exec"), space)
    fn: Callable[..., Any] = space["total"]
    return fn


def test_without_a_cache_directory_the_loop_compiles_in_memory() -> None:
    with pytest.raises(RuntimeError, match="cannot cache"):
        numba.njit(cache=True)(_sourceless())  # what compiled() must not let through
    total = compiled(_sourceless())
    assert total(np.arange(5, dtype=np.int64)) == 10
    assert total.signatures  # compiled to machine code, not run as Python
