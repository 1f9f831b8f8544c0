"""Compiling the simulator's innermost loops to machine code (numba), and where the result is kept.

Why: the block pool moves hundreds of blocks per request (a multi-turn Mooncake prompt holds
~900 at block size 16). As numpy calls, each pool operation was a dozen calls of ~2 us each,
half of a replay's time; as one compiled loop it is one call. The loops are plain Python
over int64 arrays, so ``NUMBA_DISABLE_JIT=1`` runs the very same code uncompiled (slowly:
for debugging), and mypy checks them as Python.

Compiled code is cached on disk (numba's ``cache=True``: next to this file, else in the
user's cache directory, else ``NUMBA_CACHE_DIR``), so a process pays the compilation
(~seconds) only the first time. Where no cache directory is writable (a read-only image
with no writable home), the loops are compiled in memory once per process instead of
failing at import: slower to start, never broken.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba

F = TypeVar("F", bound=Callable[..., Any])

# The modules mypyc may compile to C (``scripts/compile_simulator.py``): the scheduler and what
# its loop calls, typed Python with no numba inside (numba compiles from bytecode, which a
# mypyc-compiled module has none of: the block pool's loops live in ``block_loops.py``). An
# interpreted class cannot subclass a compiled one, so the simulator's subclasses of these
# classes are listed too.
MYPYC_MODULES = (
    *(f"kvtune.tuner.simulator.{name}" for name in (
        "scheduler", "sched_core", "sched_state", "sched_offload", "sched_exact",
        "sched_cohort", "sched_runs", "sched_pipeline", "cohort", "blocks", "timing",
        "stepwise", "disaggregated", "workload", "metrics", "prefix", "offload")),
    "kvtune.tuner.facts.step_kernels",
)


def is_mypyc_compiled() -> bool:
    """Whether the scheduler running here is the mypyc-compiled one."""
    from kvtune.tuner.simulator import scheduler

    return not scheduler.__file__.endswith(".py") if scheduler.__file__ else False


def compiled(func: F) -> F:
    """``func`` compiled (no Python objects inside: nopython mode), typed as ``func``."""
    try:
        with warnings.catch_warnings():
            # numba warns once per function it cannot cache; the fallback below says why.
            warnings.simplefilter("ignore", numba.NumbaWarning)
            return cast(F, numba.njit(cache=True, nogil=True)(func))
    except RuntimeError:
        # numba: "cannot cache function ...: no locator available" (nothing writable).
        return cast(F, numba.njit(nogil=True)(func))
