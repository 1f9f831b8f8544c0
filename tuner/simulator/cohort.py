"""The decoding cohort: running requests that gain one token every step, advanced by one clock.

Most running requests in most engine steps are decoding: each gets one token, computes it,
samples the next. Stepping them one Python object at a time made the simulator's cost per
step grow with the batch (a multi-turn trace keeps ~50 requests running, an overloaded
short-prompt one ~350). A request that decodes steadily is instead a *member* of the
cohort: it records, when it joins, its token count, generated count and the cohort's tick
(steps the cohort has taken). While it is a member its state is a function of the tick:

    num_tokens = tokens_at_join + (tick - tick_at_join), num_computed = num_tokens - 1,
    generated = generated_at_join + (tick - tick_at_join)

so a step costs the cohort O(1): the sum of the members' tokens (what the step time reads)
is ``base + size * tick``; the members that start a new block this step are those of one
*phase* (a member needs a block when its new token is the first of a block, every
``block_size`` ticks, at a tick fixed by its join values), counted per phase; the members
that finish are listed by the tick they finish at.

New blocks: the blocks a step hands to members are taken from the free queue at once (the
same blocks, from the front, as one call per member: nothing is freed or looked up in
between) and kept in a *stash*; a member takes what it is owed from the stash only when
its block table is read (``sync``). Which fresh block a member gets does not change any
result: the stashed blocks all hold no hash and one reference, so any assignment is a
relabelling of block ids (the same argument as for the decode runs in ``scheduler``).

Why membership needs no more care: a member's prefix-cache work is nil (its full blocks
past the shareable prefix are marked when freed, ``BlockPool.free_request_blocks``), so
``num_cached_blocks`` is ``num_computed // block_size`` (the scheduler admits only requests
whose shareable blocks are all cached), and under async scheduling a member sampled in
every step since it joined (``tail_unprocessed``, ``last_sample_step``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvtune.tuner.simulator.sched_state import RequestState


class DecodeCohort:
    """The members, their clock, and what a step of them needs (see the module doc)."""

    __slots__ = ("_base", "_block_size", "_finish_at", "_finish_ticks", "_phase", "_stash",
                 "blocks_held", "last_step", "members", "tick")

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self.tick = 0
        # The engine step of the cohort's last tick (a member's last_sample_step).
        self.last_step = 0
        # id(state) -> state, in join order (iteration order is deterministic).
        self.members: dict[int, RequestState] = {}
        self._base = 0  # sum over members of (tokens at join - tick at join)
        self._phase: dict[int, int] = {}  # tick % block_size -> members needing a block then
        self._finish_at: dict[int, list[RequestState]] = {}
        self._finish_ticks: list[int] = []  # heap of the keys of _finish_at
        self._stash: list[int] = []  # fresh blocks owed to members
        self.blocks_held = 0  # members' blocks, in their tables or owed from the stash

    @property
    def size(self) -> int:
        return len(self.members)

    def context_tokens(self) -> int:
        """The members' tokens now (each reads that many KV tokens in its next step)."""
        return self._base + len(self.members) * self.tick

    def computed_tokens(self) -> int:
        return self.context_tokens() - len(self.members)

    def blocks_needed_now(self) -> int:
        """Members whose next token starts a new block."""
        return self.blocks_needed_at(self.tick)

    def blocks_needed_at(self, tick: int) -> int:
        """Members whose token at cohort tick ``tick`` (now or later) starts a new block."""
        return self._phase.get(tick % self._block_size, 0)

    def new_blocks_for(self, num_steps: int) -> int:
        """New blocks the members need over the next ``num_steps`` steps."""
        if num_steps <= 0:
            return 0
        bs = self._block_size
        total = 0
        for phase, count in self._phase.items():
            first = (phase - self.tick) % bs  # the first of the next steps in this phase
            if first < num_steps:
                total += count * ((num_steps - 1 - first) // bs + 1)
        return total

    def steps_to_next_finish(self) -> int:
        """Steps until the first member samples its last token (a large number if none)."""
        ticks, at = self._finish_ticks, self._finish_at
        while ticks and ticks[0] not in at:
            heapq.heappop(ticks)
        return ticks[0] - self.tick if ticks else 1 << 62

    def join(self, st: RequestState) -> None:
        """``st`` just sampled a token and decodes from the next step on."""
        tick = self.tick
        st.cohort_tick = tick
        st.cohort_tokens = st.num_tokens
        st.cohort_generated = st.generated
        self.members[id(st)] = st
        self._base += st.num_tokens - tick
        phase = (tick - st.num_tokens + 1) % self._block_size
        self._phase[phase] = self._phase.get(phase, 0) + 1
        done = tick + st.output_tokens - st.generated
        at = self._finish_at.get(done)
        if at is None:
            self._finish_at[done] = [st]
            heapq.heappush(self._finish_ticks, done)
        else:
            at.append(st)
        self.blocks_held += len(st.blocks)

    def advance(self, num_steps: int, new_blocks: np.ndarray, last_step: int
                ) -> list[RequestState]:
        """The members took ``num_steps`` steps, ending at engine step ``last_step``;
        ``new_blocks`` (``new_blocks_for(num_steps)`` of them) are theirs. Returns the
        members whose last token was sampled in the last of those steps, still members."""
        self.tick += num_steps
        self.last_step = last_step
        if len(new_blocks):
            self._stash.extend(new_blocks.tolist())
            self.blocks_held += len(new_blocks)
        return list(self._finish_at.get(self.tick, ()))

    def sync(self, st: RequestState) -> None:
        """Write a member's state into its fields (it stays a member)."""
        steps = self.tick - st.cohort_tick
        if steps <= 0:
            return
        bs = self._block_size
        tokens = st.cohort_tokens + steps
        st.num_tokens = tokens
        st.num_computed = tokens - 1
        st.generated = st.cohort_generated + steps
        st.num_cached_blocks = (tokens - 1) // bs
        st.tail_unprocessed = True
        st.last_sample_step = self.last_step
        st.sched_step = self.last_step  # scheduled in every step since it joined
        owed = -(-(tokens - 1) // bs) - len(st.blocks)
        if owed > 0:
            stash = self._stash
            got = np.asarray(stash[len(stash) - owed:], dtype=np.int64)
            del stash[len(stash) - owed:]
            st.add_blocks(got)
        st.cohort_tick = self.tick
        st.cohort_tokens = tokens
        st.cohort_generated = st.generated

    def sync_all(self) -> None:
        for st in self.members.values():
            self.sync(st)

    def leave(self, st: RequestState) -> None:
        """``st`` stops being a member (synced first); it must be one."""
        self.sync(st)
        del self.members[id(st)]
        self._base -= st.num_tokens - self.tick
        phase = (self.tick - st.num_tokens + 1) % self._block_size
        left = self._phase[phase] - 1
        if left:
            self._phase[phase] = left
        else:
            del self._phase[phase]
        done = self.tick + st.output_tokens - st.generated
        at = self._finish_at[done]
        at.remove(st)
        if not at:
            del self._finish_at[done]
        self.blocks_held -= len(st.blocks)
        st.cohort_tick = -1

    def leave_all(self) -> None:
        """Every member leaves (synced): the exact step takes over."""
        self.sync_all()
        for st in self.members.values():
            st.cohort_tick = -1
        assert not self._stash, "the cohort holds blocks no member is owed"
        self.members.clear()
        self._base = 0
        self._phase.clear()
        self._finish_at.clear()
        self._finish_ticks.clear()
        self.blocks_held = 0
