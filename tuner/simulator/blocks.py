"""The paged KV cache as vLLM V1 keeps it: blocks, the free-block queue, the block pool.

Nouns and behaviour follow ``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py``
(vLLM 0.33.0), so a simulated run can be read against vLLM's own:

- A block is its id (an int); its state is two arrays indexed by id: ``ref_cnt`` and
  ``block_hash``. A full block gets its hash once (``cache_full_blocks``) and keeps it while
  it sits in the free queue, so a later request can take it back (``touch``); it loses the
  hash only when it is handed out again (``get_new_blocks`` evicts it from the cache).
- ``FreeKVCacheBlockQueue`` is the LRU eviction order. At start it holds every block by id;
  ``popleft`` takes the least recently used. vLLM 0.33's ``free_blocks`` puts blocks without
  a hash (or all blocks when caching is off) at the *front* (reused first) and hashed blocks
  at the *back*, each in the order given; callers free a request's blocks in reverse, so
  the tail of a prefix chain is evicted before its head.
- Block 0 is the null block: taken out of the queue at start, never allocated.

Why arrays and not one object per block (as vLLM): a long prompt holds hundreds of blocks,
and per-block Python work was most of a replay's time (multi-turn Mooncake traffic at block
size 16 moves ~900 blocks per request). Every pool operation on many blocks is one compiled
loop over the arrays (``block_loops.py``, compiled by ``compiled.py``); the order
the queue keeps and the blocks handed out are the same as vLLM's. Two structures are lazy
for that reason:

- the queue is an array in eviction order with a head and a tail; a block taken out of the
  middle (a prefix hit, ``remove``) only has its position cleared (``position[id] = -1``),
  and ``popleft_n`` skips entries whose block is no longer at that position;
- the prefix-cache map (hash -> block id) is never cleaned on eviction: an entry is live
  only while its block still holds that hash (``block_hash[id] == hash``).

Hashes here are dense non-negative ints (``prefix.KeySpace``), so the map is an array indexed
by hash (``key_block``; 0, the null block, where none). ``UNSHARED_HASH`` marks a
full block whose content no other request can ever ask for (see ``prefix.py``): it is
cached (it keeps its LRU position as a hashed block) but never entered in the map, because
a lookup for it can never come. ``NO_HASH`` is a block that is not cached.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from kvtune.tuner.simulator import block_loops as loops
from kvtune.tuner.simulator.block_loops import NO_HASH
from kvtune.tuner.simulator.block_loops import (
    UNSHARED_HASH as UNSHARED_HASH,  # the pool's callers read it here
)

Ids = Sequence[int] | np.ndarray

# Room behind the queue's tail, in pools' worth of blocks: a relayout (a copy of the live
# entries) comes once per this many pools' worth of appends.
_ROOM = 4


def _ids(blocks: Ids) -> np.ndarray:
    if isinstance(blocks, np.ndarray):
        return blocks
    return np.asarray(blocks, dtype=np.int64)


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: the front is evicted (reused) first.

    1. At start the order is by block id.
    2. A freed block goes to the back (hashed: stays a cache candidate as long as possible)
       or to the front (no hash: nothing to keep).
    3. Blocks of one request are freed tail first, so among blocks freed together the one
       holding more of the prefix chain (its tail) is evicted first.

    ``_slots[head:tail]`` holds block ids front to back, some of them stale: block ``b`` is
    in the queue at slot ``i`` iff ``_position[b] == i``. Room is kept on both sides
    (prepends write before ``head``, appends after ``tail``); when a side runs out, the live
    entries are copied into a fresh layout (amortized O(1) per block).
    """

    __slots__ = ("_head", "_index", "_num_blocks", "_position", "_slots", "_tail",
                 "num_free_blocks")

    def __init__(self, num_blocks: int, block_ids: Sequence[int]) -> None:
        self._num_blocks = num_blocks
        self._position = np.full(num_blocks, -1, dtype=np.int64)
        self._slots = self._index = np.zeros(0, dtype=np.int64)
        self._head = self._tail = 0
        self.num_free_blocks = 0
        ids = (np.arange(block_ids.start, block_ids.stop, block_ids.step, dtype=np.int64)
               if isinstance(block_ids, range)  # not element by element: pools are large
               else np.asarray(block_ids, dtype=np.int64))
        self._relayout(ids, 0)

    def _live(self) -> np.ndarray:
        window = self._slots[self._head:self._tail]
        keep = self._position[window] == self._index[self._head:self._tail]
        live: np.ndarray = window[keep]
        return live

    def _relayout(self, live: np.ndarray, extra: int) -> None:
        """Copy the live entries to slot ``num_blocks + extra`` (room in front), with room
        for ``_ROOM`` pools' worth of appends behind them. The arrays are reused when large
        enough: slots outside ``[head, tail)`` are never read, so they need no clearing."""
        front = self._num_blocks + extra
        size = front + len(live) + _ROOM * self._num_blocks + extra
        if size > len(self._slots):
            self._slots = np.empty(size, np.int64)
            # Slot numbers, sliced where a range of them is needed (no arange per call).
            self._index = np.arange(size, dtype=np.int64)
        self._slots[front:front + len(live)] = live
        self._position[live] = self._index[front:front + len(live)]
        self._head, self._tail = front, front + len(live)
        self.num_free_blocks = len(live)

    def _make_room(self, k: int) -> None:
        """Room for ``k`` more blocks at either end."""
        if self._head < k or self._tail + k > len(self._slots):
            self._relayout(self._live(), k)

    def _require(self, n: int) -> None:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot get {n} free blocks from the pool "
                             f"({self.num_free_blocks} free)")

    def popleft_n(self, n: int) -> np.ndarray:
        """Take the ``n`` blocks at the front (``n`` <= free blocks)."""
        self._require(n)
        taken = np.empty(max(0, n), dtype=np.int64)
        if n > 0:
            self._head = loops.popleft(self._slots, self._position, self._head, taken)
            self.num_free_blocks -= n
        return taken

    def remove(self, blocks: Ids) -> None:
        """Take blocks out from anywhere in the queue (each one must be in it)."""
        ids = _ids(blocks)
        self._position[ids] = -1
        self.num_free_blocks -= len(ids)

    def append_n(self, blocks: Ids) -> None:
        ids = _ids(blocks)
        k = len(ids)
        self._make_room(k)
        t = self._tail
        self._slots[t:t + k] = ids
        self._position[ids] = self._index[t:t + k]
        self._tail = t + k
        self.num_free_blocks += k

    def prepend_n(self, blocks: Ids) -> None:
        """Put ``blocks`` at the front, keeping their order (blocks[0] evicted first)."""
        ids = _ids(blocks)
        k = len(ids)
        self._make_room(k)
        h = self._head - k
        self._slots[h:h + k] = ids
        self._position[ids] = self._index[h:h + k]
        self._head = h
        self.num_free_blocks += k

    def free_table(self, table: np.ndarray, num_full: int, num_keyed: int, caching: bool,
                   ref_cnt: np.ndarray, block_hash: np.ndarray) -> None:
        """``BlockPool.free_request_blocks``, as one compiled loop (``loops.free_table``)."""
        self._make_room(len(table))
        head, tail = loops.free_table(table, num_full, num_keyed, caching, ref_cnt, block_hash,
                                      self._slots, self._position, self._head, self._tail)
        self.num_free_blocks += (self._head - head) + (tail - self._tail)
        self._head, self._tail = head, tail

    def block_ids(self) -> list[int]:
        """The queue front to back (for tests and debugging)."""
        out: list[int] = self._live().tolist()
        return out

    def contains(self, blocks: Ids) -> np.ndarray:
        """Per block: whether it is in the queue."""
        inside: np.ndarray = self._position[_ids(blocks)] >= 0
        return inside

    def __contains__(self, block: int) -> bool:
        return bool(self._position[block] >= 0)


