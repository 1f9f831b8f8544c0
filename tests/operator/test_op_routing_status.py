"""RoutingReady from what the cluster holds (pure): a picker Deployment's availability, the
gateway controllers' status.parents on the HTTPRoute, and the verdict over both."""

from __future__ import annotations

from typing import Any

from kvtune.operator.api import PoolRoutingStatus, PoolStatus
from kvtune.operator.api import conditions as cond
from kvtune.operator.monitoring import routing_status
from kvtune.operator.routing.http_route import GatewayRef

GW = GatewayRef("inference-gateway")


def _deployment(available: int, *, condition: str = "True",
                failure: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "Available", "status": condition}]
    if failure:
        conditions.append({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                           "message": failure})
    return {"spec": {"replicas": 1},
            "status": {"availableReplicas": available, "conditions": conditions}}


def test_a_picker_is_available_only_with_its_replica_available() -> None:
    assert routing_status.picker_state("bot-h200-epp", _deployment(1)) == (
        True, "Deployment bot-h200-epp: 1/1 available")
    assert not routing_status.picker_state("bot-h200-epp", _deployment(0, condition="False"))[0]
    assert not routing_status.picker_state("bot-h200-epp", None)[0]
    ok, why = routing_status.picker_state("bot-h200-epp", _deployment(
        0, condition="False", failure='serviceaccount "kvtune-endpoint-picker" not found'))
    assert not ok and 'serviceaccount "kvtune-endpoint-picker" not found' in why


def _route(*parents: dict[str, Any], generation: int = 2) -> dict[str, Any]:
    return {"metadata": {"name": "bot", "generation": generation},
            "status": {"parents": list(parents)}}


def _parent(accepted: str, resolved: str = "True", *, name: str = "inference-gateway",
            generation: int = 2, reason: str = "Accepted") -> dict[str, Any]:
    return {"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                          "name": name},
            "controllerName": "example.net/gateway-controller",
            "conditions": [
                {"type": "Accepted", "status": accepted, "reason": reason,
                 "message": "sessionPersistence type Header is not supported",
                 "observedGeneration": generation},
                {"type": "ResolvedRefs", "status": resolved, "reason": "BackendNotFound",
                 "message": "InferencePool bot-h200 not found",
                 "observedGeneration": generation}]}


def test_the_gateways_word_on_the_route() -> None:
    status, reason, message = routing_status.route_verdict(_route(), GW, "llm")
    assert (status, reason) == ("Unknown", cond.AWAITING_GATEWAY)
    assert "no gateway has reported" in message
    assert routing_status.route_verdict(_route(_parent("True")), GW, "llm")[:2] == (
        "True", cond.ROUTED)
    status, reason, message = routing_status.route_verdict(
        _route(_parent("False", reason="UnsupportedValue")), GW, "llm")
    assert (status, reason) == ("False", cond.ROUTE_NOT_ACCEPTED)
    assert "UnsupportedValue" in message and "example.net/gateway-controller" in message
    assert routing_status.route_verdict(_route(_parent("True", "False")), GW, "llm")[:2] == (
        "False", cond.ROUTE_REFS_UNRESOLVED)
    # Another Gateway's report, or one about an older generation of the route, says nothing.
    assert routing_status.route_verdict(_route(_parent("True", name="other")), GW, "llm")[
        1] == cond.AWAITING_GATEWAY
    assert routing_status.route_verdict(_route(_parent("False", generation=1)), GW, "llm")[
        1] == cond.AWAITING_GATEWAY


def _pool(name: str, available: bool | None) -> PoolStatus:
    routing = None if available is None else PoolRoutingStatus(
        max_model_len=8192, endpoint_picker=f"bot-{name}-epp",
        endpoint_picker_available=available, message=f"Deployment bot-{name}-epp: 0/1")
    return PoolStatus(name=name, gpu_class="H200", tensor_parallel=1, replicas=1,
                      phase="Applied", routing=routing)


def test_the_verdict_names_the_first_thing_to_fix() -> None:
    accepted = ("True", cond.ROUTED, "HTTPRoute bot accepted by x")
    up = [_pool("h200", True), _pool("h100", True)]
    assert routing_status.verdict(up, access_missing=None, route=accepted)[:2] == (
        "True", cond.ROUTED)
    assert routing_status.verdict(up, access_missing=None, route=None)[0] == "True"
    missing = routing_status.access_missing_message("llm")
    assert "runtime.namespaces" in missing and "kvtune-endpoint-picker" in missing
    assert routing_status.verdict(up, access_missing=missing, route=accepted)[:2] == (
        "False", cond.ENDPOINT_PICKER_ACCESS_MISSING)
    status, reason, message = routing_status.verdict(
        [_pool("h200", True), _pool("h100", False)], access_missing=None, route=accepted)
    assert (status, reason) == ("False", cond.ENDPOINT_PICKER_UNAVAILABLE)
    assert "pool h100" in message and "h200" not in message
    assert routing_status.verdict([_pool("h200", None)], access_missing=None,
                                  route=accepted)[1] == cond.ENDPOINT_PICKER_UNAVAILABLE
    awaiting = ("Unknown", cond.AWAITING_GATEWAY, "no gateway has reported")
    assert routing_status.verdict(up, access_missing=None, route=awaiting)[0] == "Unknown"
