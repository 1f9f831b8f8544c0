"""Pipeline parallel as vLLM 0.33 runs it: micro-batches through ``pp`` stages.

Read in the pinned wheel. With ``--pipeline-parallel-size`` > 1 vLLM 0.33 runs the V2 model
runner with async scheduling (``VllmConfig._get_v2_model_runner_unsupported_features`` does
not list PP; the V1 runner refuses PP with async scheduling), so the engine core keeps
``max_concurrent_batches`` = pp + 1 batches in flight (``VllmConfig.max_concurrent_batches``,
``EngineCore.batch_queue``). Its loop (``EngineCore.step_with_batch_queue``): schedule a batch
and put it in the queue; while the queue is not full and there are requests, schedule again;
else wait for the oldest batch's output and process it (``update_from_output``: tokens,
finishes, frees). The ``AsyncScheduler`` counts every ``schedule()`` call
(``current_step``, empty ones too) and, for a request a batch samples, sets
``next_decode_eligible_step = current_step + pp`` (``decode_stagger``): the running loop
skips it until then (a prefill chunk that leaves part of the prompt sets nothing, so the next
chunk goes in the next batch). So an engine's running requests ride in about pp
micro-batches, each scheduled from the requests not in flight, with the token budget
(``max_num_batched_tokens``) per micro-batch and ``max_num_seqs`` over all of them.

Time: each stage runs one micro-batch at a time; a micro-batch enters stage 0 when stage 0 is
free and when the tokens it decodes have come back from the last stage (the V2 runner
broadcasts the sampled tokens to the first stage), and stage k + 1 once stage k is done and the
activations are sent (``pipeline_send_seconds_per_token`` x its tokens). A stage's time is
``StepCostModel`` of one stage (``pipeline_costs.py``), the CPU overhead on stage 0 only
(overlapped as under async scheduling). A micro-batch's tokens exist when it leaves the last
stage (its exit): that is the first-token and finish time, and the time its output is
processed. So a sequence's time between two tokens is ``pp x stage + (pp - 1) x send`` when
nothing waits, and throughput is one micro-batch per stage time: the rules' formula
(``planner/decode.py``), with the bubbles where fewer than pp micro-batches are ready.

Simplified: every stage is charged the slowest stage's time (``pipeline_costs``); a batch is
scheduled at the engine clock (``now`` moves when the core waits for an output, or idles), so
a request that arrives while the core schedules ahead joins a later batch, as in vLLM. No CPU
tier (``EngineConfig`` refuses it with PP); exact steps only (no decode runs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.sched_exact import ExactScheduler
from kvtune.tuner.simulator.sched_state import EngineConfig, RequestState
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import SimRequest

Scheduled = list[tuple[RequestState, int]]


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """One batch in flight: the ``schedule()`` call that made it, when it leaves the last
    stage (an empty batch: when it was scheduled) and what it scheduled."""

    step: int
    exit_seconds: float
    scheduled: tuple[tuple[RequestState, int], ...]


class PipelineScheduler(ExactScheduler):
    """Replays ``requests`` on one pipeline-parallel engine (module doc); ``run()`` once.

    ``on_step`` (tests, the oracle) is called after every non-empty ``schedule()`` with
    ``last_scheduled`` (the micro-batch) and ``current_step`` (vLLM's ``current_step``)."""

    def __init__(self, requests: Sequence[SimRequest], config: EngineConfig,
                 cost: StepCostModel, name: str = "",
                 on_step: Callable[[PipelineScheduler], None] | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        if config.pipeline_parallel < 2:
            raise InvalidInput("pipeline_parallel", config.pipeline_parallel,
                               "the pipeline replay needs 2 or more stages; use simulate()")
        if not config.async_scheduling:
            raise InvalidInput("async_scheduling", False,
                               "vLLM 0.33 runs pipeline parallel with async scheduling (the "
                               "V2 model runner); set async_scheduling")
        super().__init__(requests, config, cost, name)
        self.pp = config.pipeline_parallel
        # VllmConfig.max_concurrent_batches under the V2 runner with async scheduling.
        self.depth = self.pp + 1
        self.current_step = 0
        self.on_step = on_step
        self.on_progress = on_progress
        self._stage_free = [0.0] * self.pp
        self._queue: deque[MicroBatch] = deque()
        # In-flight batches that sample: step -> exit time (a decode waits for its token).
        self._exits: dict[int, float] = {}
        self._overhead = cost.efficiency.step_overhead_seconds

    def run(self) -> SimResult:
        states = self.states
        n = len(states)
        idx = 0
        empties = 0
        # Progress every twentieth of the requests (``scheduler.PROGRESS_REPORTS``).
        stride = max(1, n // 20)
        next_report = stride
        while True:
            if self.on_progress is not None and self.finished >= next_report:
                self.on_progress(min(self.finished, n), n)
                next_report = (self.finished // stride + 1) * stride
            while idx < n and states[idx].req.arrival_seconds <= self.now:
                if states[idx].output_tokens > 0:
                    self.waiting.append(states[idx])
                idx += 1
            if self.running or self.waiting:
                self.events += 1
                if self._schedule_batch():
                    empties = 0
                    if self.on_step is not None:
                        self.on_step(self)
                else:
                    empties += 1
                    if empties > 2 * self.depth and not self._busy():
                        # Nothing can run and nothing is in flight: wait for an arrival.
                        self._idle(states[idx].req.arrival_seconds if idx < n else None)
                        empties = 0
                        continue
                if len(self._queue) < self.depth:
                    continue  # vLLM schedules ahead until the queue is full
            elif not self._queue:
                if idx >= n:
                    break
                self.now = states[idx].req.arrival_seconds
                continue
            self._process_oldest()
        if self.on_progress is not None:
            self.on_progress(n, n)
        return self._result()

    def _busy(self) -> bool:
        """Whether a batch with tokens is in flight (its output will change something)."""
        return any(b.scheduled for b in self._queue)

    def _schedule_batch(self) -> bool:
        """One ``schedule()`` call: the micro-batch, its time through the stages, queued.
        Whether it scheduled anything."""
        self.current_step += 1
        scheduled: Scheduled = []
        self.last_preempted = []
        budget, preempted = self._schedule_eligible(scheduled)
        if not preempted:
            self._admit(budget, scheduled)
        self.last_scheduled = scheduled
        self.last_blocks_in_use = self._usable_blocks - self.pool.get_num_free_blocks()
        if not scheduled:
            self._queue.append(MicroBatch(self.current_step, self.now, ()))
            return False
        # A decode waits for the token its last micro-batch samples (still in flight?).
        ready = self.now
        exits = self._exits
        for st, _ in scheduled:
            e = exits.get(st.last_sample_step)
            if e is not None and e > ready:
                ready = e
        first, exit_seconds = self._through_stages(scheduled, ready)
        clock = self.now
        self.now = exit_seconds  # its tokens exist when it leaves the last stage
        self._compute(scheduled, self.current_step)
        self.now = clock
        self.steps += 1
        exits[self.current_step] = exit_seconds
        self._queue.append(MicroBatch(self.current_step, exit_seconds, tuple(scheduled)))
        alloc = used = 0
        for st in self.running:
            alloc += len(st.blocks)
            used += st.num_computed
        bs = self.block_size
        self._sample(first, alloc * bs - used, alloc * bs)
        return True

    def _schedule_eligible(self, scheduled: Scheduled) -> tuple[int, bool]:
        """The running requests not in flight, in running order (``_schedule_running``
        with vLLM's ``next_decode_eligible_step`` skip), preempting the newest while a
        request's new slots do not fit. Returns the budget left and whether anyone was
        preempted."""
        budget = self.config.max_num_batched_tokens
        running = self.running
        step, pp = self.current_step, self.pp
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            st = running[i]
            if st.generated >= st.output_tokens or step < st.last_sample_step + pp:
                i += 1  # its last token is in flight, or its next is not back yet
                continue
            num_new = min(st.num_tokens - st.num_computed, budget)
            self_preempted = False
            while not self._allocate(st, num_new):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is st:
                    self_preempted = True
                    break
            if self_preempted:
                break
            scheduled.append((st, num_new))
            budget -= num_new
            i += 1
        return budget, preempted

    def _through_stages(self, scheduled: Scheduled, ready: float) -> tuple[float, float]:
        """The micro-batch through every stage (module doc), from ``ready``: stage 0's time
        (with the overhead) and when it leaves the last stage."""
        num_tokens = kv_read = 0
        pairs = 0.0
        for st, num_new in scheduled:
            num_tokens += num_new
            kv_read += st.num_computed + num_new
            pairs += num_new * st.num_computed + num_new * (num_new + 1) / 2.0
        cost, seqs = self.cost, len(scheduled)
        first = cost.step_seconds(num_tokens, kv_read, pairs, True, seqs)
        gpu = max(0.0, cost.step_seconds(num_tokens, kv_read, pairs, False, seqs)
                  - self._overhead)
        send = self.config.pipeline_send_seconds_per_token * num_tokens
        free = self._stage_free
        end = max(ready, free[0]) + first
        free[0] = end
        for k in range(1, self.pp):
            end = max(end + send, free[k]) + gpu
            free[k] = end
        return first, end

    def _process_oldest(self) -> None:
        """The core waits for the oldest batch's output and processes it: the requests it
        finished leave, at its exit."""
        batch = self._queue.popleft()
        self._exits.pop(batch.step, None)
        exit_seconds = batch.exit_seconds
        if exit_seconds > self.now:
            self.now = exit_seconds
        done = [st for st, _ in batch.scheduled
                if st.generated >= st.output_tokens and st.last_sample_step == batch.step
                and st.finish_seconds != st.finish_seconds]  # NaN: not retired yet
        if not done:
            return
        for st in done:
            self._retire(st)
            st.finish_seconds = exit_seconds
        gone = {id(st) for st in done}
        self.running = [st for st in self.running if id(st) not in gone]