class BlockPool:
    """Owns every block's state, the free queue and the prefix-cache map (hash -> block id).

    The map keeps every cached copy of a hash, as vLLM's ``BlockHashToBlockMap``: a lookup
    returns the earliest-cached copy still there; evicting it exposes the next. Duplicates
    come from the hit cap (a prompt that ends on a block boundary recomputes its last full
    block even when it is cached: the same prompt sent twice makes two copies) and from a
    request computing a block that another request cached since its admission. The first
    copy is the ``key_block`` entry, later ones (rare) wait in ``duplicate_blocks``.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks={num_gpu_blocks}: the pool needs the null block plus at "
                "least one usable block; give the KV cache more memory"
            )
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = np.zeros(num_gpu_blocks, dtype=np.int64)
        self.block_hash = np.full(num_gpu_blocks, NO_HASH, dtype=np.int64)
        # The null block (0) never enters the queue.
        self.free_block_queue = FreeKVCacheBlockQueue(num_gpu_blocks, range(1, num_gpu_blocks))
        self.null_block = 0
        # hash -> block id (0: none). Lazy: live only while block_hash[block] == hash.
        self.key_block = np.zeros(1024, dtype=np.int64)
        # hash -> later copies of its live entry, in the order they were cached (class doc),
        # and per hash whether it has an entry there (an eviction checks only those keys).
        self.duplicate_blocks: dict[int, list[int]] = {}
        self._has_copies = np.zeros(1024, dtype=np.bool_)
        # Where the compiled loops report (block, hash) pairs for the map's copies: at most
        # one pair per block of a call.
        self._pairs = np.empty(2 * num_gpu_blocks, dtype=np.int64)
        # Set by reserve_keys: the owner promises every key is below it (no max per call).
        self._key_bound: int | None = None

    def reserve_keys(self, num_keys: int) -> None:
        """Every key passed from now on is below ``num_keys`` (the owner's ``KeySpace``
        size, raised whenever it grows): the map is sized here, not checked per call."""
        self._key_bound = num_keys
        self._grow_map(num_keys)

    def _grow_map(self, top: int) -> None:
        if top > len(self.key_block):
            grown = np.zeros(max(top, 2 * len(self.key_block)), dtype=np.int64)
            grown[:len(self.key_block)] = self.key_block
            self.key_block = grown
            flags = np.zeros(len(grown), dtype=np.bool_)
            flags[:len(self._has_copies)] = self._has_copies
            self._has_copies = flags

    def _room_for(self, keys: np.ndarray, start: int, end: int) -> None:
        """The map holds ``keys[start:end]`` (checked only where no bound was reserved)."""
        if self._key_bound is None:
            self._grow_map(int(keys[start:end].max()) + 1)

    # -- lookups ---------------------------------------------------------------------------

    def hash_of(self, block: int) -> int | None:
        """The block's hash (None: not cached)."""
        h = int(self.block_hash[block])
        return None if h == NO_HASH else h

    def get_cached_block(self, block_hash: int) -> int | None:
        if block_hash >= len(self.key_block):
            return None
        b = int(self.key_block[block_hash])
        if b == 0 or self.block_hash[b] != block_hash:
            return None
        return b

    def cached_hashes(self) -> set[int]:
        """The hashes a lookup can find now (tests)."""
        keys = np.flatnonzero(self.key_block)
        live = self.block_hash[self.key_block[keys]] == keys
        return set(keys[live].tolist())

    def find_longest_cache_hit(self, block_hashes: Ids, max_num_blocks: int) -> np.ndarray:
        """The run of cached blocks from the start of ``block_hashes`` (chained hashes: the
        first miss ends the hit), at most ``max_num_blocks`` long."""
        keys = _ids(block_hashes)
        limit = min(len(keys), max(0, max_num_blocks))
        if not limit:
            return keys[:0]
        self._room_for(keys, 0, limit)
        n = loops.hit_length(keys, limit, self.key_block, self.block_hash)
        got: np.ndarray = self.key_block[keys[:n]]
        return got

    def cache_hit_need(self, block_hashes: np.ndarray, max_num_blocks: int) -> tuple[int, int]:
        """``find_longest_cache_hit``'s length and how many of those blocks sit in the free
        queue (``num_free_among`` of them), in one compiled pass that makes no array: an
        admission check that fails, as the head of the queue's does at nearly every step of
        overloaded traffic, needs nothing more."""
        limit = min(len(block_hashes), max(0, max_num_blocks))
        if not limit:
            return 0, 0
        self._room_for(block_hashes, 0, limit)
        n, free = loops.hit_need(block_hashes, limit, self.key_block, self.block_hash,
                                 self.ref_cnt)
        return int(n), int(free)

    def num_free_among(self, blocks: Ids) -> int:
        """How many of ``blocks`` sit in the free queue (ref_cnt 0)."""
        if not len(blocks):
            return 0
        return int(np.count_nonzero(self.ref_cnt[_ids(blocks)] == 0))

    # -- allocation ------------------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> np.ndarray:
        """Take ``num_blocks`` from the front of the free queue, evicting their cached
        content (vLLM's ``_maybe_evict_cached_block``)."""
        q = self.free_block_queue
        q._require(num_blocks)
        taken = np.empty(max(0, num_blocks), dtype=np.int64)
        # The queue's popleft_n and the hand-out in one compiled call (the pool and its queue
        # share this module's arrays).
        q._head, copied = loops.take_front(q._slots, q._position, q._head, taken,
                                           self.block_hash, self.ref_cnt, self._has_copies,
                                           self._pairs)
        q.num_free_blocks -= len(taken)
        for j in range(copied):
            self._evict_copy(int(self._pairs[2 * j + 1]), int(self._pairs[2 * j]))
        return taken

    def _evict_copy(self, h: int, b: int) -> None:
        """Block ``b`` loses hash ``h``: if it was the live entry, the next copy takes over;
        if it was a later copy, it leaves the list."""
        copies = self.duplicate_blocks.get(h)
        if not copies:
            return
        if int(self.key_block[h]) == b:
            self.key_block[h] = copies.pop(0)
        else:
            copies.remove(b)
        if not copies:
            del self.duplicate_blocks[h]
            self._has_copies[h] = False

    def touch(self, blocks: Ids) -> None:
        """A prefix hit takes a reference; a free cached block leaves the free queue."""
        if not len(blocks):
            return
        q = self.free_block_queue
        q.num_free_blocks -= loops.touch(_ids(blocks), self.ref_cnt, q._position)

    def cache_full_blocks(
        self, blocks: Ids, block_hashes: Ids, num_cached_blocks: int, num_full_blocks: int,
    ) -> None:
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hash from
        ``block_hashes`` (the request's shareable keys). Full blocks past the shareable
        prefix are hashed in vLLM too, but no lookup can ever find them, so they are marked
        ``UNSHARED_HASH`` only when freed (``free_request_blocks``): same eviction order,
        no per-block work while they are in use."""
        if not self.enable_caching:
            return
        end = min(len(block_hashes), num_full_blocks)
        if end <= num_cached_blocks:
            return
        keys = _ids(block_hashes)
        self._room_for(keys, num_cached_blocks, end)
        # One live entry per hash; a second copy of a cached block waits behind it (class doc).
        copies = loops.cache_blocks(_ids(blocks), keys, num_cached_blocks, end,
                                    self.block_hash, self.key_block, self._has_copies,
                                    self._pairs)
        for j in range(copies):
            b, h = int(self._pairs[2 * j]), int(self._pairs[2 * j + 1])
            self.duplicate_blocks.setdefault(h, []).append(b)

    def free_request_blocks(self, blocks: Ids, num_full_blocks: int,
                            num_keyed_blocks: int) -> None:
        """Free one request's block table the way vLLM does (``free_blocks`` of the blocks in
        reverse), where its first ``num_full_blocks`` blocks are full and therefore hashed:
        its first ``num_keyed_blocks`` hold their shareable keys, and the other full ones,
        which hold none, get ``UNSHARED_HASH`` now (written, not read: the caller knows)."""
        if not len(blocks):
            return
        self.free_block_queue.free_table(_ids(blocks), num_full_blocks, num_keyed_blocks,
                                         self.enable_caching, self.ref_cnt, self.block_hash)

    def free_blocks(self, ordered_blocks: Ids | Iterable[int]) -> None:
        """Drop one reference from each block; blocks reaching zero go back to the queue,
        hashed ones at the back, the others at the front, each in the order given (the
        first is evicted first). Callers pass a request's blocks in reverse."""
        ids = (ordered_blocks if isinstance(ordered_blocks, np.ndarray)
               else np.asarray(list(ordered_blocks), dtype=np.int64))
        if not len(ids):
            return
        # ``loops.free_table`` takes a table and frees it in reverse; with no full blocks it
        # sorts by hash alone, as here.
        self.free_block_queue.free_table(np.ascontiguousarray(ids[::-1]), 0, 0,
                                         self.enable_caching, self.ref_cnt, self.block_hash)

    # -- accounting ------------------------------------------------------------------------

    def get_usage(self) -> float:
        """Fraction of usable blocks not in the free queue (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a hash (eviction candidates of the prefix cache)."""
        free = np.asarray(self.free_block_queue.block_ids(), dtype=np.int64)
        return int(np.count_nonzero(self.block_hash[free] != NO_HASH))

    def check_invariants(self) -> None:
        """Conservation: every usable block is exactly one of in use (ref_cnt > 0), free and
        cached (hash kept), or free and empty; the live map entries point only at blocks
        holding their hash."""
        q = self.free_block_queue
        queued = q.block_ids()
        assert len(queued) == len(set(queued)) == q.num_free_blocks, "queue entries"
        ids = np.arange(1, self.num_gpu_blocks)
        in_q = q.contains(ids)
        ref = self.ref_cnt[1:]
        assert (ref >= 0).all()
        assert (in_q == (ref == 0)).all(), "a block is free iff it has no reference"
        hashed = self.block_hash[1:] != NO_HASH
        in_use = int(np.count_nonzero(ref > 0))
        free_cached = int(np.count_nonzero(in_q & hashed))
        free_empty = int(np.count_nonzero(in_q & ~hashed))
        assert 0 not in q and self.block_hash[0] == NO_HASH and self.ref_cnt[0] == 0
        assert in_use + free_cached + free_empty == self.num_gpu_blocks - 1
        assert free_cached + free_empty == q.num_free_blocks
        assert ((self.key_block >= 0) & (self.key_block < self.num_gpu_blocks)).all()
        assert set(np.flatnonzero(self._has_copies).tolist()) == set(self.duplicate_blocks)
        for h, copies in self.duplicate_blocks.items():
            head = int(self.key_block[h])
            assert copies and self.block_hash[head] == h, f"hash {h}: no live entry"
            for b in copies:
                assert b != head and self.block_hash[b] == h, f"hash {h}: stale copy {b}"
