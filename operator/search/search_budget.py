"""The operator's budget for every capacity search, and the switch its shutdown throws.

``kvtune operator --search-cpu-seconds/--search-memory-mib`` (the chart's ``search`` values)
set ``CONFIG`` before kopf starts. Searches run in kopf's handler threads, which cannot be
killed, and kopf waits for them: it shields a sync handler's thread from cancellation and runs
the cleanup handlers only after every handler has returned. So ``STOPPING`` is set the moment
kopf says it is stopping (its reactor logs "... Operator is stopping." on SIGTERM, SIGINT or
its stop flag: ``StopOnShutdown`` listens there, as ``periodic.PeeringDecisions`` listens to
kopf's peering log), and every running search stops at its next check (between candidates,
and every few dozen requests inside one replay): the process exits within seconds of SIGTERM
instead of waiting for the searches.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from kvtune.tuner.planner.search_budget import (
    DEFAULT_CPU_SECONDS,
    DEFAULT_MEMORY_BYTES,
    SearchBudget,
)

STOPPING = threading.Event()
# kopf's reactor, which logs the stop the moment it gets it.
KOPF_REACTOR_LOGGER = "kopf._core.reactor.running"


class StopOnShutdown(logging.Handler):
    """Sets ``STOPPING`` when kopf logs that the operator is stopping (module doc)."""

    def emit(self, record: logging.LogRecord) -> None:
        if "Operator is stopping" in record.getMessage():
            STOPPING.set()


def listen_for_shutdown() -> None:
    logger = logging.getLogger(KOPF_REACTOR_LOGGER)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)  # the stop line is INFO
    if not any(isinstance(h, StopOnShutdown) for h in logger.handlers):
        logger.addHandler(StopOnShutdown())


@dataclass
class SearchConfig:
    cpu_seconds: float = DEFAULT_CPU_SECONDS
    memory_bytes: int = DEFAULT_MEMORY_BYTES


CONFIG = SearchConfig()


def budget() -> SearchBudget:
    """The budget of one search now (the stop switch included)."""
    return SearchBudget(cpu_seconds=CONFIG.cpu_seconds, memory_bytes=CONFIG.memory_bytes,
                        cancelled=STOPPING.is_set)
