"""lastTransitionTime moves only when a condition's status flips."""

from __future__ import annotations

import pytest

from kvtune.operator.api import Condition
from kvtune.operator.api import conditions as cond

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"


def _ready(status: str, reason: str = "R", message: str = "m") -> Condition:
    return Condition(type="Ready", status=status, reason=reason, message=message,  # type: ignore[arg-type]
                     last_transition_time=T0, observed_generation=1)


@pytest.mark.parametrize(("before", "set_to", "reason", "moved"), [
    (None, True, "AllPoolsApplied", True),  # new condition: stamped now
    ("True", True, "AllPoolsApplied", False),  # same status: time kept
    ("True", True, "OtherReason", False),  # new reason alone: time kept
    ("True", False, "RollingOut", True),  # flip: time moves
    ("False", True, "AllPoolsApplied", True),
    ("Unknown", "Unknown", "Waiting", False),
])
def test_transition_time_moves_only_on_flips(
    before: str | None, set_to: bool | str, reason: str, moved: bool
) -> None:
    existing = [] if before is None else [_ready(before)]
    out = cond.set_condition(existing, cond.READY, set_to, reason, "msg", generation=2, now=T1)
    (ready,) = out
    assert ready.last_transition_time == (T1 if moved else T0)
    assert ready.reason == reason and ready.message == "msg"
    assert ready.observed_generation == 2


def test_other_conditions_kept_and_ordered() -> None:
    out = cond.set_condition([_ready("True")], cond.DEGRADED, False, "AsExpected", "",
                             generation=1, now=T1)
    out = cond.set_condition(out, cond.PROGRESSING, True, "RollingOut", "1/2", generation=1,
                             now=T1)
    assert [c.type for c in out] == ["Ready", "Progressing", "Degraded"]
    assert cond.get_condition(out, "Ready") == _ready("True")
    assert cond.get_condition(out, cond.PROFILE_STALE) is None


@pytest.mark.parametrize(("old", "new", "patch"), [
    ({}, {"a": 1}, {"a": 1}),
    ({"a": 1, "b": 2}, {"a": 1}, {"a": 1, "b": None}),
    ({"p": {"x": 1, "y": 2}}, {"p": {"x": 1}}, {"p": {"x": 1, "y": None}}),
    ({"l": [{"x": 1, "y": 2}]}, {"l": [{"x": 1}]}, {"l": [{"x": 1}]}),  # lists replaced whole
    ({"p": {"x": 1}}, {"p": 3}, {"p": 3}),
])
def test_status_merge_patch_nulls_what_disappeared(
    old: dict[str, object], new: dict[str, object], patch: dict[str, object]
) -> None:
    from kvtune.operator.kube.status import merge_patch

    assert merge_patch(old, new) == patch


def _deployment(generation: int = 2, observed: int = 2, replicas: int = 2, updated: int = 2,
                available: int = 2, total: int = 2,
                conditions: list[dict[str, str]] | None = None) -> dict[str, object]:
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated,
                       "availableReplicas": available, "replicas": total,
                       "conditions": conditions or []}}


STUCK = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": 'ReplicaSet "x" has timed out progressing.'}


@pytest.mark.parametrize(("deployment", "done", "progress", "stuck"), [
    (_deployment(), True, "2/2 replicas updated and available", None),
    (_deployment(observed=1), False, "has not seen the new template", None),
    (_deployment(updated=1, total=3), False, "1/2 replicas updated", None),
    (_deployment(total=3), False, "1 old replicas pending termination", None),
    (_deployment(available=1), False, "1/2 replicas available", None),
    (_deployment(available=0, conditions=[STUCK]), False, "0/2 replicas available",
     "timed out progressing"),
    (_deployment(conditions=[{"type": "Progressing", "status": "True",
                              "reason": "NewReplicaSetAvailable"}]), True, "2/2", None),
])
def test_rollout_progress_of_a_deployment(
    deployment: dict[str, object], done: bool, progress: str, stuck: str | None
) -> None:
    from kvtune.operator.kube.apply import rollout_done, rollout_stuck

    got_done, got_progress = rollout_done(deployment)
    assert got_done == done and progress in got_progress
    got_stuck = rollout_stuck(deployment)
    assert (got_stuck is None) == (stuck is None)
    if stuck is not None:
        assert stuck in got_stuck  # type: ignore[operator]
