"""vLLM V1's scheduler at the level that decides memory and latency, replayed over requests.

Each engine step (``vllm/v1/core/sched/scheduler.py``, FCFS policy, chunked prefill on):

1. RUNNING requests in admission order each get ``num_tokens - num_computed_tokens`` new
   tokens (a prefill chunk, or 1 when decoding), capped by the step's token budget
   (``max_num_batched_tokens``). When a request's new slots do not fit in the free blocks,
   the *newest* running request is preempted (its blocks freed, tail first; its computed
   tokens reset to 0 so it is recomputed later; put back at the *front* of the waiting
   queue), repeatedly, until the slots fit or the request preempted itself.
2. Only if nothing was preempted, WAITING requests are admitted in arrival order while the
   budget lasts and fewer than ``max_num_seqs`` run: a prefix-cache lookup (full blocks
   only, capped so that at least the last token is computed), then vLLM 0.33's
   ``scheduler_reserve_full_isl`` check: the *whole* sequence's blocks must be free now
   (counting hit blocks that sit in the free queue), else admission stops (FIFO: the head
   blocks the queue). The first chunk's blocks are allocated and its full blocks cached.
3. The step's time comes from ``timing.StepCostModel``; every request whose computed tokens
   caught up samples one token; those done free their blocks in reverse order.

Speed (``decode_runs=True``, the default; ``False`` steps every request of every step
exactly, the reference the differential tests hold against vLLM):

- a running request that decodes steadily joins the *decoding cohort* (``cohort.py``),
  whose members advance together by one clock: a step costs O(1) for all of them, plus
  the work of the requests that do something else (a prefill chunk, an admission, a finish);
- a step that could preempt (the new blocks do not all fit) or that the token budget cuts
  before a member is taken exactly (the cohort's members are written back first);
- decode-only stretches are not stepped one by one. When every running request is
  decoding and no waiting request can be admitted, the next ``k`` steps are identical in
  shape (every sequence one token longer), so they are taken at once: ``k`` is the number
  of steps until the first request finishes, the next arrival could be admitted, or the
  free blocks would run out (then the exact step handles the preemption); their time is a
  closed form (``decode_run_seconds``), the new blocks are taken from the free queue in one
  call (the same blocks, in a different per-request order, as step by step: nothing is
  freed or touched in between). The cost is per event and per block, not per token.

``contiguous`` allocation is the pre-PagedAttention baseline: a request reserves
``max_model_len`` token slots when admitted and holds them to the end (no prefix caching,
never preempted). All reservations are the same size, so there is no external
fragmentation: capacity is ``floor(KV tokens / max_model_len)`` requests. It is simulated
as a paged pool whose one block is a whole reservation (block size = max_model_len, no
caching): every request needs exactly one such block, which is that allocator exactly.

Async scheduling (``EngineConfig.async_scheduling``, vLLM 0.33's default): the engine core
keeps two batches in flight (``step_with_batch_queue``): it schedules batch N+1 before it
processes batch N's output. So a request that samples its last token in step N is still
running while step N+1 is scheduled: vLLM's ``AsyncScheduler`` skips it (it knows the
in-flight step reaches max_tokens) but it keeps its blocks and its running slot through that
schedule, and is freed right after it. Everything else (chunks, decode tokens, admissions,
preemptions) is scheduled as in the synchronous loop. The step time overlaps the overhead
with the GPU work (``timing``).

KV offload to CPU (``EngineConfig.cpu_offload_blocks`` > 0, ``offload.py``): a request's
prompt blocks are stored in the CPU tier when its prompt is done; an admission that finds
blocks there past its GPU prefix hit allocates them, waits out of the queue for their load
over the host link (taking no token budget), and is then scheduled first with those tokens
computed. With offload off none of this runs: one empty-list check per loop iteration.

The core is pure: no clock, no I/O, no randomness; the caller passes the requests.

The run modes live in their own modules, each a layer of the one class: ``sched_core``
(state, allocation, a step's bookkeeping, the result), ``sched_offload`` (the CPU tier),
``sched_exact`` (the exact step: preemption and admission), ``sched_cohort`` (the cohort
step), ``sched_runs`` (decode and prefill runs); this module picks the mode for each step.
Pipeline parallel (``EngineConfig.pipeline_parallel`` > 1) is its own replay,
``sched_pipeline.PipelineScheduler``, which ``simulate()`` runs instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.sched_pipeline import PipelineScheduler
from kvtune.tuner.simulator.sched_runs import RunScheduler
from kvtune.tuner.simulator.sched_state import Allocation, EngineConfig, RequestState
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import SimRequest

__all__ = ["PROGRESS_REPORTS", "Allocation", "EngineConfig", "ProgressHook", "RequestState",
           "Scheduler", "StepHook", "simulate"]

StepHook = Callable[["Scheduler"], None]
# Progress of a replay: (requests finished, requests in all). The caller shows it; the
# scheduler only counts (no clock, no I/O).
ProgressHook = Callable[[int, int], None]
# A replay reports progress about this many times (every 5% of its requests) and once at the
# end: often enough to show movement, rarely enough to cost nothing.
PROGRESS_REPORTS = 20


class Scheduler(RunScheduler):
    """Replays ``requests`` (sorted by arrival) under ``config``; ``run()`` returns the result.

    ``on_step`` (tests) is called after every simulated step or decode run, with every
    request's fields up to date; ``on_progress`` with (finished, all) requests every
    ``PROGRESS_REPORTS``-th of them and at the end. ``last_scheduled``, ``last_preempted``
    and ``last_blocks_in_use`` describe the last step only when stepping exactly
    (``decode_runs=False``).
    """

    def __init__(
        self, requests: Sequence[SimRequest], config: EngineConfig, cost: StepCostModel,
        name: str = "", on_step: StepHook | None = None, decode_runs: bool = True,
        on_progress: ProgressHook | None = None,
    ) -> None:
        if config.pipeline_parallel > 1:
            raise InvalidInput("pipeline_parallel", config.pipeline_parallel,
                               "this scheduler runs one stage; replay pipeline parallel "
                               "with simulate() (sched_pipeline.PipelineScheduler)")
        super().__init__(requests, config, cost, name)
        # False: step every decode step exactly (the reference the decode runs must match).
        self.decode_runs = decode_runs
        self.on_step = on_step
        self.on_progress = on_progress

    def run(self) -> SimResult:
        states = self.states
        n = len(states)
        idx = 0
        stride = max(1, n // PROGRESS_REPORTS)
        next_report = stride
        loading = self.loading
        while True:
            while idx < n and states[idx].req.arrival_seconds <= self.now:
                if states[idx].output_tokens > 0:
                    self.waiting.append(states[idx])
                idx += 1
            if not self.running and not self.waiting and not loading and not (
                    self.loaded or self._cpu_retired):
                if idx >= n:
                    break
                self.now = states[idx].req.arrival_seconds
                continue
            next_arrival = states[idx].req.arrival_seconds if idx < n else None
            if self.offload is not None:
                # vLLM learns of a finished transfer from a step's output. Synchronous: the
                # step just taken, so one done by now. Async: this schedule runs before the
                # last step's output is processed, so one done by the last step's start.
                seen = self._load_seen_seconds if self.config.async_scheduling else self.now
                self.offload.complete(seen)
                if loading:
                    self._loads_arrived(seen)
                # The worker starts the last schedule's stores with this step.
                self.offload.begin_step(self.now)
                ready = loading[0].load_ready_seconds if loading else None
                if ready is not None and (next_arrival is None or ready < next_arrival):
                    next_arrival = ready
            self.events += 1
            self._advance(next_arrival)
            if self.on_step is not None:
                self.cohort.sync_all()
                self.on_step(self)
            if self.on_progress is not None and self.finished >= next_report:
                self.on_progress(min(self.finished, n), n)
                next_report = (self.finished // stride + 1) * stride
        if self.on_progress is not None:
            self.on_progress(n, n)  # requests with no output tokens never run
        return self._result()

    def _advance(self, next_arrival: float | None) -> None:
        """One loop iteration: a decode run, a cohort step, or an exact step."""
        if not self.decode_runs:
            self._step(next_arrival)
            return
        if self.offload is not None:
            # With the CPU tier, decode runs only where they store, look up and admit
            # nothing; a cohort step stores and loads as the exact step (its members have
            # nothing to store: ``_joins``); no prefill runs (each chunk stores).
            if (not (self.waiting or self.loading or self.loaded)
                    and self._cohort_run(next_arrival)) or self._cohort_step(next_arrival):
                return
        elif (self._cohort_run(next_arrival) or self._prefill_run(next_arrival)
                or self._cohort_step(next_arrival)):
            return
        # The exact step, with every request in its fields; then the cohort re-forms.
        self.cohort.leave_all()
        self._step(next_arrival)
        self._regroup()


def simulate(
    requests: Sequence[SimRequest], config: EngineConfig, cost: StepCostModel, name: str = "",
    on_step: StepHook | None = None, on_progress: ProgressHook | None = None,
) -> SimResult:
    """Replay ``requests`` under ``config``; pure (same inputs, same result). Pipeline
    parallel (``config.pipeline_parallel`` > 1) replays its micro-batches
    (``sched_pipeline``)."""
    if config.pipeline_parallel > 1:
        return PipelineScheduler(requests, config, cost, name=name,
                                 on_progress=on_progress).run()
    return Scheduler(requests, config, cost, name=name, on_step=on_step,
                     on_progress=on_progress).run()
