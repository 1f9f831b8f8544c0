"""The requests a simulation replays: from a trace, or made up from a profile with a seed.

A ``SimRequest`` is immutable: arrival time, prompt and output lengths, and the segments
that say which of its tokens other requests share (``prefix.py``). The segments cover the
prompt *and* the output, because in a multi-turn session the next turn's prompt re-sends
this turn's answer. Everything random takes a seed; nothing reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.prefix import (
    Segment,
    SegmentInterner,
    block_hashes,
    shareable_prefix_tokens,
)
from kvtune.tuner.traces import Trace, TraceRequest
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: int
    arrival_seconds: float
    prompt_tokens: int
    output_tokens: int  # >= 1: vLLM samples at least one token
    # Prompt then output; their lengths add up to at least prompt + output tokens.
    segments: tuple[Segment, ...]
    # Leading tokens some other request also has; no prefix hit can reach past them.
    shareable_tokens: int = 0


def _finish(
    arrivals: Sequence[float], prompts: Sequence[int], outputs: Sequence[int],
    segments: Sequence[tuple[Segment, ...]],
) -> list[SimRequest]:
    shareable = shareable_prefix_tokens(segments)
    order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i))
    return [
        SimRequest(
            request_id=n, arrival_seconds=float(arrivals[i]), prompt_tokens=int(prompts[i]),
            output_tokens=max(1, int(outputs[i])), segments=segments[i],
            shareable_tokens=shareable[i],
        )
        for n, i in enumerate(order)
    ]


def requests_from_trace(
    trace: Trace, speed: float = 1.0, limit: int | None = None, start: int = 0
) -> list[SimRequest]:
    """The trace's requests, arrivals divided by ``speed`` (2.0 replays twice as fast).

    Mooncake ``hash_ids`` become chained segments (see ``prefix.py`` for what that assumes);
    a request without ids (Azure) is one segment nobody else has."""
    if speed <= 0:
        raise InvalidInput("--speed", speed, "must be > 0 (2 replays the trace twice as fast)")
    rows = list(trace.requests[start:])
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise InvalidInput("trace", trace.name, "no requests to replay (empty slice)")
    t0 = rows[0].arrival_seconds
    interner = SegmentInterner()
    segs: list[tuple[Segment, ...]] = []
    for r in rows:
        out, _ = trace_segments(r, interner)
        segs.append(tuple(out))
    return _finish(
        [(r.arrival_seconds - t0) / speed for r in rows],
        [r.prompt_tokens for r in rows], [r.output_tokens for r in rows], segs,
    )


def trace_segments(
    req: TraceRequest, interner: SegmentInterner
) -> tuple[list[Segment], int]:
    """A trace request's tokens as segments, and how many prompt tokens its prefix ids cover:
    Mooncake's prefix ids become chained segments (a block's identity includes its parents'),
    cut at the prompt's end; the uncovered prompt and the whole output are the request's own."""
    segments: list[Segment] = []
    parent = 0
    covered = 0
    for hid in req.prefix_block_ids:
        if covered >= req.prompt_tokens:
            break
        n = min(req.hash_block_tokens, req.prompt_tokens - covered)
        parent = interner.chain(parent, hid)
        segments.append((parent, n))
        covered += n
    segments.append((interner.unique(),
                     req.prompt_tokens - covered + max(1, req.output_tokens)))
    return segments, covered


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """A log-normal length, fitted to a median and a 95th percentile, clipped to
    ``[min_tokens, max_tokens]``. Log-normal because request lengths are skewed right and
    the planner knows quantiles, not a histogram."""

    p50_tokens: int
    p95_tokens: int
    max_tokens: int
    min_tokens: int = 1

    @classmethod
    def from_quantiles(cls, q: TokenQuantiles) -> LengthDistribution:
        return cls(p50_tokens=max(1, q.p50), p95_tokens=max(1, q.p95, q.p50),
                   max_tokens=max(1, q.max, q.p95))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.p50_tokens)
        sigma = max(0.0, (math.log(self.p95_tokens) - mu) / 1.6449)
        x = np.exp(rng.normal(mu, sigma, size=n))
        out: np.ndarray = np.clip(np.rint(x), self.min_tokens, self.max_tokens).astype(np.int64)
        return out


@dataclass(frozen=True, slots=True)
class SyntheticProfile:
    """Traffic made up from a few figures.

    Every request starts with the same ``system_prompt_tokens`` (shared by all). With
    ``turns_per_session > 1`` requests come in sessions: turn t+1 re-sends the whole
    history (system prompt, every earlier user message and answer) plus a new user message,
    and arrives ``think_seconds`` after turn t arrived (the traffic is made before any
    service time is known, so the gap counts from the arrival; keep it above the expected
    latency so a turn does not arrive before its previous answer). Sessions start as a
    Poisson process at ``request_rate_per_second / turns_per_session``.
    """

    num_requests: int
    request_rate_per_second: float
    user_prompt: LengthDistribution
    output: LengthDistribution
    system_prompt_tokens: int = 0
    turns_per_session: int = 1
    think_seconds: float = 30.0
    max_context_tokens: int | None = None  # sessions stop growing past this


def synthetic_requests(profile: SyntheticProfile, seed: int) -> list[SimRequest]:
    if profile.num_requests <= 0 or profile.request_rate_per_second <= 0:
        raise InvalidInput(
            "synthetic profile", (profile.num_requests, profile.request_rate_per_second),
            "needs num_requests > 0 and request_rate_per_second > 0",
        )
    rng = np.random.default_rng(seed)
    n = profile.num_requests
    turns = max(1, profile.turns_per_session)
    users = profile.user_prompt.sample(rng, n)
    outs = profile.output.sample(rng, n)
    sessions_per_second = profile.request_rate_per_second / turns
    num_sessions = math.ceil(n / turns)
    starts = np.cumsum(rng.exponential(1.0 / sessions_per_second, size=num_sessions))
    interner = SegmentInterner()
    system_uid = interner.chain(0, "system-prompt")
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    segs: list[tuple[Segment, ...]] = []
    i = 0
    for s in range(num_sessions):
        history: list[Segment] = (
            [(system_uid, profile.system_prompt_tokens)] if profile.system_prompt_tokens else []
        )
        for t in range(turns):
            if i >= n:
                break
            user = (interner.unique(), int(users[i]))
            prompt = [*history, user]
            prompt_tokens = sum(length for _, length in prompt)
            limit = profile.max_context_tokens
            if limit and prompt_tokens + int(outs[i]) > limit:
                # The session is full: start over with a fresh history, as chat UIs do.
                prompt = [*history[:1], user] if profile.system_prompt_tokens else [user]
                prompt_tokens = sum(length for _, length in prompt)
            answer = (interner.unique(), int(outs[i]))
            arrivals.append(float(starts[s]) + t * profile.think_seconds)
            prompts.append(prompt_tokens)
            outputs.append(int(outs[i]))
            segs.append((*prompt, answer))
            history = [*prompt, answer]
            i += 1
    return _finish(arrivals, prompts, outputs, segs)


def synthetic_profile_from_workload(
    workload: WorkloadProfile, num_requests: int, request_rate_per_second: float | None = None,
) -> SyntheticProfile:
    """The planner's declared or observed profile as traffic the simulator can replay."""
    rate = request_rate_per_second or workload.request_rate_per_second or 10.0
    shared = min(workload.shared_prefix_tokens, max(0, workload.context_tokens.p50 - 1))
    ctx = workload.context_tokens
    # The user part is the context minus the shared system prompt.
    user = LengthDistribution(
        p50_tokens=max(1, ctx.p50 - shared), p95_tokens=max(1, ctx.p95 - shared, ctx.p50 - shared),
        max_tokens=max(1, ctx.max - shared),
    )
    turns = 4 if workload.multi_turn else 1
    if workload.multi_turn:
        # History grows over turns; scale the per-turn message so the mean context matches.
        user = LengthDistribution(
            p50_tokens=max(1, user.p50_tokens // turns),
            p95_tokens=max(1, user.p95_tokens // turns), max_tokens=user.max_tokens,
        )
    return SyntheticProfile(
        num_requests=num_requests, request_rate_per_second=rate, user_prompt=user,
        output=LengthDistribution.from_quantiles(workload.output_tokens),
        system_prompt_tokens=shared, turns_per_session=turns,
        max_context_tokens=ctx.max + workload.output_tokens.max,
    )


def ideal_prefix_hit_rate(requests: Sequence[SimRequest], block_size: int) -> float:
    """Prefix-cache hit rate (tokens) with an unbounded cache that never evicts: the upper
    bound any KV-cache size can reach on these requests, counted as vLLM counts (full
    blocks only, at most ``prompt - 1`` tokens, requests in arrival order; a request's own
    blocks count for later requests once it has arrived)."""
    seen: set[int] = set()
    hit = total = 0
    for r in requests:
        keys = block_hashes(r.segments, r.shareable_tokens, block_size)
        cap = (r.prompt_tokens - 1) // block_size
        n = 0
        for key in keys[:cap]:
            if key not in seen:
                break
            n += 1
        seen.update(keys)
        hit += n * block_size
        total += r.prompt_tokens
    return hit / total if total else 0.0
