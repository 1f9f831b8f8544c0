"""The status transaction (issue 24): ``status.update`` reads, mutates, patches with the
resourceVersion and retries on 409; ``status.rebase`` applies a reconcile's changes to a
status another writer stored meanwhile (``status_merge.merge``). The API server is faked
here (a stored object whose resourceVersion moves on every write); the concurrency test on
the real one is tests/operator/test_op_status_race_cluster.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvtune.operator.api import InferenceDeploymentStatus, conditions
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import status as status_writer
from kvtune.operator.kube import status_merge

READY = {"type": "Ready", "status": "True", "reason": "AllPoolsApplied", "message": "",
         "lastTransitionTime": "t0"}
NOT_READY = {**READY, "status": "False", "reason": "RollingOut", "lastTransitionTime": "t1"}
STALE = {"type": "ProfileStale", "status": "True", "reason": "PrometheusUnavailable",
         "message": "down", "lastTransitionTime": "t1"}


@pytest.mark.parametrize(("base", "ours", "theirs", "merged"), [
    # Nobody else wrote: ours, exactly.
    ({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}, {"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}),
    # They changed a value we did not: theirs stays; we changed one they did not: ours.
    ({"a": 1, "b": 2}, {"a": 5, "b": 2}, {"a": 1, "b": 9}, {"a": 5, "b": 9}),
    # Both changed one value: ours (the later writer).
    ({"a": 1}, {"a": 2}, {"a": 3}, {"a": 2}),
    # They added a key; we removed one they did not touch.
    ({"a": 1, "gone": 0}, {"a": 1}, {"a": 1, "gone": 0, "new": 7}, {"a": 1, "new": 7}),
    # They removed a key we did not touch: it stays removed.
    ({"a": 1, "x": 2}, {"a": 1, "x": 2}, {"a": 1}, {"a": 1}),
    # Nested: key by key.
    ({"p": {"retune": {"at": "t0"}, "source": "declared"}},
     {"p": {"retune": {"at": "t0"}, "source": "prometheus"}},
     {"p": {"retune": {"at": "t9"}, "source": "declared"}},
     {"p": {"retune": {"at": "t9"}, "source": "prometheus"}}),
    # Conditions: item by item, each whole; their new condition stays.
    ({"conditions": [READY]}, {"conditions": [NOT_READY]}, {"conditions": [READY, STALE]},
     {"conditions": [NOT_READY, STALE]}),
    # Pools: item by item, field by field (their observedSlo beside our plan).
    ({"pools": [{"name": "a", "plan": 1}, {"name": "b", "plan": 1}]},
     {"pools": [{"name": "a", "plan": 2}, {"name": "b", "plan": 1}]},
     {"pools": [{"name": "a", "plan": 1, "observedSlo": 5}, {"name": "b", "plan": 1}]},
     {"pools": [{"name": "a", "plan": 2, "observedSlo": 5}, {"name": "b", "plan": 1}]}),
    # A pool we removed is removed, one they removed and we did not change too.
    ({"pools": [{"name": "a"}, {"name": "b"}]}, {"pools": [{"name": "a"}]},
     {"pools": [{"name": "a"}, {"name": "b", "x": 1}]}, {"pools": [{"name": "a"}]}),
    # Lists of plain values are one value.
    ({"reasons": ["x"]}, {"reasons": ["y"]}, {"reasons": ["x", "z"]}, {"reasons": ["y"]}),
])
def test_a_three_way_merge_applies_our_changes_to_theirs(
        base: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any],
        merged: dict[str, Any]) -> None:
    assert status_merge.merge(base, ours, theirs) == merged


class FakeAPI:
    """One stored InferenceDeployment; every stored write moves its resourceVersion;
    ``intrude`` writes another writer's change just before the next N patches land."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.obj: dict[str, Any] | None = {
            "metadata": {"namespace": "ns", "name": "x", "generation": 3,
                         "resourceVersion": "1"}, "spec": {}, "status": status}
        self.patches = 0
        self.intrusions: list[dict[str, Any]] = []

    def read(self, _kube: Any, _ns: str, _name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.obj)

    def patch(self, _kube: Any, _ns: str, _name: str, patch: dict[str, Any], *,
              resource_version: str) -> kapply.PatchOutcome:
        self.patches += 1
        if self.obj is None:
            return "gone"
        if self.intrusions:
            self._store(self.intrusions.pop(0))
        if resource_version != self.obj["metadata"]["resourceVersion"]:
            return "conflict"
        self._store(patch)
        return "written"

    def _store(self, patch: dict[str, Any]) -> None:
        assert self.obj is not None
        self.obj["status"] = _apply(self.obj["status"], patch)
        self.obj["metadata"]["resourceVersion"] = str(
            int(self.obj["metadata"]["resourceVersion"]) + 1)


