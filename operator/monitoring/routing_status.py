"""RoutingReady: whether the request path that spec.routing renders serves, as the cluster says.

kvtune applies each pool's endpoint picker (a Deployment) and, with ``spec.routing.gateway``,
an HTTPRoute. Neither being applied means it serves:

- the picker's pods run as the ServiceAccount ``kvtune-endpoint-picker``, which the chart
  creates only in its runtime namespaces (cluster mode: ``runtime.namespaces``). Elsewhere the
  picker's ReplicaSet cannot create a pod, so the pool gets no endpoint picker (with the
  InferencePool's ``FailOpen`` a gateway then sends requests to any pod of the pool, if it
  does at all);
- a picker Deployment may not become available (unschedulable, image not pulled);
- the gateway may refuse the HTTPRoute: each gateway controller writes ``status.parents[]``
  with ``Accepted`` and ``ResolvedRefs`` conditions (e.g. ``UnsupportedValue`` for a session
  persistence type it does not implement, ``InvalidKind``/``BackendNotFound`` for an
  InferencePool backend it cannot use). Until one writes, nothing is known.

The condition is worked out on every reconcile and by the routing-status timer
(``operator/handlers.py``), which also refreshes ``status.pools[].routing``'s picker
availability. Reads only: ``get`` on Deployments ("rendered"), on HTTPRoutes and on the one
ServiceAccount ``kvtune-endpoint-picker`` (the chart's "routing" concern, docs/rbac.md).
``picker_state``, ``route_verdict`` and ``verdict`` are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvtune.operator.api import InferenceDeploymentSpec, InferenceDeploymentStatus, PoolStatus
from kvtune.operator.api import conditions as cond
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import status as status_writer
from kvtune.operator.kube.locks import object_lock
from kvtune.operator.rollout.outcome import Event
from kvtune.operator.routing import endpoint_picker, http_route

Verdict = tuple[str, str, str]  # (status, reason, message) of RoutingReady
# The reasons that are worth a Warning Event when they appear (the user must act).
WARNING_REASONS = (cond.ENDPOINT_PICKER_ACCESS_MISSING, cond.ROUTE_NOT_ACCEPTED,
                   cond.ROUTE_REFS_UNRESOLVED)


def access_missing_message(namespace: str) -> str:
    return (f"namespace {namespace} has no ServiceAccount {endpoint_picker.SERVICE_ACCOUNT}, so "
            f"the pools' endpoint pickers cannot start a pod. Fix: add {namespace} to the Helm "
            f"chart's runtime.namespaces (namespaced mode: to operator.watchNamespaces) with "
            f"routing.enabled=true, or set spec.routing.enabled to false")


def _condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return None


def picker_state(name: str, deployment: Mapping[str, Any] | None) -> tuple[bool, str]:
    """(available, why) of one pool's endpoint picker Deployment as the server holds it."""
    if deployment is None:
        return False, f"Deployment {name} does not exist (yet)"
    wanted = int((deployment.get("spec") or {}).get("replicas", 1))
    st = deployment.get("status") or {}
    ready = int(st.get("availableReplicas") or 0)
    available = _condition(deployment, "Available")
    failure = _condition(deployment, "ReplicaFailure")
    ok = ready >= max(wanted, 1) and available is not None and available.get("status") == "True"
    why = f"Deployment {name}: {ready}/{wanted} available"
    if failure is not None and failure.get("status") == "True":
        why += f" ({failure.get('reason')}: {failure.get('message')})"
    return ok, why


def _same_parent(ref: Mapping[str, Any], gateway: http_route.GatewayRef, namespace: str) -> bool:
    return (ref.get("name") == gateway.name
            and (ref.get("namespace") or namespace) == (gateway.namespace or namespace)
            and (gateway.section_name is None or ref.get("sectionName") == gateway.section_name)
            and ref.get("kind", "Gateway") == "Gateway")


def route_verdict(route: Mapping[str, Any] | None, gateway: http_route.GatewayRef,
                  namespace: str) -> Verdict:
    """What the gateway controllers wrote in the HTTPRoute's ``status.parents`` for the
    route's current generation about the Gateway kvtune attached it to."""
    gw = f"Gateway {gateway.namespace or namespace}/{gateway.name}"
    if route is None:
        return "Unknown", cond.AWAITING_GATEWAY, "the HTTPRoute is not applied yet"
    name = route["metadata"]["name"]
    generation = route["metadata"].get("generation")
    parents = [p for p in (route.get("status") or {}).get("parents") or []
               if isinstance(p, Mapping) and _same_parent(p.get("parentRef") or {}, gateway,
                                                          namespace)]
    if not parents:
        return "Unknown", cond.AWAITING_GATEWAY, (
            f"no gateway has reported on HTTPRoute {name} for {gw} yet (its status.parents "
            f"is empty): is a gateway controller running for that Gateway?")
    reports = []
    for parent in parents:
        controller = parent.get("controllerName") or "a gateway controller"
        current = {str(c.get("type")): c for c in parent.get("conditions") or []
                   if isinstance(c, Mapping) and (generation is None or c.get(
                       "observedGeneration") in (None, generation))}
        for type_, reason in (("Accepted", cond.ROUTE_NOT_ACCEPTED),
                              ("ResolvedRefs", cond.ROUTE_REFS_UNRESOLVED)):
            c = current.get(type_)
            if c is not None and c.get("status") == "False":
                return "False", reason, (
                    f"{controller} reports HTTPRoute {name} on {gw} {type_}=False "
                    f"({c.get('reason')}): {c.get('message') or 'no message'}")
        if all(current.get(t, {}).get("status") == "True" for t in ("Accepted", "ResolvedRefs")):
            reports.append(controller)
    if not reports:
        return "Unknown", cond.AWAITING_GATEWAY, (
            f"no gateway has reported Accepted and ResolvedRefs on HTTPRoute {name} "
            f"(generation {generation}) for {gw} yet")
    return "True", cond.ROUTED, f"HTTPRoute {name} accepted by {', '.join(sorted(reports))}"


