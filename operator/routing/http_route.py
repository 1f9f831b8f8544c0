"""The Gateway API HTTPRoute in front of an InferenceDeployment's pools. Pure.

With ``spec.routing.gateway`` kvtune renders one HTTPRoute (``gateway.networking.k8s.io/v1``)
attached to that Gateway whose backends are the pools' InferencePools. What it can say, and
what Gateway API v1.5.1 with the Inference Extension v1.5.0 cannot:

- **Session affinity by header** (``spec.routing.sessionHeader``): every rule carries
  ``sessionPersistence: {type: Header, sessionName: <header>}`` (GEP-1619; experimental
  channel, "Extended" support for the Header type). A gateway that implements it keeps a
  session's requests on one backend, so a conversation stays in one pool. Inside a pool the
  endpoint picker chooses the pod; the Inference Extension v1.5.0 has no plugin keyed on a
  session header (its plugin registry: ``cmd/epp/runner/runner.go``), so kvtune's endpoint
  picker configuration uses the content affinity it does have for multi-turn traffic
  (``routing.AFFINITY_FILTER``: a conversation's history is its prefix).
- **Requests longer than a pool's max-model-len** (``spec.routing.lengthHeader``): Gateway
  API matches paths, headers, query parameters and methods, never the body, and neither
  the Inference Extension's body-based router (its plugins copy a body field or map the model
  name into a header) nor its endpoint picker (no filter on a pod's max-model-len) counts a
  prompt's tokens. So kvtune routes on a header that states the prompt's length in tokens,
  set by the client or by a gateway-specific body transform: for each pool but the shortest,
  a rule whose header match (``RegularExpression``, whose syntax is implementation-specific;
  the patterns use only anchors, digits, classes, ``{n}``, ``{n,}`` and ``|``, common to RE2,
  ECMAScript and PCRE) takes the lengths above the next shorter pool's max-model-len up to
  its own, and sends them to the shortest pools that hold them. Requests without the header
  go to every pool by weight (the shortest pool may then refuse a long one, as without
  routing).

**Weights by capacity.** A backend's weight is proportional to the pool's capacity (the
requests/s one replica of its applied plan sustains within the SLO, ``capacity_of``) times its
replicas, so a pool of fast GPUs gets the share of traffic it can serve rather than its share
of pods. The plan carries a capacity wherever the capacity search planned it (its
``capacity_requests_per_second``); when any routed pool lacks one (a plan by the rules alone,
or one no rate meets the SLO on), every weight is the pool's replica count, as before,
since mixing the two scales would be meaningless. Status holds the pool's replicas, not its
ready ones, so the count is the replicas kvtune asked for.

Several weighted InferencePools in one rule is the Extension's own documented pattern (its
``inferencepool-rollout`` guide); some gateways have mishandled it (each pool must keep its
own endpoint picker: istio/istio#61594, higress-group/higress#4519), so check yours.
kvtune renders no provider-specific object: the endpoint picker serves TLS with its own
certificate (``--secure-serving``, its default), which, e.g., Istio must be told to accept
(the Extension's chart renders a DestinationRule for ``provider.name=istio``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtune.operator.api import PoolStatus, RoutingSpec
    from kvtune.tuner.plan import PoolPlan

API = "gateway.networking.k8s.io/v1"
GATEWAY_GROUP = "gateway.networking.k8s.io"
POOL_GROUP = "inference.networking.k8s.io"
GATEWAY_API_VERSION = "v1.5.1"  # the release whose CRDs the tests install
MAX_RULES = 16  # the HTTPRoute CRD's maxItems on spec.rules
# Capacity weights are scaled so the largest is this: enough resolution (0.1 %) and far under
# the Gateway API's maximum weight (1,000,000).
WEIGHT_SCALE = 1000


@dataclass(frozen=True)
class PoolRoute:
    """One pool as the route sees it: its InferencePool, what it holds and its weight."""

    inference_pool: str
    max_model_len: int
    replicas: int
    # Requests/s one replica sustains within the SLO; None when the plan has no measure.
    capacity_per_replica_per_second: float | None = None


@dataclass(frozen=True)
class GatewayRef:
    name: str
    namespace: str | None = None
    section_name: str | None = None


def _digits_between(low: str, high: str) -> list[str]:
    """Patterns for the digit strings of one length from ``low`` to ``high`` (inclusive)."""
    if low == high:
        return [low]
    if set(low) == {"0"} and set(high) == {"9"}:
        return ["[0-9]" if len(low) == 1 else f"[0-9]{{{len(low)}}}"]
    if len(low) == 1:
        return [f"[{low}-{high}]"]
    # Walk the first digit: the part of ``low``'s first digit, the full digits between, then
    # the part of ``high``'s first digit.
    rest = len(low) - 1
    if low[0] == high[0]:
        return [low[0] + p for p in _digits_between(low[1:], high[1:])]
    out = [low[0] + p for p in _digits_between(low[1:], "9" * rest)]
    first, last = int(low[0]) + 1, int(high[0]) - 1
    if first <= last:
        span = str(first) if first == last else f"[{first}-{last}]"
        out.append(f"{span}[0-9]{{{rest}}}")
    out += [high[0] + p for p in _digits_between("0" * rest, high[1:])]
    return out


def integer_range_pattern(low: int, high: int | None) -> str:
    """A regular expression that matches the decimal integers from ``low`` to ``high`` (None:
    no upper bound), written without leading zeros or a sign, and nothing else."""
    assert low >= 0 and (high is None or high >= low)
    parts: list[str] = []
    top = high if high is not None else 10 ** len(str(low)) - 1
    for digits in range(len(str(low)), len(str(top)) + 1):
        lo = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        hi = min(top, 10 ** digits - 1)
        if lo <= hi:
            parts += _digits_between(str(lo), str(hi))
    if high is None:
        parts.append(f"[1-9][0-9]{{{len(str(low))},}}")
    # Anchored: a gateway that searches (ECMAScript, PCRE) then matches whole values too.
    return "^(" + "|".join(parts) + ")$"


def capacity_of(pool_plan: PoolPlan) -> float | None:
    """Requests/s one replica of the plan sustains within the SLO: the capacity search's
    capacity at SLO when it ran; None otherwise (see the module's docstring)."""
    search = pool_plan.search
    rate = search.capacity_requests_per_second if search is not None else None
    return rate if rate is not None and rate > 0 else None


def weights(pools: list[PoolRoute]) -> dict[str, int]:
    """Backend weight per InferencePool: capacity x replicas scaled to ``WEIGHT_SCALE`` when
    every pool has a capacity (a pool with replicas never rounds to 0), else replicas."""
    capacities = [p.capacity_per_replica_per_second for p in pools]
    if not pools or any(c is None for c in capacities):
        return {p.inference_pool: p.replicas for p in pools}
    served = {p.inference_pool: (p.capacity_per_replica_per_second or 0.0) * p.replicas
              for p in pools}
    top = max(served.values())
    if top <= 0:
        return {p.inference_pool: p.replicas for p in pools}
    return {name: max(1, round(WEIGHT_SCALE * rate / top)) if rate > 0 else 0
            for name, rate in served.items()}


def _backends(pools: list[PoolRoute]) -> list[dict[str, Any]]:
    weight = weights(pools)
    return [{"group": POOL_GROUP, "kind": "InferencePool", "name": p.inference_pool,
             "weight": weight[p.inference_pool]}
            for p in sorted(pools, key=lambda p: p.inference_pool)]


def length_tiers(pools: list[PoolRoute]) -> list[tuple[int, int | None, list[PoolRoute]]]:
    """(lowest, highest or None, the pools) per max-model-len above the shortest: a request of
    that many prompt tokens goes to the shortest pools that hold it."""
    lengths = sorted({p.max_model_len for p in pools})
    tiers = []
    for below, length in itertools.pairwise(lengths):
        top = None if length == lengths[-1] else length
        tiers.append((below + 1, top, [p for p in pools if p.max_model_len == length]))
    return tiers


def http_route(*, name: str, namespace: str, labels: dict[str, str], gateway: GatewayRef,
               pools: list[PoolRoute], session_header: str | None = None,
               length_header: str | None = None) -> dict[str, Any]:
    """The InferenceDeployment's HTTPRoute (see the module's docstring)."""
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway.name}
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    everything = {"path": {"type": "PathPrefix", "value": "/"}}
    rules: list[dict[str, Any]] = []
    if length_header:
        # Longest first: the rules are disjoint, but a gateway that breaks ties between
        # equally specific matches by order then still prefers the pool that holds more.
        for low, high, tier in reversed(length_tiers(pools)):
            rules.append({
                "matches": [{**everything, "headers": [{
                    "type": "RegularExpression", "name": length_header,
                    "value": integer_range_pattern(low, high)}]}],
                "backendRefs": _backends(tier),
            })
    rules.append({"matches": [everything], "backendRefs": _backends(pools)})
    if session_header:
        for rule in rules:
            rule["sessionPersistence"] = {"type": "Header", "sessionName": session_header}
    assert len(rules) <= MAX_RULES  # one per distinct max-model-len, and spec.pools is short
    return {
        "apiVersion": API,
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"parentRefs": [parent], "rules": rules},
    }


