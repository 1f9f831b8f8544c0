"""The closed loop's store and condition without a cluster: the ConfigMap is created once,
then updated under its resourceVersion (a 409 is redone on the newer object, never lost);
CalibrationDrift's three states (operator/kube/model_calibrations.py,
operator/retune/calibration_loop.py)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kvtune.operator.kube import model_calibrations as store
from kvtune.operator.retune import calibration_loop as loop
from kvtune.tuner import model_calibration as mc

KEY = mc.CalibrationKey(model="m", gpu_class="H100", vllm_version="0.33.0")
OTHER = mc.CalibrationKey(model="m", gpu_class="H200", vllm_version="0.33.0")


class FakeApi:
    """One ConfigMap with a resourceVersion; ``race`` writes land between a read and a PUT."""

    def __init__(self) -> None:
        self.cm: dict[str, Any] | None = None
        self.version = 0
        self.race: list[mc.CalibrationSet] = []
        self.calls: list[str] = []

    def _store(self, body: dict[str, Any]) -> None:
        self.version += 1
        self.cm = copy.deepcopy(body)
        self.cm["metadata"]["resourceVersion"] = str(self.version)

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        self.calls.append(method)
        if method == "GET":
            if self.cm is None:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(self.cm)
        if self.race:  # another writer came first
            other = self.race.pop(0)
            self._store({"metadata": {"name": store.CONFIG_MAP},
                         "data": {mc.CONFIG_MAP_KEY: other.model_dump_json()}})
            raise ApiException(status=409, reason="Conflict")
        if method == "PUT":
            assert body["metadata"]["resourceVersion"] == str(self.version)
        else:
            assert method == "POST" and self.cm is None
        self._store(body)
        return {}

    def stored(self) -> mc.CalibrationSet:
        assert self.cm is not None
        return mc.CalibrationSet.model_validate(json.loads(self.cm["data"][mc.CONFIG_MAP_KEY]))


def _add(key: mc.CalibrationKey, scale: float
         ) -> Callable[[mc.CalibrationSet], mc.CalibrationSet]:
    def mutate(current: mc.CalibrationSet) -> mc.CalibrationSet:
        return mc.CalibrationSet(calibrations=tuple(mc.replace(
            current.calibrations, mc.ModelCalibration(key=key, kv_tokens_scale=scale))))
    return mutate


def test_created_once_then_updated_under_its_resource_version() -> None:
    api = FakeApi()
    store.update(api, _add(KEY, 0.9), ns="ops")  # type: ignore[arg-type]
    store.update(api, _add(KEY, 0.85), ns="ops")  # type: ignore[arg-type]
    assert api.calls == ["GET", "POST", "GET", "PUT"]
    assert [c.kv_tokens_scale for c in api.stored().calibrations] == [0.85]


def test_a_conflict_is_redone_on_the_other_writers_object() -> None:
    api = FakeApi()
    store.update(api, _add(KEY, 0.9), ns="ops")  # type: ignore[arg-type]
    api.race = [mc.CalibrationSet(calibrations=(mc.ModelCalibration(key=OTHER),
                                                mc.ModelCalibration(key=KEY)))]
    store.update(api, _add(KEY, 0.85), ns="ops")  # type: ignore[arg-type]
    # The other writer's H200 entry survives; ours is applied on top of its object.
    got = {c.key.gpu_class: c.kv_tokens_scale for c in api.stored().calibrations}
    assert got == {"H100": 0.85, "H200": 1.0}


def test_no_change_writes_nothing_and_endless_conflicts_raise() -> None:
    api = FakeApi()
    assert store.update(api, lambda current: None, ns="ops") is None  # type: ignore[arg-type]
    assert api.calls == ["GET"]
    api.race = [mc.CalibrationSet()] * store.MAX_ATTEMPTS
    with pytest.raises(ApiException):
        store.update(api, _add(KEY, 0.9), ns="ops")  # type: ignore[arg-type]


def _pool(obs: mc.CalibrationObservation) -> loop.PoolLoop:
    return loop.PoolLoop("h100", KEY, obs, tuple(mc.drift(obs)))


def test_the_condition_says_drift_hold_or_awaiting() -> None:
    drifting = mc.CalibrationObservation(predicted_kv_blocks=1000, observed_kv_blocks=850,
                                         kv_reports=1)
    status, reason, message = loop.condition((_pool(drifting),))
    assert (status, reason) == ("True", loop.PREDICTIONS_DRIFT)
    assert "kv_blocks: observed 850, predicted 1000 (0.85x)" in message
    held = drifting.model_copy(update={"observed_kv_blocks": 990})
    assert loop.condition((_pool(held),))[:2] == ("False", loop.PREDICTIONS_HOLD)
    none = mc.CalibrationObservation(predicted_decode_seconds=0.02,
                                     observed_decode_seconds=0.03, decode_tokens=10)
    assert loop.condition((_pool(none),))[:2] == ("Unknown", loop.AWAITING_EVIDENCE)


def test_a_factor_held_at_its_bound_is_not_written_again() -> None:
    """Evidence alone never writes (a write re-plans): a pool whose KV figure is 3x off moves
    the factor to its bound once, then the same window writes nothing."""
    obs = mc.CalibrationObservation(predicted_kv_blocks=1000, observed_kv_blocks=3000,
                                    kv_reports=1)
    mutate = loop._fitted((_pool(obs),), now="t")
    first = mutate(mc.CalibrationSet())
    assert first is not None and first.calibrations[0].kv_tokens_scale == mc.FACTOR_MAX
    assert mutate(first) is None
