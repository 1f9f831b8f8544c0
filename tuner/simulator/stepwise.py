"""The scheduler driven step by step: requests are submitted as they arrive, time advances
to a given model time, and the live state and per-request events can be read in between.

``Scheduler.run()`` replays a whole request list at once (the planner's and ``kvtune
simulate``'s use). A replayed vLLM instance (``kvtune replay --engine simulator``) does not
know its future traffic: ``StepwiseScheduler`` takes the same engine steps and decode runs,
but only up to ``advance_to(t)`` (a decode run stops within one step of ``t``; an exact step
is never split, so ``now`` may pass ``t`` by at most one step).

What differs from a batch run, and why:

- Prefix hashes: a batch run knows which leading segments a later request will share and
  hashes only those (``shareable_tokens``); a stream cannot know, so the caller passes
  ``shareable_tokens`` as what *might* be shared (``sim_request_from_trace``: every token a
  trace's prefix ids cover). Hits are the same; only more blocks carry a real hash.
- No ``TimeSeries`` is kept (a replay runs for hours); the live state is read instead.

Pure like the rest of the core: time is the caller's argument, nothing reads a clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.prefix import SegmentInterner
from kvtune.tuner.simulator.scheduler import EngineConfig, RequestState, Scheduler
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import SimRequest, trace_segments
from kvtune.tuner.traces import TraceRequest


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """One request that finished, with the times vLLM's request histograms are made of."""

    request_id: int
    arrival_seconds: float
    scheduled_seconds: float  # first admission (the end of its queue time)
    first_token_seconds: float
    finish_seconds: float
    prompt_tokens: int
    output_tokens: int  # generated (cut at max-model-len when the request asked for more)
    cached_prompt_tokens: int  # prefix-cache hit at first admission
    preemptions: int
    finished_reason: str  # "stop", or "length" when cut at max-model-len


@dataclass(slots=True)
class StepEvents:
    """What happened since the last ``drain()``."""

    # Time to first token of each request whose first token came (seconds).
    first_token_seconds: list[float] = field(default_factory=list)
    # (seconds between two tokens of one request, how many tokens had that gap); a decode
    # run of k tokens gives its mean gap k times.
    token_gaps: list[tuple[float, int]] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LiveState:
    now_seconds: float
    running: int
    waiting: int  # arrived, not running (includes preempted requests)
    kv_cache_usage: float  # BlockPool.get_usage(): cached-but-free blocks count as free
    prefix_query_tokens: int  # cumulative, counted at first admission
    prefix_hit_tokens: int
    preemptions: int
    prompt_tokens: int  # cumulative, counted at each request's first token
    generation_tokens: int  # cumulative
    rejected: int


