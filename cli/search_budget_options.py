"""The capacity search's budget as options (``kvtune plan``, ``kvtune operator``): CPU seconds
and memory a search may use (``kvtune.tuner.planner.search_budget``); also read from
``KVTUNE_SEARCH_CPU_SECONDS`` and ``KVTUNE_SEARCH_MEMORY_MIB`` when the flag is not given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvtune.tuner.planner import search_budget as sb

F = TypeVar("F", bound=Callable[..., Any])


def search_budget_options(f: F) -> F:
    f = click.option(
        "--search-memory-mib", type=click.IntRange(min=sb.MIN_MEMORY_BYTES // sb.MiB),
        default=sb.DEFAULT_MEMORY_BYTES // sb.MiB, show_default=True,
        envvar="KVTUNE_SEARCH_MEMORY_MIB",
        help="The capacity search stops (keeping its best plan so far) once it has grown the "
        "process's resident memory by this many MiB.")(f)
    f = click.option(
        "--search-cpu-seconds", type=click.FloatRange(min=0, max=sb.MAX_CPU_SECONDS,
                                                      min_open=True),
        default=sb.DEFAULT_CPU_SECONDS, show_default=True, envvar="KVTUNE_SEARCH_CPU_SECONDS",
        help="CPU seconds one capacity search may use; then it stops and keeps its best plan "
        "so far, saying so.")(f)
    return f


def budget_from(opts: dict[str, Any]) -> sb.SearchBudget:
    """The budget of ``search_budget_options`` (popped from ``opts``)."""
    return sb.SearchBudget(cpu_seconds=float(opts.pop("search_cpu_seconds")),
                           memory_bytes=int(opts.pop("search_memory_mib")) * sb.MiB)
