"""The operator's budget for every goodput search, and the switch its shutdown throws.

``kvtune operator --search-cpu-seconds/--search-memory-mib`` (the chart's ``search`` values)
set ``CONFIG`` before kopf starts. Searches run in kopf's handler threads, which cannot be
killed: on shutdown (kopf's cleanup) ``STOPPING`` is set, and every running search stops at
its next check (between candidates, and every few dozen requests inside one replay), so the
process exits within seconds of SIGTERM instead of waiting for them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from kvtune.tuner.planner.search_budget import (
    DEFAULT_CPU_SECONDS,
    DEFAULT_MEMORY_BYTES,
    SearchBudget,
)

STOPPING = threading.Event()


@dataclass
class SearchConfig:
    cpu_seconds: float = DEFAULT_CPU_SECONDS
    memory_bytes: int = DEFAULT_MEMORY_BYTES


CONFIG = SearchConfig()


def budget() -> SearchBudget:
    """The budget of one search now (the stop switch included)."""
    return SearchBudget(cpu_seconds=CONFIG.cpu_seconds, memory_bytes=CONFIG.memory_bytes,
                        cancelled=STOPPING.is_set)
