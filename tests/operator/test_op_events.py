"""Events are one per change of reason (issue 21): a timer that reports the same outcome
every minute posts one Event and folds the repeats into it, not one Event a minute."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kvtune.operator.kube import events


class FakeApi:
    """The API server's events endpoint: POST names the Event, PATCH needs it to exist."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.events: dict[str, dict[str, Any]] = {}

    def request(self, method: str, path: str, *, body: Any = None, query: Any = None,
                content_type: str = "application/json") -> dict[str, Any]:
        self.calls.append((method, path, body))
        if method == "POST":
            name = f"{body['metadata']['generateName']}{len(self.events):04d}"
            self.events[name] = {**body, "metadata": {**body["metadata"], "name": name}}
            return self.events[name]
        name = path.rsplit("/", 1)[1]
        if name not in self.events:
            raise ApiException(status=404, reason="Not Found")
        self.events[name].update(body)
        return self.events[name]

    def methods(self) -> list[str]:
        return [m for m, _, _ in self.calls]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _owner(uid: str = "u-1", name: str = "bot") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "llm", "uid": uid}}


@pytest.fixture
def setup() -> tuple[events.EventRecorder, FakeApi, Clock]:
    clock = Clock()
    return events.EventRecorder(clock=clock), FakeApi(), clock


def test_an_hour_of_the_same_reason_is_one_event(
    setup: tuple[events.EventRecorder, FakeApi, Clock],
) -> None:
    recorder, api, clock = setup
    outcomes = []
    for minute in range(60):  # the retune timer, once a minute
        clock.now += 60
        outcomes.append(recorder.post(api.request, _owner(), "Normal", "RetuneNoDrift",
                                      f"drift 0.0{minute % 10} below threshold 0.300"))
    assert api.methods().count("POST") == 1 and len(api.events) == 1
    # Repeats update the one Event at most every SERIES_UPDATE_SECONDS (600 s): 5 in the hour.
    assert api.methods().count("PATCH") == 5
    assert outcomes[0] == "posted" and outcomes.count("patched") == 5
    (event,) = api.events.values()
    assert event["reason"] == "RetuneNoDrift" and event["count"] == 51  # the last patch's
    assert event["message"].startswith("drift 0.0")
    assert event["involvedObject"]["uid"] == "u-1"
    assert event["involvedObject"]["kind"] == "InferenceDeployment"


def test_a_new_reason_is_a_new_event_and_a_return_is_too(
    setup: tuple[events.EventRecorder, FakeApi, Clock],
) -> None:
    recorder, api, clock = setup
    sequence = [("Normal", "PlanChanged"), ("Normal", "RolloutStarted"),
                ("Normal", "RolloutStarted"), ("Warning", "RolloutStarted"),
                ("Normal", "PlanChanged")]
    got = []
    for type_, reason in sequence:
        clock.now += 1
        got.append(recorder.post(api.request, _owner(), type_, reason, reason))
    assert got == ["posted", "posted", "counted", "posted", "posted"]
    assert [e["reason"] for e in api.events.values()] == [
        "PlanChanged", "RolloutStarted", "RolloutStarted", "PlanChanged"]


def test_objects_have_their_own_series(
    setup: tuple[events.EventRecorder, FakeApi, Clock],
) -> None:
    recorder, api, _ = setup
    for uid in ("u-1", "u-2", "u-1", "u-2"):
        recorder.post(api.request, _owner(uid), "Warning", "SLOAtRisk", "p95 over target")
    assert api.methods() == ["POST", "POST"]
    recorder.forget(_owner("u-1"))  # deleted and re-created under the same name
    recorder.post(api.request, _owner("u-1"), "Warning", "SLOAtRisk", "p95 over target")
    assert api.methods() == ["POST", "POST", "POST"]


def test_an_expired_event_starts_a_new_series(
    setup: tuple[events.EventRecorder, FakeApi, Clock],
) -> None:
    recorder, api, clock = setup
    recorder.post(api.request, _owner(), "Warning", "RuntimeRefused", "refused")
    api.events.clear()  # the API server's --event-ttl removed it
    clock.now += events.SERIES_UPDATE_SECONDS + 1
    assert recorder.post(api.request, _owner(), "Warning", "RuntimeRefused",
                         "refused") == "posted"
    assert api.methods() == ["POST", "PATCH", "POST"] and len(api.events) == 1


def test_post_event_goes_through_the_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtune.operator.kube import apply as kapply

    api = FakeApi()
    monkeypatch.setattr(events, "RECORDER", events.EventRecorder(clock=Clock()))

    class Kube:
        request = staticmethod(api.request)

    for _ in range(3):
        kapply.post_event(Kube(), _owner(), "Normal", "RetuneNoDrift", "no drift")  # type: ignore[arg-type]
    assert api.methods() == ["POST"]


def test_a_new_rollout_is_a_new_event_and_a_retune_tick_is_a_repeat(
    setup: tuple[events.EventRecorder, FakeApi, Clock],
) -> None:
    """Same reason, new message: a rollout of revision 3 after revision 2 says something new
    (posted); the retune timer's tick folds though its drift figures change."""
    recorder, api, _clock = setup
    owner = _owner()
    assert recorder.post(api.request, owner, "Normal", "RolloutStarted", "revision 2") \
        == "posted"
    assert recorder.post(api.request, owner, "Normal", "RolloutStarted", "revision 2") \
        == "counted"
    assert recorder.post(api.request, owner, "Normal", "RolloutStarted", "revision 3") \
        == "posted"
    assert recorder.post(api.request, owner, "Normal", "RetuneNoDrift", "drift 0.01") \
        == "posted"
    assert recorder.post(api.request, owner, "Normal", "RetuneNoDrift", "drift 0.02") \
        == "counted"
    assert sorted(e["message"] for e in api.events.values()) == [
        "drift 0.01", "revision 2", "revision 3"]
