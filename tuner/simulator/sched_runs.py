"""Runs: many engine steps taken at once where they are all alike. A decode run takes ``k``
identical decode steps of the cohort in closed form; a prefill run takes the steps in which
the cohort decodes and one request prefills a chunk that leaves part of its prompt. Either
stops before anything that would make a step differ (a finish, an arrival, a load, the free
blocks running out) and declines (nothing changed) where fewer steps than it needs remain."""

from __future__ import annotations

import numpy as np

from kvtune.tuner.simulator.sched_cohort import CohortScheduler
from kvtune.tuner.simulator.sched_state import NO_BLOCKS, RequestState
from kvtune.tuner.simulator.timing import RunLines

# A prefill run's step: (members' new blocks, the chunk's new blocks, seconds, end time,
# fragmented slots, allocated slots, KV usage).
PrefillStep = tuple[int, int, float, float, int, int, float]


class RunScheduler(CohortScheduler):
    """Decode runs and prefill runs."""

    def _cohort_run(self, next_arrival: float | None) -> bool:
        """Take k identical decode steps at once, if every running request is a member of
        the cohort and the state allows; False if not (nothing changed).

        Async scheduling: requests that sampled their last token in the step before
        (``_active``, nothing else) are freed once the next step is scheduled. With nobody
        waiting, that step is a decode step of the members like the rest of the run, so
        the run takes it too: its blocks are taken before the frees, as that step's, and
        the other steps' blocks after them. The frees change nothing else the run reads
        (arrivals are cut by time; the block bound is checked on the blocks after them)."""
        cohort = self.cohort
        n = cohort.size
        if not n or n > self.config.max_num_batched_tokens:
            return False  # nobody is decoding, or not every member gets its token
        retiring = self._active
        if retiring and (self.loading or self.horizon_seconds is not None
                         or not self.config.async_scheduling
                         or any(st.generated < st.output_tokens for st in retiring)):
            return False  # someone is not decoding
        if retiring and self.waiting:
            return self._finish_step(retiring)  # the frees could admit someone
        k = cohort.steps_to_next_finish()
        if k <= 1 or (self.waiting and self._head_admissible()):
            return False
        pool = self.pool
        # The run's time lines, shared by every length this run considers.
        lines = self.cost.run_lines(n, cohort.context_tokens())
        k = self._run_time_bound(lines, k, next_arrival)
        first = NO_BLOCKS  # the first step's blocks, taken before the frees
        if retiring:
            need_first = cohort.blocks_needed_now()
            if need_first > pool.get_num_free_blocks():
                return False  # the exact step decides (and any preemption)
            if need_first:
                first = pool.get_new_blocks(need_first)
            self._finish_done(retiring)
            self._active = []
            floor = 1  # that step is taken: the run is at least it
        else:
            floor = 2
        k = self._run_block_bound(k, pool.get_num_free_blocks() + len(first), floor)
        if k < floor:
            return False  # the exact step handles it (and any preemption)
        self._take_decode_run(lines, k, first)
        return True

    def _finish_step(self, retiring: list[RequestState]) -> bool:
        """The step after members sampled their last token (``retiring``, all of
        ``_active``; async, with requests waiting) where the head of the queue cannot be
        admitted: ``_cohort_step``'s figures in its order without its plan (the members'
        blocks, the failed admission, the frees, the members' token). On overloaded traffic
        every finish is such a step. False (nothing changed) where it is not one."""
        cohort = self.cohort
        pool = self.pool
        if self.offload is not None or cohort.steps_to_next_finish() <= 1:
            return False  # the CPU tier stores and loads; a member would finish
        if self._head_admissible():
            return False
        need = cohort.blocks_needed_now()
        if need > pool.get_num_free_blocks():
            return False  # someone may be preempted: the exact step decides
        fresh = pool.get_new_blocks(need) if need else NO_BLOCKS
        # The admission fails: fewer blocks are free now than when the head was checked,
        # and a hit the members' blocks evicted only adds to its need.
        self._finish_done(retiring)
        self._active = []
        members = cohort.size
        context = cohort.context_tokens()
        dt = self._charge([], num_tokens=members, kv_read=context, pairs=float(context))
        cohort.advance(1, fresh, self.steps)
        bs = self.block_size
        self._sample(dt, cohort.blocks_held * bs - cohort.computed_tokens(),
                     cohort.blocks_held * bs)
        return True

    def _run_time_bound(self, lines: RunLines, k: int, next_arrival: float | None) -> int:
        """``k`` cut to the steps that end before the next arrival could be admitted, a load
        arrives, or the step-wise horizon."""
        cost = self.cost
        overlapped = self.config.async_scheduling
        now = self.now
        # Each bound compares the steps' end times with the event's time (``steps_to_reach``).
        if (next_arrival is not None and not self.waiting
                and self.cohort.size < self.config.max_num_seqs):
            k = min(k, cost.steps_to_reach(lines, next_arrival, k, overlapped, now))
        if self.loading:
            # A load that arrives is scheduled in the next step: stop there.
            k = min(k, cost.steps_to_reach(
                lines, self.loading[0].load_ready_seconds, k, overlapped, now))
        if self.horizon_seconds is not None:
            k = min(k, cost.steps_to_reach(lines, self.horizon_seconds, k, overlapped, now))
        return k

    def _run_block_bound(self, k: int, free: int, floor: int) -> int:
        """The most steps, up to ``k``, whose new blocks fit in ``free`` (``floor - 1`` when
        fewer than ``floor`` do)."""
        cohort = self.cohort
        # Cheap bound first: k steps add at most ceil(k / bs) blocks to each sequence.
        if cohort.size * -(-k // self.block_size) > free and cohort.new_blocks_for(k) > free:
            lo, hi = floor - 1, k  # fits(lo), not fits(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if cohort.new_blocks_for(mid) <= free:
                    lo = mid
                else:
                    hi = mid
            k = lo
        return k

    def _take_decode_run(self, lines: RunLines, k: int, first: np.ndarray) -> None:
        """The run's ``k`` steps taken: its time, its blocks (``first``: the first step's,
        taken already) and the sample; members that reach their last token leave."""
        cohort = self.cohort
        cost = self.cost
        pool = self.pool
        overlapped = self.config.async_scheduling
        dt = cost.run_seconds(lines, k, overlapped)
        if self.offload is not None:
            # Async: the transfers done by the start of the run's last step are seen next.
            self._load_seen_seconds = self.now + (
                cost.run_seconds(lines, k - 1, overlapped) if k > 1 else 0.0)
        need = cohort.new_blocks_for(k) - len(first)
        if need:
            rest = pool.get_new_blocks(need)
            fresh = np.concatenate((first, rest)) if len(first) else rest
        else:
            fresh = first
        self.now += dt
        self.steps += k
        if self._defer_frees:
            for st in self.running:
                st.sched_step = self.steps
        done = cohort.advance(k, fresh, self.steps)
        bs = self.block_size
        self._sample(dt, cohort.blocks_held * bs - cohort.computed_tokens(),
                     cohort.blocks_held * bs)
        if done:
            self._leave_done(done)

    def _prefill_run(self, next_arrival: float | None) -> bool:
        """Take at once the next steps that are all alike: the cohort's members decode and
        one request, running after all of them, prefills a chunk of the budget that leaves
        part of its prompt, so nothing samples, finishes, is admitted (the chunk takes the
        rest of the budget) or freed. Each step is ``_cohort_step``'s, figured in scalars
        (time, blocks, the sample); then the blocks of every step are taken in one call, in
        the order the steps would take them (each step's members' blocks, then the
        chunk's), and the chunks' full blocks are cached in one call: with nothing freed
        or looked up in between, the same blocks hold the same keys (an older copy of a key
        that a step evicts is evicted before the new copy is cached, either way). Stops
        before a step the next arrival (it would join the waiting queue the step samples),
        a member's last token or the free blocks would change. False if fewer than two
        such steps (nothing changed)."""
        active = self._active
        if len(active) != 1 or self.horizon_seconds is not None or self.loading:
            # (Step-wise replay reports every step's tokens, and a load in flight is seen
            # by the step after the one it is done in: steps one at a time there.)
            return False
        st = active[0]
        cohort = self.cohort
        members = cohort.size
        chunk = self.config.max_num_batched_tokens - members
        rem = st.num_tokens - st.num_computed
        if chunk <= 0 or rem <= 2 * chunk or st.generated >= st.output_tokens:
            return False
        if members and self.running[-1] is not st:
            return False  # members after it would be cut off: the exact step decides
        k = (rem - 1) // chunk  # the steps whose chunk leaves part of the prompt
        if members:
            k = min(k, cohort.steps_to_next_finish() - 1)
        if k < 2:
            return False
        steps, taken, computed = self._prefill_steps(st, chunk, k, next_arrival)
        if len(steps) < 2:
            return False
        self._take_prefill_run(st, steps, taken, computed)
        return True

    def _prefill_steps(self, st: RequestState, chunk: int, k: int,
                       next_arrival: float | None) -> tuple[list[PrefillStep], int, int]:
        """Up to ``k`` steps of a prefill run in scalars (``_cohort_step``'s figures): per
        step, the members' new blocks, the chunk's new blocks, its seconds, its end time, the
        fragmented and allocated slots and the KV usage; with the blocks of them all and
        ``st``'s computed tokens after them."""
        cohort = self.cohort
        members = cohort.size
        bs = self.block_size
        pool = self.pool
        free = pool.get_num_free_blocks()
        usable = pool.num_gpu_blocks - 1
        overlapped = self.config.async_scheduling
        cost = self.cost
        tick, context = cohort.tick, cohort.context_tokens()
        held = cohort.blocks_held
        computed = st.num_computed
        num_blocks = len(st.blocks)
        now = self.now
        taken = 0
        steps: list[PrefillStep] = []
        for j in range(k):
            if j and next_arrival is not None and now >= next_arrival:
                break
            m = cohort.blocks_needed_at(tick + j)
            b = -(-(computed + chunk) // bs) - num_blocks
            if b < 0:
                b = 0
            if taken + m + b > free:
                break  # someone may be preempted: the exact step decides
            # ``_charge`` with the members' terms, then the chunk's.
            num_tokens = members
            kv_read = context
            pairs = float(context)
            num_tokens += chunk
            kv_read += computed + chunk
            pairs += chunk * computed + chunk * (chunk + 1) / 2.0
            dt = cost.step_seconds(num_tokens, kv_read, pairs, overlapped, members + 1)
            now += dt
            taken += m + b
            held += m
            num_blocks += b
            computed += chunk
            context += members
            alloc = held + num_blocks
            used = context - members + computed
            steps.append((m, b, dt, now, alloc * bs - used, alloc * bs,
                          1.0 - (free - taken) / usable))
        return steps, taken, computed

    def _take_prefill_run(self, st: RequestState, steps: list[PrefillStep], taken: int,
                          computed: int) -> None:
        """The run's steps taken: their ``taken`` blocks in one call, split in the order the
        steps would take them, the samples, the members' tokens and ``st``'s ``computed``
        tokens with its full blocks cached."""
        cohort = self.cohort
        members = cohort.size
        got = self.pool.get_new_blocks(taken) if taken else NO_BLOCKS
        theirs: list[np.ndarray] = []
        mine: list[np.ndarray] = []
        at = 0
        for m, b, *_ in steps:
            if m:
                theirs.append(got[at:at + m])
                at += m
            if b:
                mine.append(got[at:at + b])
                at += b
        if mine:
            st.add_blocks(np.concatenate(mine) if len(mine) > 1 else mine[0])
        for _, _, dt, end, fragmented, allocated, usage in steps:
            self.now = end
            self.steps += 1
            self._sample(dt, fragmented, allocated, usage)
        if members:
            fresh = (np.concatenate(theirs) if len(theirs) > 1 else theirs[0]) if theirs \
                else NO_BLOCKS
            done = cohort.advance(len(steps), fresh, self.steps)
            assert not done, "a member finished inside a prefill run"
        self._cache(st, computed)
        st.num_computed = computed
