"""Events on an InferenceDeployment, one per change of reason (issue 21).

The timers post an outcome every minute (the retune timer's ``RetuneNoDrift``, a refused
runtime, a routing warning): a core/v1 Event for each would be one object a minute per
InferenceDeployment. ``EventRecorder.post`` posts a new Event unless it repeats the last one
posted for the object: the same type and reason with the same message, or the retune timer's
outcome (a ``Retune*`` reason, whose figures change every tick). A repeat is counted into that
Event,
which is patched (``count``, ``lastTimestamp``, the latest ``message``) at most once per
``SERIES_UPDATE_SECONDS``, as client-go's event correlator folds repeats into one series.

The memory is per operator process (the active peering replica); after a restart the first
Event of each object is posted again. Pure bookkeeping plus one POST or PATCH through a
``request`` callable, so it is tested without a cluster.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvtune.operator import api

COMPONENT = "kvtune"
SERIES_UPDATE_SECONDS = 600.0
MAX_OBJECTS = 10_000  # InferenceDeployments remembered (least recently posted forgotten first)
MESSAGE_BYTES = 1024

Request = Callable[..., dict[str, Any]]  # Kube.request(method, path, *, query, body, ...)


@dataclass
class _Series:
    """The last Event posted for one object, and its repeats since."""

    type_: str
    reason: str
    message: str
    event_name: str | None  # None: the POST's reply carried no name (cannot be patched)
    count: int
    patched_at: float


def _repeats(series: _Series, type_: str, reason: str, message: str) -> bool:
    """A repeat of the last Event: folded, not posted. A new rollout (``RolloutStarted`` for
    another revision) says something new and is posted, as client-go's correlator posts a
    new message; the retune timer's tick is folded though its drift figures differ."""
    if (series.type_, series.reason) != (type_, reason):
        return False
    return series.message == message or reason.startswith("Retune")


def _timestamp(now_seconds: float) -> str:
    return datetime.fromtimestamp(now_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _events_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/events"
    return base if name is None else f"{base}/{name}"


class EventRecorder:
    """Posts Events on InferenceDeployments, folding repeats of a reason into one series."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._series: OrderedDict[str, _Series] = OrderedDict()
        self._lock = threading.Lock()  # kopf's handlers run in threads

    def post(self, request: Request, owner: Mapping[str, Any], type_: str, reason: str,
             message: str) -> str:
        """``"posted"`` (a new Event), ``"patched"`` (a repeat, the series updated) or
        ``"counted"`` (a repeat, counted for the next update)."""
        meta = owner["metadata"]
        key = str(meta.get("uid") or f"{meta['namespace']}/{meta['name']}")
        now = self._clock()
        with self._lock:
            series = self._series.get(key)
            if series is not None and _repeats(series, type_, reason, message):
                self._series.move_to_end(key)
                series.count += 1
                if series.event_name is None \
                        or now - series.patched_at < SERIES_UPDATE_SECONDS:
                    return "counted"
                series.patched_at = now
                name, count = series.event_name, series.count
            else:
                name, count = None, 1
        if name is not None:
            try:
                self._patch(request, meta["namespace"], name, count, message, now)
                return "patched"
            except ApiException as exc:
                if exc.status != 404:
                    raise
                # The Event expired (the API server's --event-ttl, 1 h by default, when no
                # repeat patched it in time) or was deleted: start a new series.
        created = self._create(request, owner, type_, reason, message, now)
        with self._lock:
            self._series[key] = _Series(type_, reason, message, created, 1, now)
            self._series.move_to_end(key)
            while len(self._series) > MAX_OBJECTS:
                self._series.popitem(last=False)
        return "posted"

    def forget(self, owner: Mapping[str, Any]) -> None:
        """Drop the object's series (it was deleted)."""
        meta = owner["metadata"]
        with self._lock:
            self._series.pop(str(meta.get("uid") or f"{meta['namespace']}/{meta['name']}"),
                             None)

    @staticmethod
    def _create(request: Request, owner: Mapping[str, Any], type_: str, reason: str,
                message: str, now: float) -> str | None:
        meta = owner["metadata"]
        stamp = _timestamp(now)
        reply = request("POST", _events_path(meta["namespace"]), body={
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND,
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:MESSAGE_BYTES],
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        })
        name = ((reply or {}).get("metadata") or {}).get("name")
        return name if isinstance(name, str) else None

    @staticmethod
    def _patch(request: Request, namespace: str, name: str, count: int, message: str,
               now: float) -> None:
        request("PATCH", _events_path(namespace, name),
                body={"count": count, "lastTimestamp": _timestamp(now),
                      "message": message[:MESSAGE_BYTES]},
                content_type="application/merge-patch+json")


RECORDER = EventRecorder()