def _apply(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies a merge patch."""
    out = dict(doc)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _apply(out[k], v)
        else:
            out[k] = v
    return out


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAPI:
    api = FakeAPI({"observedGeneration": 2, "conditions": [READY]})
    monkeypatch.setattr(kapply, "read_inference_deployment", api.read)
    monkeypatch.setattr(kapply, "patch_status", api.patch)
    return api


def _set_ready_false(current: InferenceDeploymentStatus,
                     obj: dict[str, Any]) -> InferenceDeploymentStatus:
    conds = conditions.set_condition(current.conditions, conditions.READY, False, "RollingOut",
                                     "", generation=obj["metadata"]["generation"], now="t1")
    return current.model_copy(update={"conditions": conds})


def test_a_conflict_is_read_again_and_the_mutation_applied_to_the_newer_status(
        fake: FakeAPI) -> None:
    fake.intrusions = [{"conditions": [READY, STALE]}]  # the retune timer, in between
    done = status_writer.update(None, "ns", "x", _set_ready_false)  # type: ignore[arg-type]
    assert done.written and fake.patches == 2
    assert fake.obj is not None
    stored = {c["type"]: c["status"] for c in fake.obj["status"]["conditions"]}
    assert stored == {"Ready": "False", "ProfileStale": "True"}


def test_conflicts_are_retried_a_bounded_number_of_times(fake: FakeAPI) -> None:
    fake.intrusions = [{"poolSummary": str(i)} for i in range(status_writer.MAX_ATTEMPTS + 5)]
    with pytest.raises(status_writer.StatusConflict, match="ns/x: 8 conflicting writes"):
        status_writer.update(None, "ns", "x", _set_ready_false)  # type: ignore[arg-type]
    assert fake.patches == status_writer.MAX_ATTEMPTS


def test_nothing_is_written_when_the_mutation_changes_nothing(fake: FakeAPI) -> None:
    done = status_writer.update(None, "ns", "x",  # type: ignore[arg-type]
                                lambda current, _obj: current)
    assert not done.written and fake.patches == 0
    assert done.status == status_writer.read(fake.read(None, "ns", "x") or {})


def test_a_deleted_object_is_not_written(fake: FakeAPI) -> None:
    fake.obj = None
    done = status_writer.update(None, "ns", "x", _set_ready_false)  # type: ignore[arg-type]
    assert done == status_writer.Updated(written=False, status=None)


def test_a_rebased_reconcile_keeps_the_timers_report(fake: FakeAPI) -> None:
    """The race of issue 24: the reconcile read status, the timer stored its report, the
    reconcile writes: its change lands and the report stays."""
    body = fake.read(None, "ns", "x")
    assert body is not None
    previous = status_writer.read(body)
    ours = _set_ready_false(previous, body).model_copy(update={"observed_generation": 3})
    fake.intrusions = [{"conditions": [READY, STALE], "poolSummary": "H200x1"}]
    # On the copy it was read as, the rebase is the reconcile's status exactly.
    assert status_writer.rebase(previous, ours)(previous, body) == ours
    done = status_writer.update(None, "ns", "x",  # type: ignore[arg-type]
                                status_writer.rebase(previous, ours), body=body)
    assert done.written and fake.patches == 2 and fake.obj is not None
    stored = status_writer.read(fake.obj)
    assert stored.observed_generation == 3
    assert [(c.type, c.status) for c in stored.conditions] == [
        ("Ready", "False"), ("ProfileStale", "True")]
    assert stored.pool_summary == "H200x1"
