"""The capacity search on the simulator: one entry point for ``kvtune plan`` and the operator.

``plan_by_goodput(request, trace=None, running=None)`` replays the pool's traffic (a window
of the trace when there is one, else traffic made from the request's ``WorkloadProfile``,
``profile_traffic``) under the planner's candidates (``planner/search.py``) and returns the
``PoolPlan`` the search chose, with its capacity at SLO (the highest rate one replica serves
within the SLO), the attainment at the observed rate, the replicas the traffic needs and the
alternatives.

Results are cached by the hash of everything they depend on (the request, the traffic, the
running plan, the seed): the operator re-plans on every reconcile, and the same inputs give
the same plan without a second search. A search its budget stopped is not cached (a later
reconcile with more budget left, or a restart, searches again).

Before any traffic is made, the closed-form bound (``slo_bound.py``) says whether any
configuration can meet the SLO at all; when none can, the rules' plan comes back at once with
``slo_unreachable``. Every search runs within a ``SearchBudget`` (``planner/search_budget``):
the traffic holds at most ``budget.stream_requests`` requests, and the meter is checked
between scores and inside each replay.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.plan import KVPlan, PoolPlan
from kvtune.tuner.plan_tier import KVTier
from kvtune.tuner.planner.decide_max_num_seqs import DEFAULT_TPOT_SECONDS
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.search import (
    DEFAULT_SETTINGS,
    DEFAULT_TTFT_SECONDS,
    GoodputScore,
    SearchProgressHook,
    SearchSettings,
    search,
)
from kvtune.tuner.planner.search_budget import BudgetStop, SearchBudget, SearchBudgetSpent
from kvtune.tuner.simulator import slo_bound
from kvtune.tuner.simulator.engine import simulated_plan
from kvtune.tuner.simulator.metrics import SLOTargets
from kvtune.tuner.simulator.profile_traffic import traffic_from_profile
from kvtune.tuner.simulator.scheduler import ProgressHook, simulate
from kvtune.tuner.simulator.workload import SimRequest, requests_from_trace
from kvtune.tuner.traces import Trace

# Requests replayed by the finalists (the last rung of the successive halving).
TRAFFIC_REQUESTS = 800
_CACHE_SIZE = 64


def slo_targets(request: PlanRequest) -> SLOTargets:
    """The request's SLO, with the planner's defaults where it sets none."""
    slo = request.policy.slo
    return SLOTargets(ttft_seconds=slo.ttft_p95_seconds or DEFAULT_TTFT_SECONDS,
                      tpot_seconds=slo.tpot_p95_seconds or DEFAULT_TPOT_SECONDS)


@dataclass(frozen=True, slots=True)
class TrafficScorer:
    """``planner.search.GoodputScorer`` on a fixed request stream."""

    requests: tuple[SimRequest, ...]
    # Told every few finished requests of a replay: the budget's meter (it raises to stop).
    on_progress: ProgressHook | None = None
    # An LMCache tier replayed in place of the plan's native CPU tier (``engine.lmcache_tier``).
    tier: KVTier | None = None

    @property
    def rate_per_second(self) -> float:
        span = self.requests[-1].arrival_seconds - self.requests[0].arrival_seconds
        return (len(self.requests) - 1) / span if span > 0 else float(len(self.requests))

    @property
    def max_requests(self) -> int:
        return len(self.requests)

    def score(self, request: PlanRequest, plan: KVPlan, num_requests: int,
              rate_scale: float = 1.0) -> GoodputScore:
        sim = simulated_plan(request, plan, "candidate", tier=self.tier)
        if not sim.starts:
            return GoodputScore(0.0, False, 0.0, math.inf, math.inf, 0, starts=False)
        reqs: Sequence[SimRequest] = self.requests[:num_requests]
        if rate_scale != 1.0:
            reqs = [dataclasses.replace(r, arrival_seconds=r.arrival_seconds / rate_scale)
                    for r in reqs]
        res = simulate(reqs, sim.engine, sim.cost, on_progress=self.on_progress)
        s = res.summary()
        return GoodputScore(
            slo_attainment=res.attainment(slo_targets(request)), keeps_up=res.keeps_up(),
            throughput_requests_per_second=s["throughput_requests_per_second"],
            ttft_p95_seconds=_finite(s["ttft_p95_seconds"]),
            tpot_p95_seconds=_finite(s["tpot_p95_seconds"]),
            requests=len(reqs), preemptions=s["preemptions"],
            prefix_hit_rate=s["prefix_hit_rate"],
            cpu_hit_rate=(res.cpu_hit_tokens / res.prefix_query_tokens
                          if res.prefix_query_tokens else 0.0),
            prompt_tokens_per_request=res.prefix_query_tokens / max(1, len(reqs)),
            output_tokens_per_second=s["throughput_output_tokens_per_second"],
        )


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def traffic(request: PlanRequest, trace: Trace | None = None,
            num_requests: int = TRAFFIC_REQUESTS, seed: int = 0,
            check: Callable[[], None] | None = None,
            speed: float = 1.0) -> tuple[SimRequest, ...]:
    """The stream the search replays: the trace's first ``num_requests`` requests (arrivals
    ``speed`` times faster), else ``num_requests`` made from the profile (seeded; ``check``
    between its calibration samples: the budget's meter)."""
    if trace is not None:
        return tuple(requests_from_trace(trace, speed=speed, limit=num_requests))
    return tuple(traffic_from_profile(request.profile, num_requests, seed=seed, check=check))


_cache: OrderedDict[str, PoolPlan] = OrderedDict()


def _key(request: PlanRequest, reqs: Sequence[SimRequest], running: KVPlan | None,
         settings: SearchSettings, replicas: int = 1) -> str:
    h = hashlib.sha256()
    h.update(f"replicas={replicas}".encode())
    h.update(request.model_dump_json().encode())
    h.update(repr([(r.arrival_seconds, r.prompt_tokens, r.output_tokens, r.segments)
                   for r in reqs]).encode())
    h.update((running.model_dump_json() if running is not None else "-").encode())
    h.update(repr(settings).encode())
    return h.hexdigest()


def plan_by_goodput(
    request: PlanRequest, trace: Trace | None = None, running: KVPlan | None = None,
    seed: int = 0, settings: SearchSettings = DEFAULT_SETTINGS,
    progress: SearchProgressHook | None = None, replicas: int = 1,
    budget: SearchBudget | None = None, speed: float = 1.0,
) -> PoolPlan:
    """The pool's plan chosen by simulated capacity at SLO (module doc). Without an arrival rate
    (no trace, none in the profile) there is no traffic to replay: the rule-based plan,
    with a warning saying so. ``progress`` follows the search (not on a cache hit).
    ``replicas``: how many replicas share the traffic; each is planned on its share (the
    stream's gaps stretched ``replicas`` times: a random split, in expectation).
    ``budget``: what the search may use (the default ``SearchBudget()``); a spent budget
    gives the best plan so far with ``search.stopped_by``, or ``SearchBudgetSpent``.
    ``speed``: the trace replayed that many times faster (``kvtune simulate --speed``)."""
    if trace is None and not request.profile.request_rate_per_second:
        base = plan_pool(request)
        return base.model_copy(update={"warnings": (
            *base.warnings,
            "no arrival rate in the profile: the plan follows the rules, not a capacity "
            "search (observe traffic, or pass --trace or --request-rate)")})
    if trace is not None and len(trace.requests) < 2:
        raise InvalidInput("--trace", trace.name, "needs at least 2 requests to replay")
    if replicas < 1:
        raise InvalidInput("replicas", replicas, "plan for at least one replica")
    budget = budget if budget is not None else SearchBudget()
    base = plan_pool(request)
    unreachable = slo_bound.slo_unreachable(request, base.plan.kv_cache_dtype)
    if unreachable is not None:
        return base.model_copy(update={"slo_unreachable": unreachable, "warnings": (
            *base.warnings, unreachable.message)})
    meter = budget.start()
    stream = max(1, min(max(settings.rungs), budget.stream_requests))
    try:
        reqs = traffic(request, trace, stream, seed, check=meter.check, speed=speed)
    except BudgetStop as exc:
        raise SearchBudgetSpent(exc.reason) from None
    if replicas > 1:
        reqs = tuple(dataclasses.replace(r, arrival_seconds=r.arrival_seconds * replicas)
                     for r in reqs)
    key = _key(request, reqs, running, settings, replicas)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    result = search(request, TrafficScorer(reqs, on_progress=meter.on_progress),
                    running=running, settings=settings, progress=progress, replicas=replicas,
                    meter=meter)
    if result.search is not None and result.search.stopped_by is not None:
        return result  # not cached: a full search may follow
    _cache[key] = result
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return result
