"""The cohort step: one engine step in which the decoding cohort's members (``cohort.py``)
advance together by one clock and only the other running requests are scheduled one by one,
as the exact step would. A step that could preempt, or whose token budget would cut a member
off, is left to the exact step (nothing changed)."""

from __future__ import annotations

import numpy as np

from kvtune.tuner.simulator.sched_exact import ExactScheduler
from kvtune.tuner.simulator.sched_state import NO_BLOCKS, RequestState


class CohortScheduler(ExactScheduler):
    """Joining and leaving the cohort, and the cohort step."""

    def _joins(self, st: RequestState) -> bool:
        """Whether ``st`` decodes steadily from the next step on (cohort.py): it sampled in
        the step just taken, is not done, and has no shareable block left to cache."""
        return (st.last_sample_step == self.steps and st.generated < st.output_tokens
                and st.num_computed == st.num_tokens - 1
                and st.num_cached_blocks >= len(st.hashes)
                and (self.offload is None or self._cpu_stored(st)))

    def _regroup(self) -> None:
        cohort = self.cohort
        active: list[RequestState] = []
        for st in self.running:
            if self._joins(st):
                cohort.join(st)
            else:
                active.append(st)
        self._active = active

    def _leave_done(self, done: list[RequestState]) -> None:
        """Members that sampled their last token leave the cohort; synchronous scheduling
        frees them now, async once the next step is scheduled (``_step``'s doc)."""
        for st in done:
            self.cohort.leave(st)
        active = self._active
        # Running order without a pass over all of running: positions of the few.
        order = self.running.index
        if not self.config.async_scheduling:
            # Every request done in the step (members and others), in running order.
            self._finish_done(sorted(
                [*done, *(st for st in active if st.generated >= st.output_tokens)],
                key=order))
            self._active = [st for st in active if st.generated < st.output_tokens]
        else:
            self._active = sorted([*active, *done], key=order)

    def _cohort_step(self, next_arrival: float | None) -> bool:
        """One engine step with the cohort's members decoding and the other running
        requests (``_active``) scheduled as ``_step`` does; False (nothing changed) when the
        step could preempt or the token budget would cut a member off."""
        planned = self._plan_active()
        if planned is None:
            return False
        plan, more_blocks, member_blocks, need, taken = planned
        if need > self.pool.get_num_free_blocks():
            return False  # someone may be preempted: the exact step decides
        fresh = self._take_planned(plan, more_blocks, member_blocks, need)
        finishing = self._schedule_beside_cohort(plan, taken)
        if not plan and not self.cohort.size:
            if finishing:
                return True  # an empty batch: the finished requests left, schedule again
            self._idle(next_arrival)
            return True
        self._compute_beside_cohort(plan, fresh)
        return True

    def _plan_active(
        self,
    ) -> tuple[list[tuple[RequestState, int]], list[int], int, int, int] | None:
        """The tokens of the running requests outside the cohort (``_active``), in running
        order, with the members' one token each placed by their running positions: the plan,
        each planned request's new blocks, the members' new blocks, all new blocks, and the
        planned tokens. None where the budget would cut a member off."""
        running = self.running
        active = self._active
        budget = self.config.max_num_batched_tokens
        members = self.cohort.size
        bs = self.block_size
        plan: list[tuple[RequestState, int]] = []
        more_blocks: list[int] = []  # per planned request, the new blocks it needs
        member_blocks = self.cohort.blocks_needed_now()
        need = member_blocks
        taken = 0  # tokens of active requests
        cut = False
        for i, st in enumerate(active):
            if st.generated >= st.output_tokens:
                continue  # async: it finished in the step before
            rem = st.num_tokens - st.num_computed
            # Members before it; only looked up when they could cut its chunk (otherwise
            # it gets all it asks for, whatever they take).
            ahead = running.index(st) - i if members and budget - members - taken < rem else 0
            left = budget - ahead - taken
            if left <= 0:
                if left < 0 or members > ahead:
                    return None  # a member would get no token
                cut = True
                break
            num_new = rem if rem <= left else left
            more = -(-(st.num_computed + num_new) // bs) - len(st.blocks)
            if more > 0:
                need += more
            else:
                more = 0
            plan.append((st, num_new))
            more_blocks.append(more)
            taken += num_new
            if num_new < rem:
                if members > ahead:
                    return None
                cut = True
                break
        if not cut and taken + members > budget:
            return None
        return plan, more_blocks, member_blocks, need, taken

    def _take_planned(self, plan: list[tuple[RequestState, int]], more_blocks: list[int],
                      member_blocks: int, need: int) -> np.ndarray:
        """Allocation (``_allocate`` for each): the same blocks from the front of the free
        queue as request by request, in one call (nothing is freed or touched before the
        admissions); members' first. Returns the members' new blocks."""
        if need:
            got = self.pool.get_new_blocks(need)
            fresh = got[:member_blocks]
            at = member_blocks
            for (st, num_new), more in zip(plan, more_blocks, strict=True):
                if more:
                    st.add_blocks(got[at:at + more])
                    at += more
                self._cache(st, st.num_computed + num_new)
            return fresh
        for st, num_new in plan:
            self._cache(st, st.num_computed + num_new)
        return NO_BLOCKS

    def _schedule_beside_cohort(self, plan: list[tuple[RequestState, int]], taken: int) -> bool:
        """The rest of the schedule once the running requests are planned: admissions with
        the budget left (appended to ``plan`` and ``_active``), the CPU tier's stores, and
        (async) the requests the previous step finished leave. Whether any did."""
        cfg = self.config
        members = self.cohort.size
        active = self._active
        budget = cfg.max_num_batched_tokens - (taken + members)
        num_planned = len(plan)
        if self.offload is not None:
            self._load_seen_seconds = self.now  # this step starts now
        if budget > 0:
            budget = self._admit(budget, plan)
            for st, _ in plan[num_planned:]:
                active.append(st)
        if self.offload is not None:
            # Members store nothing (``_joins``): the schedule's stores are the plan's.
            self._cpu_store_step(plan)
            self._last_step_empty = not plan and not members
        # Async: the previous step's output finishes requests now. Members never are done
        # (they leave at their last token), so the done ones are all in ``active``.
        finished = ([st for st in active if st.generated >= st.output_tokens]
                    if cfg.async_scheduling else None)
        if finished:
            self._finish_done(finished)
            self._active = [st for st in active if st.generated < st.output_tokens]
            return True
        return False

    def _compute_beside_cohort(self, plan: list[tuple[RequestState, int]],
                               fresh: np.ndarray) -> None:
        """The step's time and tokens: the members advance one token on their new blocks
        ``fresh``, the planned requests compute theirs; then the done leave and the steady
        decoders among the planned join the cohort."""
        cohort = self.cohort
        members = cohort.size
        active = self._active
        bs = self.block_size
        context = cohort.context_tokens()
        # A member decodes one token over its context: num_computed + 1 pairs, its token count.
        dt = self._charge(plan, num_tokens=members, kv_read=context, pairs=float(context))
        step = self.steps
        done = cohort.advance(1, fresh, step) if members else []
        any_done = self._compute(plan, step)
        alloc = cohort.blocks_held
        used = cohort.computed_tokens()
        for st in active:
            alloc += len(st.blocks)
            used += st.num_computed
        self._sample(dt, alloc * bs - used, alloc * bs)
        if done:
            self._leave_done(done)  # with the others done in this step, in running order
            active = self._active
        elif any_done and not self.config.async_scheduling:
            self._finish_done([st for st in active if st.generated >= st.output_tokens])
            active = self._active = [st for st in active if st.generated < st.output_tokens]
        joined = False
        for st, _ in plan:
            if st.last_sample_step == step and self._joins(st):
                cohort.join(st)
                joined = True
        if joined:
            self._active = [st for st in active if st.cohort_tick < 0]
