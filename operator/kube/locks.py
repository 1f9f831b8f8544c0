"""One writer per InferenceDeployment at a time in this process: kopf's handlers, the
GPU-inventory thread, the rollout follower, the retune timer and the runtime reports all
read-modify-write the same status."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextmanager
def object_lock(namespace: str, name: str) -> Iterator[None]:
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault((namespace, name), threading.Lock())
    with lock:
        yield
