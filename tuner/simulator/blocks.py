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
size 16 moves ~900 blocks per request). Every pool operation here is a handful of numpy
calls over all the blocks it touches; the order the queue keeps and the blocks handed out
are the same as vLLM's. Two structures are lazy for that reason:

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

# A full block whose content is unique to one request: hashed in vLLM, but no lookup can
# ever find it, so the simulator skips the map entry (and the cost of a real key).
UNSHARED_HASH = -1
# Not cached: not full, or handed out again since it was.
NO_HASH = -2

Ids = Sequence[int] | np.ndarray
# Up to this many blocks, queue and pool operations take scalar paths (measured: the fixed
# cost of a handful of numpy calls is more than a few scalar reads).
_SCALAR_MAX = 4


# The largest and smallest element (``ndarray.max``/``min`` without their Python wrappers).
_max = np.maximum.reduce
_min = np.minimum.reduce
# Whether any element is true (``ndarray.any`` without its Python wrapper).
_any = np.logical_or.reduce
# A slot past every queue (no stale entry known).
_NOWHERE = 1 << 62
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
    (``prepend_n`` writes before ``head``, ``append_n`` after ``tail``); when a side runs
    out, the live entries are copied into a fresh array (amortized O(1) per block).
    """

    __slots__ = ("_head", "_index", "_num_blocks", "_position", "_slots", "_stale",
                 "_stale_from", "_tail", "num_free_blocks")

    def __init__(self, num_blocks: int, block_ids: Sequence[int]) -> None:
        self._num_blocks = num_blocks
        self._position = np.full(num_blocks, -1, dtype=np.int64)
        self._slots = self._index = np.zeros(0, dtype=np.int64)
        self._head = self._tail = 0
        self.num_free_blocks = 0
        # Stale entries in _slots[head:tail] (blocks taken out by ``remove``), and a slot
        # before which there are none: up to there, the front n entries are the n blocks to
        # hand out (no liveness check). Prefix hits take blocks out far behind the head.
        self._stale = 0
        self._stale_from = _NOWHERE
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
        self._stale = 0
        self._stale_from = _NOWHERE

    def popleft_n(self, n: int) -> np.ndarray:
        """Take the ``n`` blocks at the front (``n`` <= free blocks)."""
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot get {n} free blocks from the pool "
                             f"({self.num_free_blocks} free)")
        if n <= 0:
            return np.zeros(0, dtype=np.int64)
        head, tail = self._head, self._tail
        if not self._stale or head + n <= self._stale_from:
            # Every entry from the head on is live up to there: the front n.
            end = head + n
            taken: np.ndarray = self._slots[head:end].copy()
            self._position[taken] = -1
            self._head = end
            self.num_free_blocks -= n
            return taken
        if n <= _SCALAR_MAX:
            # A few blocks (a decode step crossing a block boundary): scalar reads beat the
            # fixed cost of the array calls below.
            slots, position = self._slots, self._position
            out = np.empty(n, dtype=np.int64)
            i = head
            for j in range(n):
                b = slots[i]
                while position[b] != i:
                    i += 1
                    b = slots[i]
                out[j] = b
                position[b] = -1
                i += 1
            self._stale -= i - head - n
            self._head = i
            self.num_free_blocks -= n
            self._find_stale()
            return out
        end = min(tail, head + n)
        while True:
            window = self._slots[head:end]
            live = (self._position[window] == self._index[head:end]).nonzero()[0]
            if len(live) >= n or end == tail:
                break
            end = min(tail, end + 2 * (n - len(live)) + 16)
        idx = live[:n]
        taken = window[idx]
        self._position[taken] = -1
        last = int(idx[-1]) + 1
        self._stale -= last - n
        self._head = head + last
        self.num_free_blocks -= n
        self._find_stale()
        return taken

    def _find_stale(self) -> None:
        """After the head passed ``_stale_from``: the first stale slot from the head on, by
        a scan in growing windows (each slot is scanned once before the head reaches it)."""
        if not self._stale:
            self._stale_from = _NOWHERE
            return
        i, tail, width = self._head, self._tail, 1024
        while i < tail:
            j = min(tail, i + width)
            bad = (self._position[self._slots[i:j]] != self._index[i:j]).nonzero()[0]
            if len(bad):
                self._stale_from = i + int(bad[0])
                return
            i, width = j, 2 * width
        self._stale_from = tail

    def remove(self, blocks: Ids) -> None:
        ids = _ids(blocks)
        if not len(ids):
            return
        first = int(_min(self._position[ids]))
        self._position[ids] = -1
        self.num_free_blocks -= len(ids)
        self._stale += len(ids)
        self._stale_from = min(self._stale_from, first)

    def append_n(self, blocks: Ids) -> None:
        ids = _ids(blocks)
        k = len(ids)
        if self._tail + k > len(self._slots):
            self._relayout(self._live(), k)
        t = self._tail
        self._slots[t:t + k] = ids
        self._position[ids] = self._index[t:t + k]
        self._tail = t + k
        self.num_free_blocks += k

    def prepend_n(self, blocks: Ids) -> None:
        """Put ``blocks`` at the front, keeping their order (blocks[0] evicted first)."""
        ids = _ids(blocks)
        k = len(ids)
        if self._head < k:
            self._relayout(self._live(), k)
        h = self._head - k
        self._slots[h:h + k] = ids
        self._position[ids] = self._index[h:h + k]
        self._head = h
        self.num_free_blocks += k

    def append_one(self, block: int) -> None:
        """``append_n`` of one block, in scalars (a freed table's partial tail)."""
        if self._tail >= len(self._slots):
            self._relayout(self._live(), 1)
        t = self._tail
        self._slots[t] = block
        self._position[block] = t
        self._tail = t + 1
        self.num_free_blocks += 1

    def prepend_one(self, block: int) -> None:
        """``prepend_n`` of one block, in scalars (a freed table's partial tail)."""
        if self._head < 1:
            self._relayout(self._live(), 1)
        h = self._head - 1
        self._slots[h] = block
        self._position[block] = h
        self._head = h
        self.num_free_blocks += 1

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

    def _room_for(self, keys: np.ndarray) -> None:
        if self._key_bound is None:
            self._grow_map(int(keys.max()) + 1)

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
        keys = _ids(block_hashes)[:max(0, max_num_blocks)]
        if not len(keys):
            return keys
        self._room_for(keys)
        kb = self.key_block
        first = keys[0]
        if self.block_hash[kb[first]] != first:
            return keys[:0]  # the first block misses (most lookups): no array work
        got: np.ndarray = kb[keys]
        # A missing key maps to the null block, whose hash is NO_HASH: never a hit.
        hit = self.block_hash[got] == keys
        first_miss = int(hit.argmin())
        if hit[first_miss]:
            return got  # no miss
        out: np.ndarray = got[:first_miss]
        return out

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
        taken = self.free_block_queue.popleft_n(num_blocks)
        if num_blocks <= _SCALAR_MAX:
            bh, ref = self.block_hash, self.ref_cnt
            for b in taken:
                h = bh[b]
                if h != NO_HASH:
                    if h >= 0 and self.duplicate_blocks:
                        self._evict_copy(int(h), int(b))
                    bh[b] = NO_HASH
                ref[b] = 1
            return taken
        hashes = self.block_hash[taken]
        # NO_HASH is the least value: the largest tells whether any is cached.
        if _max(hashes) != NO_HASH:
            if self.duplicate_blocks:
                # Only keys with later copies need their map entry looked at.
                keyed = hashes >= 0
                ids, keys = taken[keyed], hashes[keyed]
                copied = self._has_copies[keys]
                if _any(copied):
                    for b, h in zip(ids[copied].tolist(), keys[copied].tolist(), strict=True):
                        self._evict_copy(h, b)
            self.block_hash[taken] = NO_HASH  # the map entries go stale with it
        self.ref_cnt[taken] = 1
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
        ids = _ids(blocks)
        free = ids[self.ref_cnt[ids] == 0]
        if len(free):
            self.free_block_queue.remove(free)
        self.ref_cnt[ids] += 1

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
        ids = _ids(blocks)[num_cached_blocks:end]
        keys = _ids(block_hashes)[num_cached_blocks:end]
        bh = self.block_hash
        if _max(bh[ids]) != NO_HASH:  # NO_HASH is the least value: some are cached
            new = bh[ids] == NO_HASH  # the others are prefix hits, already cached
            ids, keys = ids[new], keys[new]
            if not len(ids):
                return
        # One live entry per hash; a second copy of a cached block waits behind it (class doc).
        self._room_for(keys)
        kb = self.key_block
        held = kb[keys]
        # Read before the blocks get their keys: an entry that is this very block (a stale
        # one, from when it held the key before) is not live, as the block holds none now.
        live = bh[held] == keys
        bh[ids] = keys
        if _any(live):
            for b, h in zip(ids[live].tolist(), keys[live].tolist(), strict=True):
                self.duplicate_blocks.setdefault(h, []).append(b)
                self._has_copies[h] = True
            ids, keys = ids[~live], keys[~live]
        kb[keys] = ids

    def free_request_blocks(self, blocks: Ids, num_full_blocks: int,
                            num_keyed_blocks: int) -> None:
        """Free one request's block table the way vLLM does (``free_blocks`` of the blocks in
        reverse), where its first ``num_full_blocks`` blocks are full and therefore hashed:
        its first ``num_keyed_blocks`` hold their shareable keys, and the other full ones,
        which hold none, get ``UNSHARED_HASH`` now (written, not read: the caller knows)."""
        if not len(blocks):
            return
        ids = _ids(blocks)
        if not self.enable_caching:
            self.free_blocks(ids[::-1])
            return
        ref = self.ref_cnt
        refs = ref[ids]
        if _max(refs) == 1:
            # No other request holds any of them (the common case): all go free.
            ref[ids] = 0
            tail = ids[num_full_blocks:][::-1]
            # A copy in reverse, not a view: scattering through a negative stride is slower.
            full = ids[num_full_blocks - 1::-1].copy() if num_full_blocks else ids[:0]
        else:
            ref[ids] = refs - 1
            # Reverse order: the partial tail blocks come first, then the full blocks.
            tail = ids[num_full_blocks:][::-1]
            tail = tail[ref[tail] == 0]
            full = ids[:num_full_blocks][::-1]
            full = full[ref[full] == 0]
        bh = self.block_hash
        q = self.free_block_queue
        if num_keyed_blocks < num_full_blocks:
            bh[ids[num_keyed_blocks:num_full_blocks]] = UNSHARED_HASH
        if len(tail) == 1:
            # One partial block (the usual tail): hashed only if cached before it was full.
            last = int(tail[0])
            if bh[last] == NO_HASH:
                q.prepend_one(last)
            else:
                q.append_one(last)
        elif len(tail):
            tail_hashed = bh[tail] != NO_HASH
            if _any(tail_hashed):
                q.prepend_n(tail[~tail_hashed])
                q.append_n(tail[tail_hashed])
            else:
                q.prepend_n(tail)
        if len(full):
            q.append_n(full)

    def free_blocks(self, ordered_blocks: Ids | Iterable[int]) -> None:
        """Drop one reference from each block; blocks reaching zero go back to the queue,
        hashed ones at the back, the others at the front, each in the order given (the
        first is evicted first). Callers pass a request's blocks in reverse."""
        ids = (ordered_blocks if isinstance(ordered_blocks, np.ndarray)
               else np.asarray(list(ordered_blocks), dtype=np.int64))
        if not len(ids):
            return
        self.ref_cnt[ids] -= 1
        freed = ids[self.ref_cnt[ids] == 0]
        q = self.free_block_queue
        if not self.enable_caching:
            q.prepend_n(freed)
            return
        hashed = self.block_hash[freed] != NO_HASH
        q.prepend_n(freed[~hashed])
        q.append_n(freed[hashed])

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