# The phases in which a pool's InferencePool has been applied (a canary's pool is the
# stable one's, which serves until promotion).
_ROUTED_PHASES = ("Applied", "Canary")


def routed_max_model_len(pool: PoolStatus) -> int | None:
    """The max-model-len the pool's stable pods run: what its routing was applied with. During
    a canary, ``pool.plan`` is the canary's plan, not yet promoted; the stable pods, which
    serve all but the canary's share, still refuse what is longer than their own. Without
    that record (a status written before kvtune kept it) the plan in status, as before."""
    if pool.routing is not None:
        return pool.routing.max_model_len
    return pool.plan.max_model_len if pool.plan is not None else None


def route_for(*, name: str, namespace: str, labels: dict[str, str], routing: RoutingSpec,
              pools: Sequence[PoolStatus], inference_pool_name: dict[str, str]
              ) -> dict[str, Any] | None:
    """The InferenceDeployment's HTTPRoute from its pools' status (the max-model-len their
    stable pods run, ``routed_max_model_len``, and replicas); None without
    ``spec.routing.gateway`` or a pool whose InferencePool is applied."""
    if not routing.enabled or routing.gateway is None:
        return None
    routed = [PoolRoute(inference_pool_name[p.name], length, p.replicas,
                        p.routing.capacity_requests_per_second_per_replica
                        if p.routing is not None else None)
              for p in pools if p.phase in _ROUTED_PHASES and p.name in inference_pool_name
              and (length := routed_max_model_len(p)) is not None]
    if not routed:
        return None
    gateway = GatewayRef(routing.gateway.name, routing.gateway.namespace,
                         routing.gateway.section_name)
    return http_route(name=name, namespace=namespace, labels=labels, gateway=gateway,
                      pools=routed, session_header=routing.session_header,
                      length_header=routing.length_header)
