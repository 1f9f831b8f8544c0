"""Traffic made from a ``WorkloadProfile``: the request stream the capacity search replays
when the operator has Prometheus histograms, not a trace.

What the stream reproduces, and how:

- **Lengths.** Prompt and output lengths follow the profile's quantiles: the inverse CDF goes
  through every quantile the profile knows (p50, p90, p95, p99, max), log-linear between them
  (lengths are skewed right); below the median it mirrors the log-normal that p50 and p95
  imply. Quantiles from histogram buckets carry the buckets' width as uncertainty; the
  stream takes them as given (the interpolation lies inside each bucket).
- **Arrivals.** Sessions start as a renewal process at the observed rate divided by the
  turns per session, with gamma-distributed gaps whose coefficient of variation is the
  profile's ``arrival_cv`` (1: Poisson; above 1: bursty).
- **Prefix structure.** Every request starts with the shared system prompt
  (``shared_prefix_tokens``). Multi-turn traffic comes in sessions: a turn re-sends the
  previous turn's prompt and answer, then its new message; a session's prompt lengths are
  drawn from the profile and sorted, so lengths keep the profile's distribution while the
  history grows. The turns per session are calibrated so that the stream's ideal prefix
  hit rate (an unbounded cache) matches the profile's observed ``prefix_hit_rate``.

Deterministic: everything random takes the seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.prefix import Segment, SegmentInterner, shareable_prefix_tokens
from kvtune.tuner.simulator.workload import SimRequest, ideal_prefix_hit_rate
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

# Seconds between two turns of one session (the profile has no figure for it).
THINK_SECONDS = 30.0
# Most turns per session the calibration tries.
MAX_TURNS = 24
# Requests in each calibration sample.
_CALIBRATION_REQUESTS = 600
# Most requests the warm-up makes per request of the stream. The warm-up holds the sessions
# the rate keeps in progress (rate / turns x 90 s per turn after the first), each with all its
# turns: 200,000 requests at 200 req/s, 27 million at 1e5 (gigabytes of Python objects), 2.7e11
# at 1e9 (numpy asked for terabytes). Capped, the think time between turns shrinks so that the
# warm-up (3 think times per turn) fits: the arrival rate and the mix of turns stay as they
# are, only a session's turns come closer together (at such rates a 30 s think spans far more
# requests than the stream holds). Below the cap nothing changes: an 800-request stream keeps
# the 30 s think time up to 59 req/s per replica at 4 turns per session, 178 at 2.
MAX_WARMUP_REQUESTS_PER_REQUEST = 20


def _ppf_points(q: TokenQuantiles) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, log lengths) the inverse CDF goes through."""
    p50 = max(1, q.p50)
    p95 = max(p50, q.p95)
    # The log-normal that p50 and p95 imply, mirrored below the median (p5 = p50^2/p95).
    p05 = max(1.0, p50 * p50 / p95)
    p00 = max(1.0, p05 / 2)
    pts = [(0.0, p00), (0.05, p05), (0.5, float(p50))]
    if q.p90 is not None:
        pts.append((0.9, float(max(p50, q.p90))))
    pts += [(0.95, float(p95)), (0.99, float(max(p95, q.p99))),
            (1.0, float(max(p95, q.p99, q.max)))]
    u = np.array([p for p, _ in pts])
    x = np.log(np.maximum.accumulate(np.array([v for _, v in pts])))
    return u, x


