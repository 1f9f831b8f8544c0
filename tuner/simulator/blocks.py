"""The paged KV cache as vLLM V1 keeps it: blocks, the free-block queue, the block pool.

Nouns and behaviour follow ``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py``
(vLLM 0.33.0), so a simulated run can be read against vLLM's own:

- ``KVCacheBlock`` is plain data: ``block_id``, ``ref_cnt``, ``block_hash``. A full block
  gets its hash once (``cache_full_blocks``) and keeps it while it sits in the free queue,
  so a later request can take it back (``touch``); it loses the hash only when it is handed
  out again (``get_new_blocks`` evicts it from the cache).
- ``FreeKVCacheBlockQueue`` is the LRU eviction order. At start it holds every block by id;
  ``popleft`` takes the least recently used. vLLM 0.33's ``free_blocks`` puts blocks without
  a hash (or all blocks when caching is off) at the *front* (reused first) and hashed blocks
  at the *back*, each in the order given; callers free a request's blocks in reverse, so
  the tail of a prefix chain is evicted before its head.
- Block 0 is the null block: taken out of the queue at start, never allocated.

The queue is an ``OrderedDict`` (C-implemented: O(1) pop-front, append, prepend and remove
from the middle) rather than vLLM's hand-threaded linked list; the order it keeps is the
same. Hashes here are opaque ints made by ``prefix.py``; ``UNSHARED_HASH`` marks a full
block whose content no other request can ever ask for (see ``prefix.py``): it is cached
(it keeps its LRU position as a hashed block) but never entered in the hash map, because
a lookup for it can never come.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

# A full block whose content is unique to one request: hashed in vLLM, but no lookup can
# ever find it, so the simulator skips the map entry (and the cost of a real key).
UNSHARED_HASH = -1


class KVCacheBlock:
    """One KV-cache block: ``block_size`` token slots in every layer."""

    __slots__ = ("block_hash", "block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        # None: not full or not cached; UNSHARED_HASH or a key from prefix.py otherwise.
        self.block_hash: int | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={self.block_hash})"


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: the front is evicted (reused) first.

    1. At start the order is by block id.
    2. A freed block goes to the back (hashed: stays a cache candidate as long as possible)
       or to the front (no hash: nothing to keep).
    3. Blocks of one request are freed tail first, so among blocks freed together the one
       holding more of the prefix chain (its tail) is evicted first.

    Keyed by the block objects themselves (identity hash): pop-front, append, prepend and
    removal from the middle are each one C-level dict operation.
    """

    __slots__ = ("_queue",)

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._queue: OrderedDict[KVCacheBlock, None] = OrderedDict.fromkeys(blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._queue)

    def popleft(self) -> KVCacheBlock:
        if not self._queue:
            raise ValueError("No free blocks available")
        return self._queue.popitem(last=False)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        assert n <= len(self._queue), f"popleft_n({n}) with {len(self._queue)} free"
        pop = self._queue.popitem
        return [pop(False)[0] for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        del self._queue[block]

    def append(self, block: KVCacheBlock) -> None:
        self._queue[block] = None

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        # A plain loop: OrderedDict.update(dict) measured 4x slower per block (CPython 3.11).
        q = self._queue
        for b in blocks:
            q[b] = None

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put ``blocks`` at the front, keeping their order (blocks[0] evicted first)."""
        q = self._queue
        move = q.move_to_end
        for b in reversed(blocks):
            q[b] = None
            move(b, False)

    def block_ids(self) -> list[int]:
        """The queue front to back (for tests and debugging)."""
        return [b.block_id for b in self._queue]

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block in self._queue


class BlockPool:
    """Owns every block, the free queue and the prefix-cache map (hash -> block).

    The map holds every cached copy of a hash, as vLLM's ``BlockHashToBlockMap``: a lookup
    returns the earliest-cached copy still there; evicting it exposes the next. Duplicates
    come from the hit cap (a prompt that ends on a block boundary recomputes its last full
    block even when it is cached: the same identical prompt sent twice makes two copies),
    and from a request that computes a block another request computes later. The first
    copy lives in ``cached_block_hash_to_block``, the later ones (rare) in
    ``duplicate_blocks``, so the common path is one dict lookup.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks={num_gpu_blocks}: the pool needs the null block plus at "
                "least one usable block; give the KV cache more memory"
            )
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[int, KVCacheBlock] = {}
        # hash -> later copies, in the order they were cached (see the class doc).
        self.duplicate_blocks: dict[int, list[KVCacheBlock]] = {}
        # Blocks holding a hash (in the map or UNSHARED_HASH), whether in use or free.
        self.num_hashed_blocks = 0
        self.null_block = self.free_block_queue.popleft()
        # Counters for the report (vLLM's prefix-cache stats count tokens, not blocks).
        self.num_evicted_cached_blocks = 0

    # -- lookups ---------------------------------------------------------------------------

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[int], max_num_blocks: int
    ) -> list[KVCacheBlock]:
        """The run of cached blocks from the start of ``block_hashes`` (chained hashes: the
        first miss ends the hit), at most ``max_num_blocks`` long."""
        hits: list[KVCacheBlock] = []
        get = self.cached_block_hash_to_block.get
        for h in block_hashes[:max_num_blocks]:
            b = get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    # -- allocation ------------------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue._queue)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` from the front of the free queue, evicting their cached
        content (vLLM's ``_maybe_evict_cached_block``)."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        pop = self.free_block_queue._queue.popitem
        ret: list[KVCacheBlock] = []
        add = ret.append
        cache = self.cached_block_hash_to_block
        unhashed = 0
        for _ in range(num_blocks):
            b = pop(False)[0]
            h = b.block_hash
            if h is not None:
                if h != UNSHARED_HASH and cache.get(h) is b:
                    del cache[h]
                    self.num_evicted_cached_blocks += 1
                    if self.duplicate_blocks:
                        self._promote_duplicate(h)
                elif self.duplicate_blocks and b in self.duplicate_blocks.get(h, ()):
                    self._drop_duplicate(h, b)
                    self.num_evicted_cached_blocks += 1
                b.block_hash = None
                unhashed += 1
            b.ref_cnt = 1
            add(b)
        self.num_hashed_blocks -= unhashed
        return ret

    def _promote_duplicate(self, h: int) -> None:
        copies = self.duplicate_blocks.get(h)
        if copies:
            self.cached_block_hash_to_block[h] = copies.pop(0)
            if not copies:
                del self.duplicate_blocks[h]

    def _drop_duplicate(self, h: int, b: KVCacheBlock) -> None:
        copies = self.duplicate_blocks[h]
        copies.remove(b)
        if not copies:
            del self.duplicate_blocks[h]

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A prefix hit takes a reference; a free cached block leaves the free queue."""
        q = self.free_block_queue._queue
        for b in blocks:
            if b.ref_cnt == 0:
                del q[b]
            b.ref_cnt += 1

    def cache_full_blocks(
        self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[int],
        num_cached_blocks: int, num_full_blocks: int,
    ) -> None:
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hash from
        ``block_hashes`` (the request's shareable keys). Full blocks past the shareable
        prefix are hashed in vLLM too, but no lookup can ever find them, so they are marked
        ``UNSHARED_HASH`` only when freed (``free_request_blocks``): same eviction order,
        no per-block work while they are in use."""
        if not self.enable_caching:
            return
        cache = self.cached_block_hash_to_block
        end = min(len(block_hashes), num_full_blocks)
        hashed = 0
        for i in range(num_cached_blocks, end):
            b = blocks[i]
            if b.block_hash is not None:
                continue  # a prefix hit: already cached under this hash
            h = block_hashes[i]
            b.block_hash = h
            if cache.setdefault(h, b) is not b:
                # A second copy of a cached block: kept, as vLLM does (class doc).
                self.duplicate_blocks.setdefault(h, []).append(b)
            hashed += 1
        self.num_hashed_blocks += hashed

    def free_request_blocks(self, blocks: Sequence[KVCacheBlock], num_full_blocks: int) -> None:
        """Free one request's block table the way vLLM does (``free_blocks`` of the blocks in
        reverse), where its first ``num_full_blocks`` blocks are full and therefore hashed:
        those without a shareable key get ``UNSHARED_HASH`` now."""
        if not self.enable_caching:
            self.free_blocks(reversed(blocks))
            return
        first: list[KVCacheBlock] = []
        last: list[KVCacheBlock] = []
        # Reverse order: the partial tail blocks come first, then the full blocks.
        for b in reversed(blocks[num_full_blocks:]):
            b.ref_cnt -= 1
            if not b.ref_cnt:
                (first if b.block_hash is None else last).append(b)
        marked = 0
        for b in reversed(blocks[:num_full_blocks]):
            b.ref_cnt -= 1
            if not b.ref_cnt:
                if b.block_hash is None:
                    b.block_hash = UNSHARED_HASH
                    marked += 1
                last.append(b)
        self.num_hashed_blocks += marked
        if first:
            self.free_block_queue.prepend_n(first)
        if last:
            self.free_block_queue.append_n(last)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks reaching zero go back to the queue,
        hashed ones at the back, the others at the front, each in the order given (the
        first is evicted first). Callers pass a request's blocks in reverse."""
        first: list[KVCacheBlock] = []
        last: list[KVCacheBlock] = []
        if self.enable_caching:
            for b in ordered_blocks:
                b.ref_cnt -= 1
                if not b.ref_cnt:
                    (first if b.block_hash is None else last).append(b)
        else:
            for b in ordered_blocks:
                b.ref_cnt -= 1
                if not b.ref_cnt:
                    first.append(b)
        if first:
            self.free_block_queue.prepend_n(first)
        if last:
            self.free_block_queue.append_n(last)

    # -- accounting ------------------------------------------------------------------------

    def get_usage(self) -> float:
        """Fraction of usable blocks not in the free queue (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a hash (eviction candidates of the prefix cache)."""
        return sum(1 for b in self.free_block_queue._queue if b.block_hash is not None)

    def check_invariants(self) -> None:
        """Conservation: every usable block is exactly one of in use (ref_cnt > 0), free and
        cached (hash kept), or free and empty; the map points only at hashed blocks."""
        q = self.free_block_queue._queue
        in_use = 0
        free_cached = 0
        free_empty = 0
        hashed = 0
        for b in self.blocks[1:]:
            assert b.ref_cnt >= 0, b
            in_q = b in q
            assert in_q == (b.ref_cnt == 0), f"{b} in free queue={in_q}"
            if b.block_hash is not None:
                hashed += 1
            if b.ref_cnt > 0:
                in_use += 1
            elif b.block_hash is not None:
                free_cached += 1
            else:
                free_empty += 1
        assert self.null_block not in q and self.null_block.block_hash is None
        assert in_use + free_cached + free_empty == self.num_gpu_blocks - 1
        assert free_cached + free_empty == len(q)
        assert hashed == self.num_hashed_blocks, (hashed, self.num_hashed_blocks)
        for h, b in self.cached_block_hash_to_block.items():
            assert b.block_hash == h, (h, b)
        for h, copies in self.duplicate_blocks.items():
            assert copies and h in self.cached_block_hash_to_block, h
            for b in copies:
                assert b.block_hash == h and b is not self.cached_block_hash_to_block[h], b
