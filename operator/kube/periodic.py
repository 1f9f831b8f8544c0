"""Periodic work per InferenceDeployment, without kopf's timers and so without a finalizer.

kopf adds its finalizer (``kvtune.io/finalizer``) to every object that a ``@kopf.timer`` or
``@kopf.daemon`` matches, and its maintainer keeps it that way (nolar/kopf#896: a timer is
only stopped reliably if the object waits for it). With the operator gone (uninstalled,
crashed, scaled to zero) such an object, and its namespace, can then never be deleted.

kvtune's periodic work (follow a rollout, re-read referenced ConfigMaps, read runtime
reports, re-tune) needs no clean-up when an object goes away, so it runs here instead:

- ``@kopf.on.event`` (no finalizer) keeps the last body of every InferenceDeployment this
  replica may handle; a DELETED event forgets it, so nothing keeps running for a gone object;
- one asyncio task in kopf's loop starts each due ``(object, timer)`` in a bounded thread
  pool, at most one run per pair at a time, and nothing while this replica is paused;
- this replica is active exactly when kopf is: standalone always; with peering from kopf's
  own "Pausing/Resuming operations" decisions (its peering logger), and the index is emptied
  on a pause so a standby never acts on bodies it stopped watching (kopf re-lists, and so
  re-fills it, on resume).

``timer`` mirrors the subset of ``kopf.timer`` kvtune used: ``interval`` from the end of the
previous run, ``initial_delay``, ``when(spec=, status=, body=)``; a ``kopf.TemporaryError``
brings the next run forward or back to its ``delay``, and so does a number the timer
returns (seconds to its next run).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf

LOG = logging.getLogger("kvtune.operator.periodic")
TICK_SECONDS = 1.0
# Threads for periodic work: enough that a slow object (a Prometheus query, a long render)
# does not hold up the others, few enough to bound the API load of a thousand objects.
WORKERS = 4
# kopf's peering decisions, logged by this logger (kopf 1.45: "Pausing operations in favour
# of …", "Pausing all operators, including self: …", "Resuming operations after the pause.").
KOPF_PEERING_LOGGER = "kopf._core.engines.peering"

TimerFn = Callable[..., Any]
WhenFn = Callable[..., bool]


@dataclass(frozen=True)
class Timer:
    id: str
    fn: TimerFn
    interval_seconds: float
    initial_delay_seconds: float = 0.0
    when: WhenFn | None = None
    # The first run of each object comes at a point of one more interval chosen by its UID:
    # a thousand objects created (or found by a restart) together are not all due in the
    # same second, every interval after.
    spread: bool = False

    def first_due(self, first_seen: float, uid: str) -> float:
        at = first_seen + self.initial_delay_seconds
        if self.spread:
            at += self.interval_seconds * (zlib.crc32(uid.encode()) % 1000) / 1000
        return at


@dataclass
class _Tracked:
    body: dict[str, Any]
    memo: Any
    first_seen: float
    next_due: dict[str, float] = field(default_factory=dict)


TIMERS: list[Timer] = []


def timer(*, id: str, interval: float, initial_delay: float = 0.0,
          when: WhenFn | None = None, spread: bool = False) -> Callable[[TimerFn], TimerFn]:
    """Register ``fn(body=, spec=, status=, memo=, logger=)`` to run every ``interval`` s for
    each InferenceDeployment ``when`` accepts (``spread``: see ``Timer.spread``)."""
    def decorator(fn: TimerFn) -> TimerFn:
        TIMERS.append(Timer(id, fn, float(interval), float(initial_delay), when, spread))
        return fn
    return decorator


class Scheduler:
    """The index of bodies and the loop that runs due timers (one per operator process)."""

    def __init__(self, memo: Any, timers: list[Timer] | None = None,
                 workers: int = WORKERS) -> None:
        self.memo = memo
        self.timers = TIMERS if timers is None else timers
        self.objects: dict[tuple[str, str], _Tracked] = {}
        self.running: set[tuple[tuple[str, str], str]] = set()
        self.active = threading.Event()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvtune-timer")

    # --- what kopf tells us ----------------------------------------------------------------
    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        with self.lock:
            if event_type == "DELETED":
                self.objects.pop(key, None)
                return
            tracked = self.objects.get(key)
            if tracked is None or (tracked.body.get("metadata") or {}).get("uid") != meta.get(
                    "uid"):
                # A new object (or one recreated under the same name) gets a fresh per-object
                # memo, as kopf gives each object a shallow copy of the operator's memo.
                self.objects[key] = _Tracked(dict(body), copy.copy(self.memo), time.monotonic())
            else:
                tracked.body = dict(body)

    def set_active(self, active: bool) -> None:
        if active:
            self.active.set()
            return
        self.active.clear()
        with self.lock:
            self.objects.clear()

    # --- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopped.is_set():
            for key, timer_, tracked in self._due(time.monotonic()):
                try:
                    loop.run_in_executor(self.pool, self._run_one, key, timer_, tracked)
                except RuntimeError:  # the pool was shut down: the operator is stopping
                    return
            await asyncio.sleep(TICK_SECONDS)

    def stop(self) -> None:
        self.stopped.set()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _due(self, now: float) -> list[tuple[tuple[str, str], Timer, _Tracked]]:
        due: list[tuple[tuple[str, str], Timer, _Tracked]] = []
        if not self.active.is_set():
            return due
        with self.lock:
            for key, tracked in self.objects.items():
                if (tracked.body.get("metadata") or {}).get("deletionTimestamp"):
                    continue
                for timer_ in self.timers:
                    if (key, timer_.id) in self.running:
                        continue
                    at = tracked.next_due.get(timer_.id)
                    if at is None:
                        uid = str((tracked.body.get("metadata") or {}).get("uid") or key)
                        at = tracked.next_due[timer_.id] = timer_.first_due(
                            tracked.first_seen, uid)
                    if now < at or not _accepts(timer_, tracked.body):
                        continue
                    self.running.add((key, timer_.id))
                    due.append((key, timer_, tracked))
        return due

    def _run_one(self, key: tuple[str, str], timer_: Timer, tracked: _Tracked) -> None:
        delay = timer_.interval_seconds
        body = tracked.body
        logger = logging.LoggerAdapter(LOG, {"object": f"{key[0]}/{key[1]}"})
        try:
            if self.active.is_set() and not self.stopped.is_set():
                next_in = timer_.fn(body=body, spec=body.get("spec") or {},
                                    status=body.get("status") or {}, memo=tracked.memo,
                                    logger=logger)
                if isinstance(next_in, int | float) and not isinstance(next_in, bool):
                    delay = float(next_in)  # the timer's own choice of its next run
        except kopf.TemporaryError as exc:
            LOG.info("timer %r of %s/%s: %s", timer_.id, key[0], key[1], exc)
            if exc.delay is not None:
                delay = float(exc.delay)
        except kopf.PermanentError as exc:
            LOG.info("timer %r of %s/%s: %s", timer_.id, key[0], key[1], exc)
        except Exception:  # a bug or the API server: log, try again next interval
            LOG.exception("timer %r of %s/%s failed", timer_.id, key[0], key[1])
        finally:
            with self.lock:
                tracked.next_due[timer_.id] = time.monotonic() + delay
                self.running.discard((key, timer_.id))


def _accepts(timer_: Timer, body: Mapping[str, Any]) -> bool:
    if timer_.when is None:
        return True
    return bool(timer_.when(spec=body.get("spec") or {}, status=body.get("status") or {},
                            body=body))


class PeeringDecisions(logging.Handler):
    """Follows kopf's peering decisions (its log records) into ``Scheduler.set_active``."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(level=logging.INFO)
        self.scheduler = scheduler

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Pausing"):
            self.scheduler.set_active(False)
        elif message.startswith("Resuming operations"):
            self.scheduler.set_active(True)