def sample_lengths(q: TokenQuantiles, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` lengths whose quantiles are the profile's (see the module doc)."""
    u, x = _ppf_points(q)
    draws = np.exp(np.interp(rng.random(n), u, x))
    lengths: np.ndarray = np.maximum(1, np.rint(draws)).astype(np.int64)
    return lengths


@dataclass(frozen=True, slots=True)
class TrafficShape:
    """The figures the stream is made from (``shape_of`` reads them from a profile)."""

    rate_per_second: float
    arrival_cv: float
    shared_prefix_tokens: int
    turns_per_session: int


def _gaps(rng: np.random.Generator, n: int, mean: float, cv: float) -> np.ndarray:
    if cv <= 0:
        return np.full(n, mean)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, mean / shape, size=n)


def _make(profile: WorkloadProfile, shape: TrafficShape, n: int, seed: int) -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    turns = max(1, shape.turns_per_session)
    # Sessions start before time 0 (a warm-up as long as a session lasts, 3 think times
    # per gap) so the stream is in steady state from its first request: as many sessions
    # in progress as the rate implies, histories of earlier turns already sent.
    session_gap = turns / shape.rate_per_second
    # warm-up requests = warm-up / session gap x turns = 3 think (turns - 1) rate.
    think_seconds = min(THINK_SECONDS, MAX_WARMUP_REQUESTS_PER_REQUEST * n
                        / (3.0 * max(1, turns - 1) * shape.rate_per_second))
    warmup = 3.0 * think_seconds * (turns - 1)
    num_sessions = math.ceil(n / turns) + math.ceil(warmup / session_gap) + 1
    prompts = sample_lengths(profile.context_tokens, rng, num_sessions * turns)
    outputs = sample_lengths(profile.output_tokens, rng, num_sessions * turns)
    starts = np.cumsum(_gaps(rng, num_sessions, session_gap, shape.arrival_cv)) - warmup
    think = rng.exponential(think_seconds, size=num_sessions * turns)
    interner = SegmentInterner()
    system = interner.chain(0, "system-prompt")
    rows: list[tuple[float, int, int, tuple[Segment, ...]]] = []
    for s in range(num_sessions):
        lens = np.sort(prompts[s * turns:(s + 1) * turns])
        history: list[Segment] = []
        t_arrive = float(starts[s])
        for t in range(turns):
            i = s * turns + t
            prompt = int(lens[t])
            own: list[Segment] = []
            if t == 0:
                sys_tokens = min(shape.shared_prefix_tokens, prompt - 1)
                if sys_tokens > 0:
                    own.append((system, sys_tokens))
                used = sys_tokens
            else:
                t_arrive += float(think[i])
                hist_tokens = sum(k for _, k in history)
                keep = min(hist_tokens, prompt - 1)  # at least one new token
                cut = 0
                for uid, k in history:
                    if cut >= keep:
                        break
                    take = min(k, keep - cut)
                    own.append((uid, take))
                    cut += take
                used = keep
            user = (interner.unique(), prompt - used)
            answer = (interner.unique(), int(outputs[i]))
            segments = (*own, user, answer)
            if t_arrive >= 0:
                rows.append((t_arrive, prompt, int(outputs[i]), segments))
            history = [*own, user, answer]
    rows.sort(key=lambda r: r[0])
    # The window: the first n requests from time 0 (a session's later turns may fall
    # after requests of sessions that start later; the cut is by arrival).
    rows = rows[:n]
    shareable = shareable_prefix_tokens([r[3] for r in rows])
    t0 = rows[0][0] if rows else 0.0
    return [
        SimRequest(request_id=k, arrival_seconds=a - t0, prompt_tokens=p,
                   output_tokens=max(1, o), segments=segs, shareable_tokens=shareable[k])
        for k, (a, p, o, segs) in enumerate(rows)
    ]


def shape_of(profile: WorkloadProfile, rate_per_second: float | None = None,
             seed: int = 0, check: Callable[[], None] | None = None) -> TrafficShape:
    """The stream's figures: the rate and burstiness as observed, the turns per session
    calibrated to the observed prefix hit rate (4 for multi-turn traffic of unknown hit
    rate, 1 otherwise)."""
    rate = rate_per_second or profile.request_rate_per_second
    if rate is None or not rate > 0:
        raise InvalidInput("profile.request_rate_per_second", rate,
                           "traffic needs an arrival rate > 0; observe one or declare it")
    cv = profile.arrival_cv if profile.arrival_cv is not None else 1.0
    target = profile.prefix_hit_rate
    if target is None:
        return TrafficShape(rate, cv, profile.shared_prefix_tokens,
                            4 if profile.multi_turn else 1)
    hits: dict[int, float] = {}

    def hit(turns: int) -> float:
        if turns not in hits:
            if check is not None:
                check()  # a search's budget: each sample is 600 requests of work
            cand = TrafficShape(rate, cv, profile.shared_prefix_tokens, turns)
            hits[turns] = ideal_prefix_hit_rate(
                _make(profile, cand, _CALIBRATION_REQUESTS, seed), 16)
        return hits[turns]

    # The hit rate grows with the turns: bisect for the first that reaches the target,
    # then take it or the one before, whichever is closer.
    lo, hi = 1, MAX_TURNS
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    best = min({max(1, lo - 1), lo}, key=lambda t: (abs(hit(t) - target), t))
    return TrafficShape(rate, cv, profile.shared_prefix_tokens, best)


def traffic_from_profile(profile: WorkloadProfile, num_requests: int, seed: int = 0,
                         rate_per_second: float | None = None,
                         check: Callable[[], None] | None = None) -> list[SimRequest]:
    """``num_requests`` requests that reproduce ``profile`` (module doc), sorted by arrival.
    ``check``: called between calibration samples (a search's budget meter; it raises)."""
    if num_requests <= 0:
        raise InvalidInput("num_requests", num_requests, "must be > 0")
    shape = shape_of(profile, rate_per_second, seed, check)
    if check is not None:
        check()
    return _make(profile, shape, num_requests, seed)
