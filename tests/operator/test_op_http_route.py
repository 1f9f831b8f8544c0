"""The HTTPRoute in front of an InferenceDeployment's pools (pure rendering): session
persistence by header, and requests routed by their stated length to pools that hold them."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from kvtune.operator.api import PlanStatus, PoolRoutingStatus, PoolStatus, RoutingSpec
from kvtune.operator.routing import http_route
from kvtune.operator.routing.http_route import GatewayRef, PoolRoute

POOLS = [PoolRoute("bot-short", 8192, 4), PoolRoute("bot-mid", 32768, 2),
         PoolRoute("bot-long", 131072, 1), PoolRoute("bot-mid2", 32768, 3)]


def _route(**kw: object) -> dict:  # type: ignore[type-arg]
    return http_route.http_route(name="bot", namespace="llm", labels={"a": "b"},
                                 gateway=GatewayRef("inference-gateway", "gw", "http"),
                                 pools=POOLS, **kw)  # type: ignore[arg-type]


def _destination(route: dict, headers: dict[str, str]) -> list[str]:  # type: ignore[type-arg]
    """Where Gateway API sends a request: the first rule whose every header match holds
    (the rules are disjoint, so list order only decides for the catch-all)."""
    for rule in route["spec"]["rules"]:
        for match in rule["matches"]:
            if all(h["name"] in headers and re.fullmatch(h["value"], headers[h["name"]])
                   for h in match.get("headers", [])):
                return [b["name"] for b in rule["backendRefs"]]
    raise AssertionError("no rule matched")


@pytest.mark.parametrize(("low", "high"), [(1, 9), (5, 123), (8193, 16384), (99, 1000),
                                           (1, None), (10, None), (32769, None)])
def test_the_length_pattern_matches_exactly_the_range(low: int, high: int | None) -> None:
    pattern = re.compile(http_route.integer_range_pattern(low, high))
    for n in range(0, 140_000, 7):
        assert bool(pattern.fullmatch(str(n))) == (n >= low and (high is None or n <= high)), n
    for n in (low, high or low):
        assert pattern.fullmatch(str(n))
        assert not pattern.fullmatch(f"0{n}") and not pattern.fullmatch(f"-{n}")
        assert not pattern.fullmatch(f"{n} ") and not pattern.fullmatch(f"x{n}")
    # Anchored: a gateway that searches instead of matching the whole value agrees.
    assert not pattern.search("abc") and (high is None or not pattern.search(str(high + 1)))


@pytest.mark.parametrize(("tokens", "pools"), [
    ("100", ["bot-long", "bot-mid", "bot-mid2", "bot-short"]),  # every pool holds it
    ("8192", ["bot-long", "bot-mid", "bot-mid2", "bot-short"]),
    ("8193", ["bot-mid", "bot-mid2"]),  # the shortest pools that hold it
    ("32768", ["bot-mid", "bot-mid2"]),
    ("32769", ["bot-long"]),
    ("131072", ["bot-long"]),
    ("999999", ["bot-long"]),  # longer than any pool: the longest (vLLM refuses it there)
    ("many", ["bot-long", "bot-mid", "bot-mid2", "bot-short"]),
])
def test_a_request_goes_to_the_shortest_pools_that_hold_its_stated_length(
        tokens: str, pools: list[str]) -> None:
    route = _route(length_header="x-prompt-tokens")
    assert _destination(route, {"x-prompt-tokens": tokens}) == pools
    # Without the header: every pool, weighted by replicas.
    assert _destination(route, {}) == sorted(p.inference_pool for p in POOLS)
    weights = {b["name"]: b["weight"] for b in route["spec"]["rules"][-1]["backendRefs"]}
    assert weights == {p.inference_pool: p.replicas for p in POOLS}


def test_session_persistence_by_header_on_every_rule() -> None:
    route = _route(session_header="x-session-id", length_header="x-prompt-tokens")
    assert len(route["spec"]["rules"]) == 3  # two longer tiers and the catch-all
    for rule in route["spec"]["rules"]:
        assert rule["sessionPersistence"] == {"type": "Header", "sessionName": "x-session-id"}
    plain = _route()
    assert [r.get("sessionPersistence") for r in plain["spec"]["rules"]] == [None]
    assert plain["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io",
                                            "kind": "Gateway", "name": "inference-gateway",
                                            "namespace": "gw", "sectionName": "http"}]
    for ref in plain["spec"]["rules"][0]["backendRefs"]:
        assert (ref["group"], ref["kind"]) == ("inference.networking.k8s.io", "InferencePool")


@pytest.mark.parametrize(("routing", "needle"), [
    ({"gateway": {"name": "gw"}}, "spec.routing.gateway is set but spec.routing.enabled=false"),
    ({"enabled": True, "sessionHeader": "x-session-id"}, "spec.routing.sessionHeader="),
    ({"enabled": True, "lengthHeader": "x-tokens"}, "spec.routing.lengthHeader="),
    ({"enabled": True, "gateway": {"name": "gw"}, "sessionHeader": "x session"},
     "sessionHeader"),
])
def test_routing_fields_that_cannot_act_are_refused(routing: dict, needle: str  # type: ignore[type-arg]
                                                   ) -> None:
    with pytest.raises(ValidationError) as refused:
        RoutingSpec.model_validate(routing)
    assert needle in str(refused.value)


def _pool_status(name: str, phase: str, plan_len: int, routed_len: int | None,
                 replicas: int) -> PoolStatus:
    plan = PlanStatus(block_size=16, kv_cache_dtype="auto", gpu_memory_utilization=0.9,
                      max_model_len=plan_len, max_num_seqs=64, max_num_batched_tokens=8192,
                      enable_prefix_caching=True)
    routing = None if routed_len is None else PoolRoutingStatus(
        max_model_len=routed_len, endpoint_picker=f"bot-{name}-epp")
    return PoolStatus(name=name, gpu_class="H200", tensor_parallel=1, replicas=replicas,
                      phase=phase, plan=plan, routing=routing)  # type: ignore[arg-type]


def test_during_a_canary_the_length_rules_keep_the_plan_the_stable_pods_run() -> None:
    """The long pool's canary plans 4k (not yet promoted) while its stable pods, which serve
    all but the canary's share, still hold 128k: a 100k request must still go to the long
    pool, not to the 8k pool as if the long one held only 4k."""
    spec = RoutingSpec.model_validate({"enabled": True, "gateway": {"name": "gw"},
                                       "lengthHeader": "x-prompt-tokens"})
    names = {"short": "bot-short", "long": "bot-long"}

    def route(long_phase: str, long_routed: int | None) -> dict:  # type: ignore[type-arg]
        pools = [_pool_status("short", "Applied", 8192, 8192, 4),
                 _pool_status("long", long_phase, 4096, long_routed, 1)]
        out = http_route.route_for(name="bot", namespace="llm", labels={}, routing=spec,
                                   pools=pools, inference_pool_name=names)
        assert out is not None
        return out

    canary = route("Canary", 131072)
    assert _destination(canary, {"x-prompt-tokens": "100000"}) == ["bot-long"]
    assert _destination(canary, {"x-prompt-tokens": "8193"}) == ["bot-long"]
    assert _destination(canary, {"x-prompt-tokens": "8192"}) == ["bot-long", "bot-short"]
    # Promoted: the main Deployment took the 4k plan, and the route follows it: the 8k pool
    # now holds the longest requests.
    promoted = route("Applied", 4096)
    assert _destination(promoted, {"x-prompt-tokens": "100000"}) == ["bot-short"]
    assert _destination(promoted, {"x-prompt-tokens": "4097"}) == ["bot-short"]
    # A status written before kvtune recorded the routed length: the plan in status, as before.
    assert http_route.routed_max_model_len(
        _pool_status("long", "Canary", 4096, None, 1)) == 4096


# --- weights by capacity x replicas (issue 22 item 9) ----------------------------------------

@pytest.mark.parametrize(("pools", "expected", "why"), [
    # (name, replicas, capacity req/s per replica) -> weight
    ([("a", 4, 10.0), ("b", 2, 40.0)], {"a": 500, "b": 1000},
     "b serves 80 req/s, a 40: b gets twice a's share though it has half the replicas"),
    ([("a", 3, 5.0), ("b", 3, 5.0)], {"a": 1000, "b": 1000}, "equal pools, equal weights"),
    ([("a", 1, 0.5), ("b", 10, 100.0)], {"a": 1, "b": 1000},
     "a tiny pool still gets traffic: never rounded to 0"),
    ([("a", 0, 10.0), ("b", 2, 10.0)], {"a": 0, "b": 1000}, "no replicas, no traffic"),
    ([("a", 4, 10.0), ("b", 2, None)], {"a": 4, "b": 2},
     "a pool without a measured capacity: every weight falls back to replicas"),
    ([("a", 4, None), ("b", 2, None)], {"a": 4, "b": 2}, "no capacities: replicas, as before"),
])
def test_backend_weights_follow_capacity_times_replicas(
        pools: list[tuple[str, int, float | None]], expected: dict[str, int], why: str) -> None:
    routes = [PoolRoute(name, 8192, replicas, capacity)
              for name, replicas, capacity in pools]
    assert http_route.weights(routes) == expected, why
    route = http_route.http_route(name="bot", namespace="llm", labels={},
                                  gateway=GatewayRef("gw"), pools=routes)
    backends = {b["name"]: b["weight"] for b in route["spec"]["rules"][-1]["backendRefs"]}
    assert backends == expected, why


def test_route_for_reads_capacity_from_the_applied_routing_status() -> None:
    spec = RoutingSpec.model_validate({"enabled": True, "gateway": {"name": "gw"}})
    fast = _pool_status("fast", "Applied", 8192, 8192, 2).model_copy(update={
        "routing": PoolRoutingStatus(max_model_len=8192, endpoint_picker="bot-fast-epp",
                                     capacity_requests_per_second_per_replica=30.0)})
    slow = _pool_status("slow", "Applied", 8192, 8192, 3).model_copy(update={
        "routing": PoolRoutingStatus(max_model_len=8192, endpoint_picker="bot-slow-epp",
                                     capacity_requests_per_second_per_replica=10.0)})
    out = http_route.route_for(name="bot", namespace="llm", labels={}, routing=spec,
                               pools=[fast, slow],
                               inference_pool_name={"fast": "bot-fast", "slow": "bot-slow"})
    assert out is not None
    weights = {b["name"]: b["weight"] for b in out["spec"]["rules"][-1]["backendRefs"]}
    assert weights == {"bot-fast": 1000, "bot-slow": 500}  # 60 vs 30 req/s


def test_capacity_of_reads_the_searchs_capacity_at_slo() -> None:
    from op_samples import make_pool_plan

    from kvtune.tuner.plan import SearchSummary

    plan = make_pool_plan()
    assert http_route.capacity_of(plan) is None  # no search: no capacity
    summary = SearchSummary(
        observed_rate_per_second=20.0, littles_law_sequences=10,
        capacity_requests_per_second=12.5, slo_attainment=0.6, ttft_p95_seconds=3.0,
        tpot_p95_seconds=0.05, slo_met=False, slo_set=True, replicas_needed=2, candidates=3,
        simulated_requests=100, requests_per_candidate=50, changed_from="rules' plan")
    assert http_route.capacity_of(plan.model_copy(update={"search": summary})) == 12.5
