"""The scheduler's side of KV offload to CPU (``offload.py``): a request's prompt blocks
stored in the CPU tier, an admission that loads its prefix from there, and the reservations
vLLM keeps for in-flight prefills while it does. With offload off none of this runs."""

from __future__ import annotations

import numpy as np

from kvtune.tuner.simulator.offload import CPUTier, RequestOffload
from kvtune.tuner.simulator.sched_core import SchedulerCore
from kvtune.tuner.simulator.sched_state import (
    LOAD_BLOCKED,
    LOAD_DEFER,
    LOAD_NONE,
    LOAD_STARTED,
    RequestState,
)


class OffloadScheduler(SchedulerCore):
    """The CPU tier's schedule: loads at admission, stores at every schedule."""

    def _cpu_req(self, st: RequestState) -> RequestOffload:
        rid = st.req.request_id
        req = self._cpu.get(rid)
        if req is None:
            # Its prompt's full blocks' keys: a prefix of its own keys where those reach
            # that far (the same keys: a key space numbers a prefix once).
            num_full = st.req.prompt_tokens // self.block_size
            keys = (st.hashes[:num_full] if len(st.hashes) >= num_full
                    else self.keyspace.key_array(st.req.segments, st.req.prompt_tokens))
            req = self._cpu[rid] = RequestOffload(keys)
        return req

    def _reserved_blocks(self, scheduled: list[tuple[RequestState, int]]) -> int:
        """Blocks vLLM keeps free for in-flight prefills when it admits a load
        (``_inflight_prefill_reserved_blocks``): what the loading requests, the loaded ones
        not yet scheduled and the running ones still prefilling need to hold their whole
        sequence."""
        bs = self.block_size
        now = {id(st): n for st, n in scheduled}
        busy = [*self.loading, *self.loaded]
        for st in self.running:
            n = now.get(id(st))
            if st.num_computed + n < st.num_tokens if n is not None else st.prefilling:
                busy.append(st)
        return sum(max(0, -(-st.num_tokens // bs) - len(st.blocks)) for st in busy)

    def _load_from_cpu(self, st: RequestState, hits: np.ndarray,
                       scheduled: list[tuple[RequestState, int]]) -> str:
        """Where the CPU tier holds the blocks after the GPU hit ``hits``: allocate them,
        queue their load and move ``st`` to ``loading`` (``LOAD_STARTED``). No CPU hit:
        ``LOAD_NONE`` (admitted as without offload). A chunk still being written or
        loaded, or a transfer of its own in flight: ``LOAD_DEFER`` (vLLM skips it this
        step). The sequence does not fit, or its loaded blocks do not fit beside the other
        in-flight prefills' reservations: ``LOAD_BLOCKED`` (admission stops, as vLLM's
        ``allocate_slots`` with ``reserved_blocks``)."""
        tier = self.offload
        assert tier is not None
        req = self._cpu_req(st)
        req.next_chunk = 0  # a fresh admission offers its blocks from the first
        if req.jobs:
            return LOAD_DEFER
        bs = self.block_size
        start = len(hits)
        end = min(len(st.hashes), st.num_tokens // bs)
        cpu = tier.lookup(st.hashes, start, end)
        if cpu is None:
            return LOAD_DEFER
        if not cpu:
            return LOAD_NONE
        free = self.pool.get_num_free_blocks()
        if (self._admission_blocks(st, hits) > free
                or cpu + self.pool.num_free_among(hits) + self._reserved_blocks(scheduled)
                > free):
            return LOAD_BLOCKED
        computed = (start + cpu) * bs
        self._count_admission(st, computed, start * bs)
        self.cpu_hit_tokens += cpu * bs
        self.pool.touch(hits)
        st.blocks = np.concatenate((hits, self.pool.get_new_blocks(cpu)))
        st.num_cached_blocks = start  # the loaded blocks are cached once they arrive
        st.num_computed = computed
        keys = st.hashes[start:start + cpu]
        st.load_ready_seconds = tier.load(req, keys, start, bs, self.now)
        req.next_chunk = start + cpu  # a load's blocks are not offered for storing
        self.cpu_loads.append((st.req.request_id, cpu))
        self.loading.append(st)
        return LOAD_STARTED

    def _loads_arrived(self, seen_seconds: float) -> None:
        """Requests whose load was done by ``seen_seconds`` go to the front of the waiting
        queue, in the order they were admitted, with their loaded blocks cached (vLLM's
        ``_update_waiting_for_remote_kv``; a full hit recomputes its last token)."""
        loading = self.loading
        done = 0
        while done < len(loading) and loading[done].load_ready_seconds <= seen_seconds:
            done += 1
        if not done:
            return
        arrived = loading[:done]
        del loading[:done]
        for st in arrived:
            self._cache(st, st.num_computed)
            if st.num_computed >= st.num_tokens:
                st.num_computed = st.num_tokens - 1
            st.load_ready_seconds = float("nan")
        self.loaded.extend(arrived)

    def _cpu_store_step(self, scheduled: list[tuple[RequestState, int]]) -> None:
        """The schedule's stores (vLLM's ``_build_store_jobs``): each scheduled request's
        prompt blocks its tokens complete, then those left of the requests retired since the
        last schedule, whose chunks then become the most recent (``on_request_finished``)."""
        tier = self.offload
        assert tier is not None
        bs = self.block_size
        for st, num_new in scheduled:
            self._cpu_offer(tier, self._cpu_req(st),
                            min(st.num_computed + num_new, st.req.prompt_tokens) // bs, bs)
        retired = self._cpu_retired
        if retired:
            self._cpu_retired = []
            reqs = [self._cpu_req(st) for st in retired]
            for st, req in zip(retired, reqs, strict=True):
                self._cpu_offer(tier, req, st.req.prompt_tokens // bs, bs)
            for st, req in zip(retired, reqs, strict=True):
                tier.finish(req)
                del self._cpu[st.req.request_id]  # its transfers hold what they need

    @staticmethod
    def _cpu_offer(tier: CPUTier, req: RequestOffload, num_chunks: int, bs: int) -> None:
        num_chunks = min(num_chunks, len(req.keys))
        first = req.next_chunk
        if num_chunks > first:
            tier.store(req, req.keys[first:num_chunks], first, bs)

    def _cpu_stored(self, st: RequestState) -> bool:
        """Whether the CPU tier took every prompt chunk ``st`` offers (a store dropped for
        want of room is offered again at every schedule: not a steady decoder)."""
        req = self._cpu.get(st.req.request_id)
        return req is not None and req.next_chunk >= min(
            st.req.prompt_tokens // self.block_size, len(req.keys))