def verdict(pools: Sequence[PoolStatus], *, access_missing: str | None,
            route: Verdict | None) -> Verdict:
    """RoutingReady over the pools' pickers, the pickers' access and the route (None: no
    ``spec.routing.gateway``)."""
    if access_missing is not None:
        return "False", cond.ENDPOINT_PICKER_ACCESS_MISSING, access_missing
    down = [f"pool {p.name}: " + (p.routing.message if p.routing else "not routed yet")
            for p in pools if p.routing is None or not p.routing.endpoint_picker_available]
    if down:
        return "False", cond.ENDPOINT_PICKER_UNAVAILABLE, "; ".join(down)
    pickers = f"{len(pools)} endpoint picker(s) available"
    if route is None:
        return "True", cond.ROUTED, f"{pickers}; no spec.routing.gateway: no HTTPRoute"
    status, reason, message = route
    return status, reason, f"{pickers}; {message}"


def evaluate(kube: kapply.Kube, body: Mapping[str, Any], spec: InferenceDeploymentSpec,
             pools: Sequence[PoolStatus]) -> tuple[list[PoolStatus], Verdict]:
    """The pools with their pickers' availability read, and RoutingReady; a read the API
    server refuses makes RoutingReady Unknown, never a failed reconcile."""
    try:
        return _evaluate(kube, body, spec, pools)
    except kapply.ApplyError as exc:
        return list(pools), ("Unknown", cond.ROUTING_UNREADABLE,
                             f"kvtune could not read the routing objects' state: {exc}")


def _evaluate(kube: kapply.Kube, body: Mapping[str, Any], spec: InferenceDeploymentSpec,
              pools: Sequence[PoolStatus]) -> tuple[list[PoolStatus], Verdict]:
    namespace = body["metadata"]["namespace"]
    access_missing = None
    try:
        if kapply.read_object(kube, "ServiceAccount", namespace,
                              endpoint_picker.SERVICE_ACCOUNT) is None:
            access_missing = access_missing_message(namespace)
    except kapply.Forbidden:  # a chart from before this right: the pickers' state still tells
        pass
    out = []
    for pool in pools:
        routing = pool.routing
        if routing is not None:
            ok, why = picker_state(routing.endpoint_picker, kapply.read_object(
                kube, "Deployment", namespace, routing.endpoint_picker))
            routing = routing.model_copy(update={"endpoint_picker_available": ok,
                                                 "message": why})
        out.append(pool.model_copy(update={"routing": routing}))
    route: Verdict | None = None
    gateway = spec.routing.gateway
    if gateway is not None:
        ref = http_route.GatewayRef(gateway.name, gateway.namespace, gateway.section_name)
        route = route_verdict(kapply.read_object(kube, "HTTPRoute", namespace,
                                                 body["metadata"]["name"]), ref, namespace)
    return out, verdict(out, access_missing=access_missing, route=route)


def warning(previous: Sequence[Any], new: Verdict) -> Event | None:
    """A Warning Event when a reason the user must act on appears or its message changes."""
    _, reason, message = new
    if reason not in WARNING_REASONS:
        return None
    before = cond.get_condition(previous, cond.ROUTING_READY)
    if before is not None and (before.reason, before.message) == (reason, message):
        return None
    return Event("Warning", reason, message)


def refresh(body: Mapping[str, Any], *, kube: kapply.Kube,
            now: str | None = None) -> list[Event]:
    """Re-read the pickers and the route into status (the routing-status timer); returns the
    Events to post. Only for ``auto`` objects with spec.routing.enabled.

    One status transaction: ``body`` is the timer's copy (the watch's latest) and its first
    try, not read again (a thousand routed objects cost no extra GET each); a status written
    since is never overwritten: the transaction reads again and looks again."""
    meta = body["metadata"]
    events: list[Event] = []

    def mutate(previous: InferenceDeploymentStatus,
               obj: Mapping[str, Any]) -> InferenceDeploymentStatus | None:
        events.clear()  # a retry's look replaces the last one's
        try:
            spec = InferenceDeploymentSpec.model_validate(obj.get("spec") or {})
        except ValueError:  # the reconcile reports an invalid spec
            return None
        if not spec.routing.enabled or previous.mode != "auto" or not previous.pools:
            return None
        pools, new = evaluate(kube, obj, spec, previous.pools)
        conditions = cond.set_condition(previous.conditions, cond.ROUTING_READY, new[0],
                                        new[1], new[2],
                                        generation=previous.observed_generation, now=now)
        status = previous.model_copy(update={"pools": pools, "conditions": conditions})
        event = warning(previous.conditions, new)
        if event is not None:
            events.append(event)
        return status

    with object_lock(meta["namespace"], meta["name"]):
        written = status_writer.update(kube, meta["namespace"], meta["name"], mutate,
                                       body=body).written
    return events if written else []
