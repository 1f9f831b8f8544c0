"""A budget for one capacity search: CPU seconds, memory, a stream-size cap and a stop switch.

The search (``search.py``) replays hundreds of requests per candidate; the work grows with
the candidates and, before this budget, with the declared arrival rate (the traffic made from
a profile warmed up rate x window requests: 1e5 req/s built millions, 1e9 asked for terabytes).
A tenant's spec must never stall the operator that plans everyone's pools, and ``kvtune plan``
must end, so every search runs under a ``SearchBudget``:

- ``cpu_seconds``: CPU time of the thread running the search (``time.thread_time``: the
  operator runs many searches at once in its handler threads; each is charged its own).
- ``memory_bytes``: how much the search may grow the process's resident set
  (``/proc/self/statm``) over what it was when the search started: above it the search stops.
  Growth, not the process's total, because the search runs inside other programs (the
  operator with its caches, ``kvtune plan``, a notebook or a test run that imported torch at
  ~1 GiB) whose own size is not the search's to police. It is a backstop; the stream cap
  below keeps a search's own memory small.
- ``stream_requests``: the most requests a candidate replays (and the traffic made for it).
- ``cancelled``: asked between scores and inside each simulation; True stops the search at
  once (the operator's SIGTERM: kopf's handler threads cannot be killed, so they must stop
  by themselves or the process waits for them on exit).

The meter is checked between candidates and every few hundred finished requests inside a
simulation. A spent budget ends the search with the best plan scored so far and a reason
(``SearchSummary.stopped_by``); when nothing was scored, ``SearchBudgetSpent``. The clock and
the memory probe are arguments, so tests drive them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtune.tuner.errors import KVTuneError

MiB = 2**20
# Seconds of one thread's CPU a search may use. The capacity search (a knockout per rung,
# ``search.py``) of the default 24-48 candidates takes 3-28 s of CPU on the shared 2-core
# machine under load (bench/oracle.py's settings: 3.0-11.9 s, offload 27.9-30.0 s; a chat
# profile at 5 req/s on an H100: ~28 s of its `kvtune plan`'s 33 s, 2026-12-02). 30 s was too
# thin: beside a second busy process the chat search was stopped at 30.0 s. Twice the largest
# keeps a default search whole on a busy machine and still stops a runaway (the memory cap
# below is what stops the 1e5 req/s case); a search it stops still reports its plan's
# capacity on the full stream (``search.py``, 5).
DEFAULT_CPU_SECONDS = 60.0
# How much one search may grow the process's resident set: the chart's operator runs under a
# 512 MiB limit and needs ~170 MiB for 200 objects (issue 25); a bounded search grows it by
# ~50-80 MiB (the stream cap), so 256 MiB stops only a runaway (the unbounded 1e5 req/s case
# passed 2 GiB in 8 s) and leaves room under the limit.
DEFAULT_MEMORY_BYTES = 256 * MiB
# The most requests one candidate replays (the last rung of the halving).
MAX_STREAM_REQUESTS = 800
# Limits a user may set (CLI flags, chart values): a budget is not a way to run forever.
MAX_CPU_SECONDS = 3600.0
MIN_MEMORY_BYTES = 64 * MiB


def process_rss_bytes() -> int | None:
    """The process's resident set now (Linux ``/proc/self/statm``), None where unreadable.
    Current, not peak (``ru_maxrss``): a peak once crossed would stop every later search."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _never() -> bool:
    return False


class SearchCancelled(Exception):
    """The search was told to stop (the operator is shutting down): no plan."""


class SearchBudgetSpent(KVTuneError):
    """The budget ran out before a single candidate was scored: no plan by capacity."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the capacity search was stopped before scoring any candidate: "
                         f"{reason}; raise the budget (kvtune plan --search-cpu-seconds, "
                         "--search-memory-mib; the chart's search.cpuSeconds, "
                         "search.memoryMiB) or plan by the rules (--no-search)")


class BudgetStop(Exception):
    """Raised inside the search when the budget is spent; the search catches it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class SearchBudget:
    """What one search may use (module doc). ``None``: that limit is off."""

    cpu_seconds: float | None = DEFAULT_CPU_SECONDS
    memory_bytes: int | None = DEFAULT_MEMORY_BYTES
    stream_requests: int = MAX_STREAM_REQUESTS
    cancelled: Callable[[], bool] = field(default=_never, compare=False)
    cpu_clock: Callable[[], float] = field(default=time.thread_time, compare=False)
    rss_bytes: Callable[[], int | None] = field(default=process_rss_bytes, compare=False)

    def start(self) -> BudgetMeter:
        return BudgetMeter(self, self.cpu_clock(), self.rss_bytes())


UNBOUNDED = SearchBudget(cpu_seconds=None, memory_bytes=None, stream_requests=10**9)


@dataclass(slots=True)
class BudgetMeter:
    """One search's use of its budget, from ``start``."""

    budget: SearchBudget
    started_cpu_seconds: float
    started_rss_bytes: int | None = None
    # CPU seconds granted past the budget (``grant``): the search's last measurement after
    # a stop (``search.py``: the chosen plan on the full stream).
    granted_cpu_seconds: float = 0.0

    def used_cpu_seconds(self) -> float:
        return self.budget.cpu_clock() - self.started_cpu_seconds

    def grant(self, cpu_seconds: float) -> None:
        """Allow ``cpu_seconds`` more of CPU from now than the budget left (none left: from
        now); memory and the stop switch stay as they were."""
        if self.budget.cpu_seconds is None:
            return
        over = max(0.0, self.used_cpu_seconds() - self.budget.cpu_seconds
                   - self.granted_cpu_seconds)
        self.granted_cpu_seconds += over + cpu_seconds

    def check(self) -> None:
        """Raise ``SearchCancelled`` when told to stop, ``BudgetStop`` when spent."""
        b = self.budget
        if b.cancelled():
            raise SearchCancelled("the capacity search was cancelled (the operator is stopping)")
        used = self.used_cpu_seconds()
        if b.cpu_seconds is not None and used > b.cpu_seconds + self.granted_cpu_seconds:
            raise BudgetStop(f"its CPU budget of {b.cpu_seconds:g} s was spent "
                             f"({used:.1f} s used)")
        if b.memory_bytes is not None:
            rss = b.rss_bytes()
            grown = 0 if rss is None else rss - (self.started_rss_bytes or 0)
            if rss is not None and grown > b.memory_bytes:
                raise BudgetStop(f"the search grew the process's memory by {grown / MiB:.0f} MiB "
                                 f"(to {rss / MiB:.0f} MiB resident), past its budget of "
                                 f"{b.memory_bytes / MiB:.0f} MiB")

    def on_progress(self, _finished: int, _total: int) -> None:
        """A simulator ``ProgressHook``: the same check inside one replay."""
        self.check()


__all__ = [
    "DEFAULT_CPU_SECONDS",
    "DEFAULT_MEMORY_BYTES",
    "MAX_STREAM_REQUESTS",
    "UNBOUNDED",
    "BudgetMeter",
    "BudgetStop",
    "SearchBudget",
    "SearchBudgetSpent",
    "SearchCancelled",
    "process_rss_bytes",
]
