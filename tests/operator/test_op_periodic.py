"""operator/kube/periodic.py: kvtune's own timers (kopf's would put a finalizer on every object)."""

from __future__ import annotations

import threading
from typing import Any

import kopf
import pytest

from kvtune.operator import handlers
from kvtune.operator.kube import periodic
from kvtune.operator.retune import retune_handlers  # noqa: F401 (registers)


def body(name: str, uid: str = "u1", progressing: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Progressing", "status": "True" if progressing else "False"}]
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid},
            "spec": {}, "status": {"conditions": conditions}}


class Calls:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.done = threading.Event()

    def fn(self, body: dict[str, Any], memo: Any, **_: Any) -> None:
        memo["runs"] = memo.get("runs", 0) + 1
        self.seen.append(body["metadata"]["name"])
        self.done.set()


def scheduler_with(*timers: periodic.Timer) -> periodic.Scheduler:
    return periodic.Scheduler({"shared": True}, list(timers), workers=1)


def run_due(s: periodic.Scheduler, now: float) -> list[str]:
    """One tick of the loop, run synchronously."""
    ran = []
    for key, timer_, tracked in s._due(now):
        s._run_one(key, timer_, tracked)
        ran.append(f"{key[1]}:{timer_.id}")
    return ran


def test_kvtune_registers_no_kopf_timer_so_kopf_sets_no_finalizer() -> None:
    """kopf adds its finalizer to every object a kopf timer/daemon matches: there must be
    none, and the delete handler is optional (tests/operator/test_op_finalizer_cluster.py
    deletes objects and their namespace with no operator running)."""
    from kopf._core.intents import registries

    registry = registries.get_default_registry()
    assert list(registry._spawning.get_all_handlers()) == []
    assert [h.id for h in registry._changing.get_all_handlers() if h.requires_finalizer] == []
    assert {t.id for t in periodic.TIMERS} >= {"rollout", "referenced-configmaps",
                                                "runtime-reports", "retune"}


def test_nothing_runs_while_paused_and_a_pause_forgets_every_body() -> None:
    calls = Calls()
    s = scheduler_with(periodic.Timer("t", calls.fn, 5.0))
    s.observe(None, body("a"))
    assert run_due(s, 1e12) == []  # a replica starts paused until kopf resumes it
    s.set_active(True)
    s.observe(None, body("a"))
    assert run_due(s, 1e12) == ["a:t"]
    s.set_active(False)  # kopf paused this replica (a peer of higher priority)
    assert s.objects == {}
    s.set_active(True)
    assert run_due(s, 1e12) == []  # nothing until kopf re-lists the objects


def test_interval_when_filter_deleted_and_per_object_memo() -> None:
    calls = Calls()
    t = periodic.Timer("rollout", calls.fn, 2.0,
                       when=lambda status, **_: any(c["status"] == "True"
                                                    for c in status["conditions"]))
    s = scheduler_with(t)
    s.set_active(True)
    s.observe(None, body("a", progressing=True))
    s.observe(None, body("b", progressing=False))
    first = s.objects[("ns", "a")].first_seen
    assert run_due(s, first) == ["a:rollout"]
    assert run_due(s, first + 1.0) == []  # next run 2 s after the end of the last
    due_at = s.objects[("ns", "a")].next_due["rollout"]
    assert run_due(s, due_at) == ["a:rollout"]
    assert s.objects[("ns", "a")].memo["runs"] == 2
    assert "runs" not in s.memo and s.objects[("ns", "a")].memo["shared"] is True
    s.observe("DELETED", body("a", progressing=True))
    assert run_due(s, 1e12) == []  # a gone object's timers stop at once
    # Recreated under the same name: a new object, a fresh memo.
    s.observe(None, body("a", uid="u2", progressing=True))
    assert run_due(s, 1e12) == ["a:rollout"] and s.objects[("ns", "a")].memo["runs"] == 1