class StepwiseScheduler(Scheduler):
    """``submit`` requests (in arrival order), ``advance_to(t)``, read ``state()`` and
    ``drain()``. Starts empty at ``start_seconds``."""

    def __init__(self, config: EngineConfig, cost: StepCostModel,
                 start_seconds: float = 0.0) -> None:
        super().__init__((), config, cost, name="stepwise")
        self.now = start_seconds
        self._pending: deque[RequestState] = deque()  # submitted, not yet arrived
        self._events = StepEvents()
        self._finished_now: list[RequestState] = []
        self._generated_seen: dict[int, int] = {}  # request_id -> tokens already reported
        self._last_token_seconds: dict[int, float] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    # -- input ------------------------------------------------------------------------------

    def submit(self, req: SimRequest) -> bool:
        """Queue ``req`` (arriving at ``req.arrival_seconds``); False if vLLM would reject it
        (no room for one output token within max-model-len, or larger than the cache)."""
        if self._pending and req.arrival_seconds < self._pending[-1].req.arrival_seconds:
            raise InvalidInput("arrival_seconds", req.arrival_seconds,
                               "requests must be submitted in arrival order")
        st = self._new_state(req)
        self.pool.reserve_keys(self.keyspace.num_keys)
        if st.output_tokens == 0:
            return False
        self._pending.append(st)
        return True

    def in_flight(self) -> list[SimRequest]:
        """Requests submitted and not finished (running, waiting, not yet arrived), in
        arrival order of admission: running first, then the queue, then the future."""
        return [st.req for st in (*self.running, *self.waiting, *self._pending)]

    # -- time -------------------------------------------------------------------------------

    def advance_to(self, t_seconds: float) -> None:
        """Run engine steps until model time ``t_seconds`` (idle time is skipped)."""
        self.horizon_seconds = t_seconds
        pending = self._pending
        while True:
            while pending and pending[0].req.arrival_seconds <= self.now:
                self.waiting.append(pending.popleft())
            if not self.running and not self.waiting:
                if pending and pending[0].req.arrival_seconds <= t_seconds:
                    self.now = max(self.now, pending[0].req.arrival_seconds)
                    continue
                self.now = max(self.now, t_seconds)
                return
            if self.now >= t_seconds:
                return
            next_arrival = pending[0].req.arrival_seconds if pending else None
            before = list(self.running)
            self.events += 1
            self._advance(next_arrival)
            self.cohort.sync_all()  # the report reads every running request's fields
            self._report(before)

    def _report(self, before: Sequence[RequestState]) -> None:
        now = self.now
        ev = self._events
        seen = self._generated_seen
        last = self._last_token_seconds
        checked: set[int] = set()
        for st in (*before, *self.running, *self._finished_now):
            rid = st.req.request_id
            if rid in checked:
                continue
            checked.add(rid)
            old = seen.get(rid, 0)
            new = st.generated - old
            if new <= 0:
                continue
            self.generation_tokens_total += new
            if old == 0:
                ev.first_token_seconds.append(now - st.req.arrival_seconds)
                self.prompt_tokens_total += st.req.prompt_tokens
                new -= 1
            if new > 0:
                ev.token_gaps.append(((now - last.get(rid, now)) / new, new))
            seen[rid] = st.generated
            last[rid] = now
        for st in self._finished_now:
            rid = st.req.request_id
            seen.pop(rid, None)
            last.pop(rid, None)
            ev.finished.append(FinishedRequest(
                request_id=rid, arrival_seconds=st.req.arrival_seconds,
                scheduled_seconds=st.scheduled_seconds,
                first_token_seconds=st.first_token_seconds, finish_seconds=st.finish_seconds,
                prompt_tokens=st.req.prompt_tokens, output_tokens=st.output_tokens,
                cached_prompt_tokens=st.cached_tokens, preemptions=st.preemptions,
                finished_reason="length" if st.output_tokens < st.req.output_tokens
                else "stop",
            ))
        self._finished_now = []

    def _retire(self, st: RequestState) -> None:
        self._finished_now.append(st)
        super()._retire(st)

    def _sample(self, dt: float, fragmented_slots: int, allocated_slots: int,
                usage: float | None = None) -> None:
        # The batch run's integrals, without the per-step series (a replay runs for hours).
        n_run = len(self.running)
        if n_run > self.peak_running:
            self.peak_running = n_run
        self._busy_seconds += dt
        self._running_integral += n_run * dt

    # -- output -----------------------------------------------------------------------------

    def drain(self) -> StepEvents:
        """The events since the last call (and forget them)."""
        out, self._events = self._events, StepEvents()
        return out

    def state(self) -> LiveState:
        return LiveState(
            now_seconds=self.now, running=len(self.running),
            waiting=len(self.waiting), kv_cache_usage=self.pool.get_usage(),
            prefix_query_tokens=self.query_tokens, prefix_hit_tokens=self.hit_tokens,
            preemptions=self.preemptions, prompt_tokens=self.prompt_tokens_total,
            generation_tokens=self.generation_tokens_total, rejected=self.rejected,
        )


def sim_request_from_trace(
    req: TraceRequest, request_id: int, arrival_seconds: float, interner: SegmentInterner,
) -> SimRequest:
    """One trace request as the simulator sees it, without knowing the rest of the trace:
    Mooncake's prefix ids become chained segments (as ``requests_from_trace``) and every
    token they cover may be shared; the rest of the prompt and the output are the
    request's own."""
    segments, covered = trace_segments(req, interner)
    return SimRequest(
        request_id=request_id, arrival_seconds=arrival_seconds,
        prompt_tokens=req.prompt_tokens, output_tokens=max(1, req.output_tokens),
        segments=tuple(segments), shareable_tokens=covered,
    )
