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

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

# A rank is (major, minor) in vLLM: (request rank, -token position) or (fresh, 0). Packed
# into one int, minor in the low bits, so ranks compare as ints.
_MINOR_BITS = 40
_MAX_POSITION = (1 << _MINOR_BITS) - 1

# A chunk's state (vLLM's ``ChunkStatus.ref_cnt``): being written; 0: idle; n > 0: n loads
# are reading it.
_WRITING = -1


def _rank(major: int, position: int) -> int:
    return (major << _MINOR_BITS) + _MAX_POSITION - position


@dataclass(slots=True)
class RequestOffload:
    """One request's side of the tier (vLLM's ``RequestOffloadState`` and the manager's
    per-request access record)."""

    keys: list[int]  # its full prompt blocks' keys
    rank: int = 0  # 0: none yet
    next_chunk: int = 0  # the next prompt chunk to offer for storing
    jobs: int = 0  # transfers in flight (a deferred lookup while any is)
    # Chunks it stored or reused: key -> token position (the chunk's end).
    seen: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Transfer:
    done_seconds: float
    keys: list[int]
    request: RequestOffload
    is_store: bool


class CPUTier:
    """The chunks (``capacity_blocks``), their LRU, and the transfers over the host link."""

    __slots__ = ("_deferred", "_heap", "_in_flight", "_loading", "_next_rank", "_rank",
                 "_state", "capacity_blocks", "evicted_blocks", "hit_blocks",
                 "link_free_seconds", "loads", "seconds_per_block", "store_free_seconds",
                 "stored_blocks")

    def __init__(self, capacity_blocks: int, seconds_per_block: float) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks={capacity_blocks}: the CPU tier needs room "
                             "for one block")
        self.capacity_blocks = capacity_blocks
        self.seconds_per_block = seconds_per_block
        self._state: dict[int, int] = {}  # key -> _WRITING, 0 or the loads reading it
        self._rank: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []  # (rank, key) of idle chunks, lazily
        self._next_rank = 0
        self._loading: dict[int, int] = {}  # key -> loads in flight that bring it
        self._deferred: list[_Transfer] = []  # stores the next step starts
        self._in_flight: list[_Transfer] = []
        self.link_free_seconds = 0.0  # when the host link finishes the loads queued on it
        self.store_free_seconds = 0.0  # the same, for stores (the other direction)
        self.stored_blocks = 0  # chunks written (new ones)
        self.hit_blocks = 0  # chunks loaded
        self.evicted_blocks = 0
        self.loads = 0

    @property
    def size(self) -> int:
        return len(self._state)

    # -- ranks -------------------------------------------------------------------------

    def _request_rank(self, req: RequestOffload) -> int:
        if not req.rank:
            self._next_rank += 1
            req.rank = self._next_rank
        return req.rank

    def _set_rank(self, key: int, rank: int) -> None:
        self._rank[key] = rank
        if self._state.get(key) == 0:
            heapq.heappush(self._heap, (rank, key))
            if len(self._heap) > 2 * len(self._state) + 1024:
                self._compact()

    def _compact(self) -> None:
        """Drop the heap's stale entries (a re-ranked chunk leaves its old one behind)."""
        self._heap = [(self._rank[k], k) for k, s in self._state.items() if s == 0]
        heapq.heapify(self._heap)

    def _access(self, req: RequestOffload, keys: Sequence[int],
                positions: Sequence[int]) -> None:
        """vLLM's ``on_request_access``: chunks the request meets for the first time rise
        to its rank (never fall)."""
        new = [(k, p) for k, p in zip(keys, positions, strict=True) if k not in req.seen]
        if not new:
            return
        major = self._request_rank(req)
        for key, position in new:
            req.seen[key] = position
            if key in self._state:
                rank = _rank(major, position)
                if self._rank[key] < rank:
                    self._set_rank(key, rank)

    def finish(self, req: RequestOffload) -> None:
        """The request finished: what it stored or reused becomes the most recent, tail
        first, head last (``on_request_finished``)."""
        for key in sorted(req.seen, key=req.seen.__getitem__, reverse=True):
            if key in self._state:
                self._next_rank += 1
                self._set_rank(key, _rank(self._next_rank, 0))

    def _evict(self, count: int, protected: set[int]) -> bool:
        """Evict ``count`` idle chunks, least recent first, none of ``protected``; False
        (nothing evicted) when there are not that many."""
        heap = self._heap
        chosen: list[tuple[int, int]] = []
        kept: list[tuple[int, int]] = []
        taken: set[int] = set()
        while heap and len(chosen) < count:
            entry = heapq.heappop(heap)
            rank, key = entry
            if self._state.get(key) != 0 or self._rank.get(key) != rank or key in taken:
                continue  # stale, or a second entry of the same rank
            taken.add(key)
            (kept if key in protected else chosen).append(entry)
        if len(chosen) < count:
            for entry in chosen + kept:
                heapq.heappush(heap, entry)
            return False
        for entry in kept:
            heapq.heappush(heap, entry)
        for _, key in chosen:
            del self._state[key]
            del self._rank[key]
        self.evicted_blocks += count
        if len(heap) > 2 * len(self._state) + 1024:
            self._compact()
        return True

    # -- what the scheduler asks -----------------------------------------------------------

    def lookup(self, keys: Sequence[int], start: int, end: int) -> int | None:
        """How many consecutive chunks from ``keys[start]`` (up to ``keys[end - 1]``) are
        stored; None (defer the request) when one of them is still being written or is
        being loaded for another request."""
        state = self._state
        n = 0
        pending = False
        for key in keys[start:end]:
            s = state.get(key)
            if s is None:
                break
            pending |= s == _WRITING or key in self._loading
            n += 1
        return None if pending else n

    def store(self, req: RequestOffload, keys: Sequence[int], first_chunk: int,
              block_size: int) -> None:
        """Offer ``keys`` (prompt chunks ``first_chunk``... of the request) for storing
        (``prepare_store``): new ones are written (after evictions), ready ones count as
        reused; all or nothing. ``req.next_chunk`` moves past them unless it failed."""
        if not len(keys):
            return
        state = self._state
        positions = [(first_chunk + i + 1) * block_size for i in range(len(keys))]
        new = [k for k in keys if k not in state]
        offered = [(k, p) for k, p in zip(keys, positions, strict=True)
                   if k not in state or state[k] >= 0]
        if offered:
            self._access(req, [k for k, _ in offered], [p for _, p in offered])
        if new:
            over = len(state) + len(new) - self.capacity_blocks
            if over > 0 and not self._evict(over, set(keys)):
                return  # dropped: offered again next step
            major = self._request_rank(req)
            where = dict(zip(keys, positions, strict=True))
            for key in new:
                state[key] = _WRITING
                self._rank[key] = _rank(major, where[key])
            self.stored_blocks += len(new)
            req.jobs += 1
            self._deferred.append(_Transfer(0.0, list(new), req, is_store=True))
        req.next_chunk = first_chunk + len(keys)

    def load(self, req: RequestOffload, keys: Sequence[int], first_chunk: int,
             block_size: int, now_seconds: float) -> float:
        """Start loading ``keys`` (chunks ``first_chunk``... of the request) over the host
        link (``prepare_load``); when they are in."""
        for key in keys:
            s = self._state[key]
            assert s >= 0, "a load of a chunk still being written"
            self._state[key] = s + 1
            self._loading[key] = self._loading.get(key, 0) + 1
        self._access(req, keys, [(first_chunk + i + 1) * block_size
                                 for i in range(len(keys))])
        start = max(now_seconds, self.link_free_seconds)
        self.link_free_seconds = start + len(keys) * self.seconds_per_block
        self.hit_blocks += len(keys)
        self.loads += 1
        req.jobs += 1
        self._in_flight.append(_Transfer(self.link_free_seconds, list(keys), req,
                                         is_store=False))
        return self.link_free_seconds

    def begin_step(self, now_seconds: float) -> None:
        """A step starts: the stores of the step before begin (the worker defers them)."""
        for t in self._deferred:
            start = max(now_seconds, self.store_free_seconds)
            self.store_free_seconds = t.done_seconds = (
                start + len(t.keys) * self.seconds_per_block)
            self._in_flight.append(t)
        self._deferred = []

    def next_done_seconds(self) -> float | None:
        """When the next transfer in flight is done (None: none is)."""
        return min((t.done_seconds for t in self._in_flight), default=None)

    def complete(self, seen_seconds: float) -> None:
        """The transfers done by ``seen_seconds`` are reported: written chunks become
        readable, loaded ones idle again."""
        if not self._in_flight:
            return
        done = [t for t in self._in_flight if t.done_seconds <= seen_seconds]
        if not done:
            return
        self._in_flight = [t for t in self._in_flight if t.done_seconds > seen_seconds]
        state = self._state
        for t in done:
            t.request.jobs -= 1
            for key in t.keys:
                s = state.get(key)
                if t.is_store:
                    if s == _WRITING:
                        state[key] = 0
                        heapq.heappush(self._heap, (self._rank[key], key))
                    continue
                left = self._loading[key] - 1
                if left:
                    self._loading[key] = left
                else:
                    del self._loading[key]
                assert s is not None and s > 0
                state[key] = s - 1
                if s == 1:
                    heapq.heappush(self._heap, (self._rank[key], key))

    def check_invariants(self) -> None:
        assert self.size <= self.capacity_blocks, "live chunks"
        assert set(self._rank) == set(self._state), "a rank per chunk"
        idle = {k for k, s in self._state.items() if s == 0}
        assert idle <= {k for r, k in self._heap if self._rank.get(k) == r}, "idle in heap"