@pytest.mark.parametrize(("error", "expected_delay"), [
    (kopf.TemporaryError("waiting", delay=7), 7.0),
    (kopf.PermanentError("bad spec"), 3.0),
    (RuntimeError("bug"), 3.0),
])
def test_errors_schedule_the_next_run(error: Exception, expected_delay: float) -> None:
    def fails(**_: Any) -> None:
        raise error

    s = scheduler_with(periodic.Timer("t", fails, 3.0))
    s.set_active(True)
    s.observe(None, body("a"))
    tracked = s.objects[("ns", "a")]
    run_due(s, 1e12)
    import time

    left = tracked.next_due["t"] - time.monotonic()
    assert expected_delay - 1 < left <= expected_delay
    assert s.running == set()


def test_kopf_peering_decisions_pause_and_resume() -> None:
    import logging

    s = scheduler_with()
    handler = periodic.PeeringDecisions(s)
    log = logging.getLogger("test-peering")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        log.info("Resuming operations after the pause. Conflicting operators with the same "
                 "priority are gone.")
        assert s.active.is_set()
        log.info("Pausing operations in favour of [Peer(...)].")
        assert not s.active.is_set()
    finally:
        log.removeHandler(handler)


def test_a_spread_timer_starts_each_object_at_its_own_point_of_one_interval() -> None:
    """A thousand objects found together are not all due in the same second: a spread
    timer's first run is at initial_delay + a UID-chosen share of one interval, the same
    every time for one UID; an unspread timer's first run is at initial_delay."""
    calls = Calls()
    spread = periodic.Timer("slow", calls.fn, 60.0, initial_delay_seconds=60.0, spread=True)
    firsts = [spread.first_due(1000.0, f"uid-{i}") for i in range(200)]
    assert all(1060.0 <= t < 1120.0 for t in firsts)
    assert len({round(t) for t in firsts}) > 40  # spread out, not bunched
    assert spread.first_due(1000.0, "uid-7") == firsts[7]
    plain = periodic.Timer("fast", calls.fn, 2.0, initial_delay_seconds=3.0)
    assert plain.first_due(1000.0, "uid-7") == 1003.0

    s = scheduler_with(spread)
    s.set_active(True)
    s.observe(None, body("a", uid="uid-7"))
    first_seen = s.objects[("ns", "a")].first_seen
    assert run_due(s, firsts[7] - 1000.0 + first_seen - 0.01) == []
    assert run_due(s, firsts[7] - 1000.0 + first_seen) == ["a:slow"]


def test_the_long_timers_are_spread_and_the_rollout_follower_is_not() -> None:
    by_id = {t.id: t for t in periodic.TIMERS}
    assert by_id["retune"].spread and by_id["referenced-configmaps"].spread
    assert not by_id["rollout"].spread


def test_a_timer_that_returns_seconds_sets_its_next_run() -> None:
    def fn(**_: Any) -> float:
        return 7.5

    s = scheduler_with(periodic.Timer("t", fn, 2.0))
    s.set_active(True)
    s.observe(None, body("a"))
    first_seen = s.objects[("ns", "a")].first_seen
    assert run_due(s, first_seen) == ["a:t"]
    assert s.objects[("ns", "a")].next_due["t"] - first_seen >= 7.5


def test_a_rollout_that_does_not_move_is_looked_at_less_often_until_it_moves() -> None:
    memo: dict[str, Any] = {}
    status = {"observedGeneration": 1, "pools": [{"name": "h200", "revision": 1}]}
    looks = [handlers.next_rollout_look(memo, status, moved) for moved in
             (False, False, False, False, True, False)]
    assert looks == [2.0, 4.0, 8.0, 8.0, 2.0, 4.0]
    # A new rollout (another revision) is looked at soon again.
    status = {"observedGeneration": 2, "pools": [{"name": "h200", "revision": 2}]}
    assert handlers.next_rollout_look(memo, status, False) == 2.0
