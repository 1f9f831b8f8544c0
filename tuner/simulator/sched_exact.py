"""The exact engine step: every running request scheduled in order, preemption when blocks run
out, then admissions from the waiting queue (the module doc of ``scheduler.py``). It is the
reference the fast run modes (``sched_cohort``, ``sched_runs``) must match, and the step they
fall back to whenever something could preempt."""

from __future__ import annotations

import numpy as np

from kvtune.tuner.simulator.sched_offload import OffloadScheduler
from kvtune.tuner.simulator.sched_state import (
    LOAD_BLOCKED,
    LOAD_DEFER,
    LOAD_STARTED,
    NO_BLOCKS,
    RequestState,
)


class ExactScheduler(OffloadScheduler):
    """Preemption, admission and the exact step."""

    def _preempt(self, st: RequestState) -> None:
        self.last_preempted.append(st)
        if st.generated >= st.output_tokens:
            # Async: it finished in the step before, whose output is still in flight. vLLM
            # preempts it like any other (counted), frees its blocks, and the output then
            # finishes it instead of requeueing it.
            st.preemptions += 1
            self.preemptions += 1
            self._retire(st)
            return
        if (self.config.async_scheduling and st.tail_unprocessed
                and st.last_sample_step == self.steps):
            # Its last step's output is in flight, and that step computed a token sampled
            # in the step before: vLLM hashes that token's block only when it processes the
            # step's output, after this schedule; preempted now, the block is freed unhashed
            # (front of the free queue, and not found when the request resumes).
            st.num_cached_blocks = min(st.num_cached_blocks,
                                       (st.num_computed - 1) // self.block_size)
        if self.pool.enable_caching and len(st.hashes) < st.num_cached_blocks:
            # The request itself will look its blocks up when it resumes (vLLM keeps them
            # cached), so its own full blocks need real keys, not UNSHARED_HASH.
            known = len(st.hashes)
            st.hashes = np.asarray(self.keyspace.keys(st.req.segments, st.num_tokens),
                                   np.int64)
            self.pool.reserve_keys(self.keyspace.num_keys)
            self.pool.cache_full_blocks(st.blocks, st.hashes, known, st.num_cached_blocks)
        self._free(st)
        st.num_computed = 0
        st.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(st)

    def _admit(self, budget: int, scheduled: list[tuple[RequestState, int]]) -> int:
        """Admit waiting requests in order while the budget, max-num-seqs and the
        full-sequence block check allow (appended to ``running`` and ``scheduled``);
        returns the budget left."""
        waiting = self.waiting
        running = self.running
        pool = self.pool
        bs = self.block_size
        max_num_seqs = self.config.max_num_seqs
        offload = self.offload
        skipped: list[RequestState] = []  # deferred by the CPU tier: tried next step
        loaded = self.loaded
        while budget > 0 and (waiting or loaded) and len(running) < max_num_seqs:
            queue = loaded or waiting
            st = queue[0]
            if queue is loaded:
                # Its KV arrived from the CPU tier: it holds the blocks, nothing to look up.
                if self._admission_blocks(st, NO_BLOCKS) > pool.get_num_free_blocks():
                    break
                num_new = min(st.num_tokens - st.num_computed, budget)
            else:
                if offload is not None:
                    hits = self._lookup(st)
                    # vLLM asks the connector before it checks the blocks.
                    load = self._load_from_cpu(st, hits, scheduled)
                    if load == LOAD_DEFER:
                        skipped.append(waiting.popleft())
                        continue
                    if load == LOAD_BLOCKED:
                        break
                    if load == LOAD_STARTED:
                        waiting.popleft()  # it waits for its KV (WAITING_FOR_REMOTE_KVS)
                        continue
                    if self._admission_blocks(st, hits) > pool.get_num_free_blocks():
                        break
                else:
                    # The check first, the hits only for an admission (most checks fail).
                    num_hits, need = self._hit_need(st)
                    if need > pool.get_num_free_blocks():
                        break
                    hits = self._hits(st, num_hits)
                computed = len(hits) * bs
                num_new = min(st.num_tokens - computed, budget)
                self._count_admission(st, computed, computed)
                pool.touch(hits)
                st.blocks = hits
                st.num_cached_blocks = len(hits)
                st.num_computed = computed
            ok = self._allocate(st, num_new)
            assert ok, "the full-sequence check admitted a request whose chunk does not fit"
            queue.popleft()
            running.append(st)
            scheduled.append((st, num_new))
            budget -= num_new
        if skipped:
            waiting.extendleft(reversed(skipped))
        return budget

    def _head_admissible(self) -> bool:
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return False
        st = self.waiting[0]
        if st.num_computed == 0:
            need = self._hit_need(st)[1]
        else:
            need = self._admission_blocks(st, NO_BLOCKS)
        free: int = self.pool.get_num_free_blocks()
        return need <= free

    def _step(self, next_arrival: float | None) -> None:
        """One exact engine step."""
        self._load_seen_seconds = self.now  # this step starts now
        cfg = self.config
        scheduled: list[tuple[RequestState, int]] = []
        self.last_preempted = []
        budget, preempted, in_flight = self._schedule_running(scheduled)
        running = self.running
        bs = self.block_size
        pool = self.pool
        if not preempted:
            budget = self._admit(budget, scheduled)
        if self.offload is not None:
            self._cpu_store_step(scheduled)

        self.last_scheduled = scheduled
        self.last_blocks_in_use = self._usable_blocks - pool.get_num_free_blocks()
        finishing = cfg.async_scheduling and any(
            st.generated >= st.output_tokens for st in running)
        if finishing:
            # Async: the previous step's output is processed now; its finished requests
            # leave (finish time: the end of that step, which is ``now``).
            self._finish_done()
            running = self.running  # _finish_done made a new list
        self._last_step_empty = not scheduled
        if not scheduled:
            if finishing or in_flight:
                # An empty batch: the finished requests left, or the step in flight is
                # processed now (its blocks can be freed): schedule again.
                return
            # Nothing fits and nothing runs: wait for the next arrival or load (cannot happen
            # otherwise with the rejections in __init__, but never spin).
            self._idle(next_arrival)
            return

        dt = self._charge(scheduled)
        any_done = self._compute(scheduled, self.steps)
        alloc = 0
        used = 0
        for st in running:
            alloc += len(st.blocks)
            used += st.num_computed
        self._sample(dt, alloc * bs - used, alloc * bs)
        if any_done and not cfg.async_scheduling:
            self._finish_done()

    def _schedule_running(self, scheduled: list[tuple[RequestState, int]]
                          ) -> tuple[int, bool, bool]:
        """The running requests' tokens in running order (appended to ``scheduled``),
        preempting the newest while a request's new slots do not fit. Returns the budget
        left, whether anyone was preempted, and whether a victim could not be preempted
        (``_defer_frees``: its step is in flight)."""
        budget = self.config.max_num_batched_tokens
        preempted = False
        in_flight = False
        running = self.running
        i = 0
        bs = self.block_size
        while i < len(running) and budget > 0:
            st = running[i]
            if st.generated >= st.output_tokens:
                # Async: it finished in the step before; freed once this step is scheduled.
                i += 1
                continue
            num_new = st.num_tokens - st.num_computed
            if num_new == 1 and (st.num_tokens - 1) % bs and st.num_tokens % bs:
                # A decode token inside its last block that does not fill it: no new block,
                # nothing to cache. (A token that fills the block must go through _allocate:
                # vLLM caches the block now, which matters if the request is preempted or
                # finishes before its next block.)
                scheduled.append((st, 1))
                budget -= 1
                i += 1
                continue
            if num_new > budget:
                num_new = budget
            self_preempted = False
            while not self._allocate(st, num_new):
                if (self._defer_frees and running[-1].sched_step == self.steps
                        and not self._last_step_empty):
                    # The victim's blocks may still be written by the step in flight
                    # (its output is not processed yet): vLLM does not preempt it, and
                    # schedules no more running requests.
                    self_preempted = in_flight = True
                    break
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
        return budget, preempted, in_flight
