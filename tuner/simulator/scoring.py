"""The planner's scorer: replay a sample of the workload under each candidate plan.

``SimulatorScorer`` implements ``planning.CandidateScorer``. It replays either requests the
caller observed (``from_trace``: a window of a real trace) or traffic made up from the
request's ``WorkloadProfile`` with a fixed seed, a few thousand requests, so a dozen
candidates score in seconds and the same inputs always give the same scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvtune.tuner.plan import CandidateScore, KVPlan
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.simulator.engine import simulated_plan
from kvtune.tuner.simulator.scheduler import simulate
from kvtune.tuner.simulator.workload import (
    SimRequest,
    requests_from_trace,
    synthetic_profile_from_workload,
    synthetic_requests,
)
from kvtune.tuner.traces import Trace

DEFAULT_SAMPLE_REQUESTS = 2000


@dataclass(frozen=True, slots=True)
class SimulatorScorer:
    """Scores candidates by simulating them. ``requests``: the traffic to replay (None:
    synthesize ``num_requests`` from the plan request's profile with ``seed``, at
    ``request_rate_per_second`` or the profile's rate)."""

    requests: tuple[SimRequest, ...] | None = None
    num_requests: int = DEFAULT_SAMPLE_REQUESTS
    seed: int = 0
    request_rate_per_second: float | None = None

    @classmethod
    def from_trace(
        cls, trace: Trace, limit: int = DEFAULT_SAMPLE_REQUESTS, speed: float = 1.0,
        start: int = 0,
    ) -> SimulatorScorer:
        return cls(requests=tuple(requests_from_trace(trace, speed=speed, limit=limit,
                                                      start=start)))

    def workload(self, request: PlanRequest) -> Sequence[SimRequest]:
        if self.requests is not None:
            return self.requests
        profile = synthetic_profile_from_workload(
            request.profile, self.num_requests, self.request_rate_per_second)
        made: list[SimRequest] = synthetic_requests(profile, self.seed)
        return made

    def __call__(
        self, request: PlanRequest, candidates: Sequence[KVPlan]
    ) -> Sequence[CandidateScore]:
        reqs = self.workload(request)
        scores: list[CandidateScore] = []
        for i, plan in enumerate(candidates):
            sim = simulated_plan(request, plan, name=f"candidate-{i}")
            if not sim.starts:
                scores.append(CandidateScore(
                    plan=plan, ttft_p95_seconds=math.inf, tpot_p95_seconds=math.inf,
                    throughput_requests_per_second=0.0, prefix_hit_rate=0.0, preemptions=0,
                    peak_concurrent_sequences=0, summary=sim.start_error,
                ))
                continue
            s = simulate(reqs, sim.engine, sim.cost, name=sim.name).summary()
            ttft = _finite(s["ttft_p95_seconds"])
            tpot = _finite(s["tpot_p95_seconds"])
            scores.append(CandidateScore(
                plan=plan, ttft_p95_seconds=ttft, tpot_p95_seconds=tpot,
                throughput_requests_per_second=s["throughput_requests_per_second"],
                prefix_hit_rate=s["prefix_hit_rate"], preemptions=s["preemptions"],
                peak_concurrent_sequences=s["peak_concurrent_sequences"],
                summary=(
                    f"simulated {s['completed']}/{s['requests']} requests: "
                    f"{s['throughput_requests_per_second']:.2f} req/s, TTFT p95 "
                    f"{ttft:.3f} s, TPOT p95 {tpot * 1000:.1f} ms, prefix hits "
                    f"{s['prefix_hit_rate']:.1%}, {s['preemptions']} preemptions, peak "
                    f"{s['peak_concurrent_sequences']} sequences"
                    + (f", {s['rejected']} rejected" if s["rejected"] else "")
                ),
            ))
        return scores


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf
