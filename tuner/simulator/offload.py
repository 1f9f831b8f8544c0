"""The CPU KV tier of ``--kv-offloading-size`` as vLLM 0.33.0's native offloading runs it.

vLLM (``vllm/config/vllm.py`` ``_post_init_kv_transfer_config``) turns the flag into the
``OffloadingConnector`` with ``cpu_bytes_to_use`` = the size in GiB (across TP ranks). What
the simulator follows, by source file:

- **Granularity** (``offloading/config.py``, ``kv_offload/cpu/spec.py``): one CPU chunk is
  one GPU block (``blocks_per_chunk`` defaults to 1) of every layer on every rank; the
  tier holds ``cpu_bytes // round_up(block bytes x ranks, page size)`` chunks
  (``cpu_blocks``). MLA with TP > 1 keeps one copy (``replicated_layout``).
- **What is stored, when** (``offloading/scheduler.py`` ``_build_store_jobs``): a store job
  per step for the full blocks a request computes, *prompt blocks only*
  (``offload_prompt_only`` defaults to True), keyed by the block hash. Stored on compute,
  not on GPU eviction: the CPU tier holds the prompts, whether or not the GPU still does.
  The simulator stores a request's prompt blocks when its prompt is done (its first token).
- **Eviction** (``kv_offload/cpu/policies/lru.py``): LRU over chunks; within one request
  the tail of the prompt is evicted before its head (rank ``(request, -position)``); a
  lookup hit refreshes the chunks it found.
- **Lookup** (``get_num_new_matched_tokens``, core ``scheduler.py``): at admission, after
  the GPU prefix-cache hit, the connector counts the consecutive stored chunks that follow
  it, up to the whole sequence (no "keep one token" cap; ``_update_waiting_for_remote_kv``
  recomputes the last token of a full hit instead).
- **Load** (core ``scheduler.py``, ``sync_load_budget_bytes`` defaults to 0: always
  asynchronous): the request's blocks for the loaded tokens are allocated at once (the
  full-sequence check counts the other in-flight loads' reservations), it leaves the
  waiting queue without taking any of the step's token budget (``WAITING_FOR_REMOTE_KVS``),
  and once a step's output reports the transfer done (the worker polls it after every
  step; under async scheduling the next batch is already scheduled then, so one step later)
  it is scheduled first, with the loaded tokens computed (and then cached in the GPU prefix
  cache).
- **Transfer time**: the loaded bytes per GPU over the GPU's host link (``gpus.json``
  ``host_link_bytes_per_second``), one transfer at a time per direction (loads queue
  behind each other). Stores go the other way and overlap compute: not charged.

Not modeled: contention of the copy kernels with the model's own HBM traffic, and a store
still in flight when its chunk is looked up (taken as stored).
"""

from __future__ import annotations

import numpy as np

# A chunk no lookup can ever ask for (its block holds tokens unique to one request): it
# takes room in the LRU like any other chunk but has no key.
_ANONYMOUS = -1


class CPUTier:
    """An LRU of ``capacity_blocks`` chunks, keyed by the simulator's block keys
    (``prefix.KeySpace``), with one host link for loads.

    The LRU is a log of keys in recency order (front: evicted first) with lazy deletion, as
    the GPU free queue (``blocks.py``): ``_stamp[key]`` is 1 + the log slot of the key's live
    entry (0: not stored); an entry is stale when its key has moved on. Anonymous chunks are
    live until the front passes them.
    """

    __slots__ = ("_head", "_log", "_stamp", "_tail", "capacity_blocks", "hit_blocks",
                 "link_free_seconds", "loads", "seconds_per_block", "size", "stored_blocks")

    def __init__(self, capacity_blocks: int, seconds_per_block: float) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks={capacity_blocks}: the CPU tier needs room "
                             "for one block")
        self.capacity_blocks = capacity_blocks
        self.seconds_per_block = seconds_per_block
        self._stamp = np.zeros(1024, dtype=np.int64)
        self._log = np.zeros(2 * capacity_blocks + 1024, dtype=np.int64)
        self._head = self._tail = 0
        self.size = 0  # live chunks
        self.link_free_seconds = 0.0  # when the host link finishes the loads queued on it
        self.stored_blocks = 0  # chunks written (new ones)
        self.hit_blocks = 0  # chunks a lookup found and loaded
        self.loads = 0

    # -- the log ---------------------------------------------------------------------------

    def _grow_keys(self, keys: np.ndarray) -> None:
        if len(keys):
            top = int(keys.max()) + 1
            if top > len(self._stamp):
                grown = np.zeros(max(top, 2 * len(self._stamp)), dtype=np.int64)
                grown[:len(self._stamp)] = self._stamp
                self._stamp = grown

    def _live_mask(self, start: int, end: int) -> np.ndarray:
        window = self._log[start:end]
        named = window >= 0
        live = ~named
        slots = np.arange(start + 1, end + 1, dtype=np.int64)
        live[named] = self._stamp[window[named]] == slots[named]
        return live

    def _append(self, keys: np.ndarray) -> None:
        """Append ``keys`` (in order: the last is the most recently used)."""
        k = len(keys)
        if self._tail + k > len(self._log):
            live = self._log[self._head:self._tail][self._live_mask(self._head, self._tail)]
            self._log = np.zeros(len(live) + k + 2 * self.capacity_blocks + 1024,
                                 dtype=np.int64)
            self._log[:len(live)] = live
            named = live >= 0
            self._stamp[live[named]] = np.arange(1, len(live) + 1, dtype=np.int64)[named]
            self._head, self._tail = 0, len(live)
        t = self._tail
        self._log[t:t + k] = keys
        named = keys >= 0
        self._stamp[keys[named]] = np.arange(t + 1, t + k + 1, dtype=np.int64)[named]
        self._tail = t + k

    def _evict_to_capacity(self) -> None:
        over = self.size - self.capacity_blocks
        if over <= 0:
            return
        end = self._head
        taken = 0
        while taken < over:
            assert end < self._tail, "the CPU tier counts more chunks than it holds"
            start, end = end, min(self._tail, end + 2 * (over - taken) + 16)
            live = self._live_mask(start, end)
            found = np.flatnonzero(live)
            need = over - taken
            if len(found) >= need:
                cut = start + int(found[need - 1]) + 1
                gone = self._log[start:cut][live[:cut - start]]
                self._stamp[gone[gone >= 0]] = 0
                self._head = cut
                self.size -= over
                return
            gone = self._log[start:end][live]
            self._stamp[gone[gone >= 0]] = 0
            taken += len(found)

    # -- what the scheduler asks -----------------------------------------------------------

    def store(self, keys: np.ndarray, num_anonymous: int) -> None:
        """A request's prompt blocks, in prompt order: ``keys`` for the first (shareable)
        ones, then ``num_anonymous`` with no key. New chunks are written, stored ones
        refreshed; the prompt's head ends most recently used."""
        self._grow_keys(keys)
        new = int(np.count_nonzero(self._stamp[keys] == 0)) if len(keys) else 0
        order = np.concatenate((np.full(num_anonymous, _ANONYMOUS, dtype=np.int64),
                                keys[::-1]))
        self._append(order)
        self.size += new + num_anonymous
        self.stored_blocks += new + num_anonymous
        self._evict_to_capacity()

    def lookup(self, keys: np.ndarray, start: int, end: int) -> int:
        """How many consecutive chunks from ``keys[start]`` (up to ``keys[end - 1]``) are
        stored; the ones found are refreshed (a request-scoped access)."""
        if end <= start:
            return 0
        want = keys[start:end]
        self._grow_keys(want)
        present = self._stamp[want] > 0
        n = int(present.argmin()) if not present.all() else len(want)
        if n:
            self._append(want[:n][::-1])
        return n

    def load(self, now_seconds: float, num_blocks: int) -> float:
        """Queue a load of ``num_blocks`` chunks on the host link; when it is done."""
        start = max(now_seconds, self.link_free_seconds)
        self.link_free_seconds = start + num_blocks * self.seconds_per_block
        self.hit_blocks += num_blocks
        self.loads += 1
        return self.link_free_seconds

    def check_invariants(self) -> None:
        live = self._log[self._head:self._tail][self._live_mask(self._head, self._tail)]
        assert len(live) == self.size <= self.capacity_blocks, "live chunks"
        named = live[live >= 0]
        assert len(set(named.tolist())) == len(named), "one live entry per key"
        assert int(np.count_nonzero(self._stamp)) == len(named), "stamps of live keys"
