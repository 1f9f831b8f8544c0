"""The CPU KV tier of ``--kv-offloading-size`` as vLLM 0.33.0's native offloading runs it.

vLLM (``vllm/config/vllm.py`` ``_post_init_kv_transfer_config``) turns the flag into the
``OffloadingConnector`` with ``cpu_bytes_to_use`` = the size in GiB (across TP ranks). The
simulator follows its scheduler side (``offloading/scheduler.py``), the CPU manager
(``kv_offload/cpu/manager.py``) and its LRU (``kv_offload/cpu/policies/lru.py``), and is
checked against them step by step (``tests/oracle/test_oracle_offload.py``):

- **Granularity** (``offloading/config.py``, ``kv_offload/cpu/spec.py``): one CPU chunk is
  one GPU block (``blocks_per_chunk`` defaults to 1) of every layer on every rank; the
  tier holds ``cpu_bytes // round_up(block bytes x ranks, page size)`` chunks. MLA with
  TP > 1 keeps one copy (``replicated_layout``).
- **What is stored, when** (``_build_store_jobs``): at every schedule, for each scheduled
  request, the full *prompt* blocks (``offload_prompt_only``) that the step's tokens
  complete, keyed by block hash; a fresh admission offers its GPU prefix hit's blocks too
  (those not on CPU are copied from the GPU), a load's blocks are not offered again.
  Chunks already stored are not written again. A store that needs evictions the tier cannot
  make (its chunks are being written or read) is dropped and offered again next step.
- **Write and read** (``CPUOffloadingWorker``): a stored chunk can be read once its write
  has finished and the worker has said so; a lookup meeting a chunk still being written,
  or being loaded for another request, defers the request (vLLM skips it this step). The
  worker starts a step's stores at the start of the *next* step, its loads at once; each
  direction is one queue over the host link (``gpus.json`` ``host_link_bytes_per_second``).
- **Eviction** (``LRUCachePolicy``): the least recent idle chunk goes first. A request has
  one rank, taken at its first store or load; its chunks rank by it, tail before head, and
  a chunk it reuses is raised to it. When the request finishes, every chunk it stored or
  reused becomes the most recent, head last (so a finished prompt's head outlives its
  tail). Chunks being written or read are never evicted.
- **Lookup** (``get_num_new_matched_tokens``): at admission, after the GPU prefix-cache
  hit, the consecutive stored chunks that follow it, up to the whole sequence (no "keep
  one token" cap; vLLM recomputes the last token of a full hit once the load is in).

Not modeled: contention of the copy kernels with the model's own HBM traffic; the order in
which vLLM refreshes requests that finish in the same step (a ``set``: here, running
order); a store of a finished request flushed early because its GPU blocks were reused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvtune.tuner.simulator import offload_lru as lru


def _keys(keys: Sequence[int] | np.ndarray) -> np.ndarray:
    return keys if isinstance(keys, np.ndarray) else np.asarray(keys, dtype=np.int64)


def _no_keys() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class RequestOffload:
    """One request's side of the tier (vLLM's ``RequestOffloadState`` and the manager's
    per-request access record)."""

    keys: np.ndarray  # its full prompt blocks' keys (int64; a list is converted)
    rank: int = 0  # 0: none yet
    next_chunk: int = 0  # the next prompt chunk to offer for storing
    jobs: int = 0  # transfers in flight (a deferred lookup while any is)
    # The chunks it stored or reused: ``seen[i]``, the key it met at prompt chunk i
    # (``offload_lru.NOT_SEEN``: none; the chunk's token position is (i + 1) x block size).
    seen: np.ndarray = field(default_factory=_no_keys)

    def __post_init__(self) -> None:
        self.keys = _keys(self.keys)
        self.seen = np.full(len(self.keys), lru.NOT_SEEN, dtype=np.int64)

    def seen_up_to(self, num_chunks: int) -> np.ndarray:
        """``seen``, with room for ``num_chunks`` chunks (a load may reach past the prompt
        of a request resumed after preemption)."""
        if num_chunks > len(self.seen):
            grown = np.full(max(num_chunks, 2 * len(self.seen)), lru.NOT_SEEN, np.int64)
            grown[:len(self.seen)] = self.seen
            self.seen = grown
        return self.seen


@dataclass(slots=True)
class _Transfer:
    done_seconds: float
    keys: np.ndarray
    request: RequestOffload
    is_store: bool


class CPUTier:
    """The chunks (``capacity_blocks``), their LRU, and the transfers over the host link.
    The chunk table and the LRU are arrays indexed by block key, worked on by compiled
    loops (``offload_lru``)."""

    __slots__ = ("_ctr", "_deferred", "_epoch", "_hk", "_hr", "_loading", "_loads",
                 "_mark", "_rank", "_size", "_state", "_stores", "capacity_blocks",
                 "evicted_blocks", "hit_blocks", "link_free_seconds", "loads",
                 "seconds_per_block", "store_free_seconds", "stored_blocks")

    def __init__(self, capacity_blocks: int, seconds_per_block: float) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks={capacity_blocks}: the CPU tier needs room "
                             "for one block")
        self.capacity_blocks = capacity_blocks
        self.seconds_per_block = seconds_per_block
        self._state = np.full(0, lru.ABSENT, dtype=np.int64)  # per key: offload_lru's doc
        self._rank = np.zeros(0, dtype=np.int64)
        self._loading = np.zeros(0, dtype=np.int64)  # per key: loads in flight bringing it
        self._mark = np.zeros(0, dtype=np.int64)  # eviction scratch
        self._epoch = 1
        self._size = 0  # chunks in the tier
        self._hr = np.zeros(1024, dtype=np.int64)  # the heap: ranks,
        self._hk = np.zeros(1024, dtype=np.int64)  # and keys
        self._ctr = np.zeros(3, dtype=np.int64)  # offload_lru's NEXT_RANK, HEAP_LEN, IDLE
        self._deferred: list[_Transfer] = []  # stores the next step starts
        # Transfers in flight, per direction: each is one queue over the host link, so each
        # list is in the order the transfers finish.
        self._stores: deque[_Transfer] = deque()
        self._loads: deque[_Transfer] = deque()
        self.link_free_seconds = 0.0  # when the host link finishes the loads queued on it
        self.store_free_seconds = 0.0  # the same, for stores (the other direction)
        self.stored_blocks = 0  # chunks written (new ones)
        self.hit_blocks = 0  # chunks loaded
        self.evicted_blocks = 0
        self.loads = 0

    @property
    def size(self) -> int:
        return self._size

    # -- the arrays -------------------------------------------------------------------------

    def _fit(self, keys: np.ndarray) -> None:
        """Room in the per-key arrays for ``keys`` (block keys are dense: the arrays grow
        with the key space), and in the heap for one push per key."""
        if len(keys):
            top = int(keys.max()) + 1
            if top > len(self._state):
                cap = max(top, 2 * len(self._state), 1024)
                old = len(self._state)
                self._state = np.concatenate(
                    (self._state, np.full(cap - old, lru.ABSENT, np.int64)))
                self._rank = np.concatenate((self._rank, np.zeros(cap - old, np.int64)))
                self._loading = np.concatenate((self._loading, np.zeros(cap - old, np.int64)))
                self._mark = np.concatenate((self._mark, np.zeros(cap - old, np.int64)))
        self._heap_room(len(keys))

    def _heap_room(self, pushes: int) -> None:
        n = int(self._ctr[lru.HEAP_LEN])
        if n > 2 * self._size + 1024:
            # Drop the stale entries (a re-ranked chunk leaves its old one behind).
            self._ctr[lru.HEAP_LEN] = n = lru.idle_heap(self._state, self._rank, self._hr,
                                                        self._hk)
        if n + pushes > len(self._hr):
            cap = max(n + pushes, 2 * len(self._hr))
            self._hr = np.concatenate((self._hr, np.zeros(cap - len(self._hr), np.int64)))
            self._hk = np.concatenate((self._hk, np.zeros(cap - len(self._hk), np.int64)))

    def _request_rank(self, req: RequestOffload) -> int:
        if not req.rank:
            self._ctr[lru.NEXT_RANK] += 1
            req.rank = int(self._ctr[lru.NEXT_RANK])
        return req.rank

    def _access_chunks(self, req: RequestOffload, keys: np.ndarray, chunks: np.ndarray,
                       block_size: int) -> None:
        """vLLM's ``on_request_access`` for ``keys`` at prompt chunks ``chunks``: chunks the
        request meets for the first time rise to its rank (never fall)."""
        seen = req.seen_up_to(int(chunks[-1]) + 1)
        req.rank = int(lru.access(keys, chunks, seen, req.rank, block_size, self._state,
                                  self._rank, self._hr, self._hk, self._ctr))

    def finish(self, req: RequestOffload) -> None:
        """The request finished: what it stored or reused becomes the most recent, tail
        first, head last (``on_request_finished``)."""
        self._heap_room(len(req.seen))
        lru.finish(req.seen, self._state, self._rank, self._hr, self._hk, self._ctr)

    def _evict(self, count: int, protected: np.ndarray) -> bool:
        """Evict ``count`` idle chunks, least recent first, none of ``protected``; False
        (nothing evicted) when there are not that many."""
        ok = bool(lru.evict(count, protected, self._state, self._rank, self._mark,
                            self._epoch, self._hr, self._hk, self._ctr))
        self._epoch += 2
        if ok:
            self._size -= count
            self.evicted_blocks += count
        return ok

    # -- what the scheduler asks -----------------------------------------------------------

    def lookup(self, keys: Sequence[int] | np.ndarray, start: int, end: int) -> int | None:
        """How many consecutive chunks from ``keys[start]`` (up to ``keys[end - 1]``) are
        stored; None (defer the request) when one of them is still being written or is
        being loaded for another request."""
        keys = _keys(keys)[start:end]
        if not len(keys):
            return 0
        n = int(lru.lookup(keys, self._state, self._loading))
        return None if n < 0 else n

    def store(self, req: RequestOffload, keys: Sequence[int] | np.ndarray, first_chunk: int,
              block_size: int) -> None:
        """Offer ``keys`` (prompt chunks ``first_chunk``... of the request) for storing
        (``prepare_store``): new ones are written (after evictions), ready ones count as
        reused; all or nothing. ``req.next_chunk`` moves past them unless it failed."""
        keys = _keys(keys)
        if not len(keys):
            return
        self._fit(keys)
        state = self._state
        was_new = np.empty(len(keys), np.bool_)
        rank, num_new = lru.offer(keys, first_chunk, req.seen_up_to(first_chunk + len(keys)),
                                  req.rank, block_size, state, self._rank, self._hr,
                                  self._hk, self._ctr, was_new)
        req.rank = int(rank)
        if num_new:
            over = self._size + num_new - self.capacity_blocks
            if over > 0 and not self._evict(over, keys):
                return  # dropped: offered again next step
            major = self._request_rank(req)
            fresh = np.empty(num_new, np.int64)
            lru.write_new(keys, first_chunk, major, block_size, was_new, state, self._rank,
                          fresh)
            self._size += num_new
            self.stored_blocks += num_new
            req.jobs += 1
            self._deferred.append(_Transfer(0.0, fresh, req, is_store=True))
        req.next_chunk = first_chunk + len(keys)

    def load(self, req: RequestOffload, keys: Sequence[int] | np.ndarray, first_chunk: int,
             block_size: int, now_seconds: float) -> float:
        """Start loading ``keys`` (chunks ``first_chunk``... of the request) over the host
        link (``prepare_load``); when they are in."""
        keys = _keys(keys)
        self._fit(keys)
        started = lru.start_load(keys, self._state, self._loading, self._ctr)
        assert started, "a load of a chunk still being written"
        if len(keys):
            self._access_chunks(req, keys, np.arange(first_chunk, first_chunk + len(keys)),
                                block_size)
        start = max(now_seconds, self.link_free_seconds)
        self.link_free_seconds = start + len(keys) * self.seconds_per_block
        self.hit_blocks += len(keys)
        self.loads += 1
        req.jobs += 1
        self._loads.append(_Transfer(self.link_free_seconds, keys.copy(), req,
                                     is_store=False))
        return self.link_free_seconds

    def begin_step(self, now_seconds: float) -> None:
        """A step starts: the stores of the step before begin (the worker defers them)."""
        if not self._deferred:
            return
        for t in self._deferred:
            start = max(now_seconds, self.store_free_seconds)
            self.store_free_seconds = t.done_seconds = (
                start + len(t.keys) * self.seconds_per_block)
            self._stores.append(t)
        self._deferred = []

    def next_done_seconds(self) -> float | None:
        """When the next transfer in flight is done (None: none is)."""
        fronts = [q[0].done_seconds for q in (self._stores, self._loads) if q]
        return min(fronts, default=None)

    def complete(self, seen_seconds: float) -> None:
        """The transfers done by ``seen_seconds`` are reported: written chunks become
        readable, loaded ones idle again. (Their effects commute: a chunk is loaded only
        once written, and the rest is counts.)"""
        for queue in (self._stores, self._loads):
            while queue and queue[0].done_seconds <= seen_seconds:
                t = queue.popleft()
                t.request.jobs -= 1
                self._heap_room(len(t.keys))
                ok = lru.complete(t.keys, t.is_store, self._state, self._rank,
                                  self._loading, self._hr, self._hk, self._ctr)
                assert ok, "a load finished for a chunk nobody was reading"

    def check_invariants(self) -> None:
        state = self._state
        assert self.size <= self.capacity_blocks, "live chunks"
        assert self.size == int(np.count_nonzero(state != lru.ABSENT)), "the size counts them"
        n = int(self._ctr[lru.HEAP_LEN])
        live = {(int(r), int(k)) for r, k in zip(self._hr[:n], self._hk[:n], strict=True)}
        idle = {(int(self._rank[k]), int(k)) for k in np.flatnonzero(state == 0)}
        assert idle <= live, "idle in heap"
        assert len(idle) == int(self._ctr[lru.IDLE]), "the idle count"
