"""The block pool's compiled loops (``compiled.py``, numba), apart from the pool (``blocks.py``).

Each is one pool operation over int64 arrays, in the order vLLM's per-block Python takes
the blocks. They write the arrays they are given and return what the caller's bookkeeping
needs. (The map's later copies live in a dict, so those stay in Python: the loops report
the (block, hash) pairs in ``pairs``, 2 entries each.)

Why a module of their own: numba compiles these from their Python bytecode, and the modules
around them may be compiled by mypyc instead (``scripts/compile_simulator.py``), which leaves
no bytecode to compile. Keeping the loops here keeps both compilers' inputs apart.
"""

from __future__ import annotations

import numpy as np

from kvtune.tuner.simulator.compiled import compiled

# A full block whose content is unique to one request: hashed in vLLM, but no lookup can
# ever find it, so the simulator skips the map entry (and the cost of a real key).
UNSHARED_HASH = -1
# Not cached: not full, or handed out again since it was.
NO_HASH = -2


@compiled
def popleft(slots: np.ndarray, position: np.ndarray, head: int, out: np.ndarray) -> int:
    """Fill ``out`` with the queue's first ``len(out)`` blocks from ``head`` (skipping stale
    entries: their block is elsewhere now); the new head."""
    i = head
    for j in range(len(out)):
        b = slots[i]
        while position[b] != i:
            i += 1
            b = slots[i]
        out[j] = b
        position[b] = -1
        i += 1
    return i


@compiled
def hand_out(taken: np.ndarray, block_hash: np.ndarray, ref_cnt: np.ndarray,
              has_copies: np.ndarray, pairs: np.ndarray) -> int:
    """Blocks handed out lose their hash (their map entries go stale with it) and get one
    reference. Those whose hash has later copies are reported (the caller moves the map's
    entry); their count."""
    m = 0
    for j in range(len(taken)):
        b = taken[j]
        h = block_hash[b]
        if h >= 0 and has_copies[h]:
            pairs[2 * m] = b
            pairs[2 * m + 1] = h
            m += 1
        block_hash[b] = NO_HASH
        ref_cnt[b] = 1
    return m


@compiled
def take_front(slots: np.ndarray, position: np.ndarray, head: int, taken: np.ndarray,
                block_hash: np.ndarray, ref_cnt: np.ndarray, has_copies: np.ndarray,
                pairs: np.ndarray) -> tuple[int, int]:
    """``popleft`` then ``hand_out``: the new head, the number of copies."""
    head = popleft(slots, position, head, taken)
    return head, hand_out(taken, block_hash, ref_cnt, has_copies, pairs)


@compiled
def hit_length(keys: np.ndarray, limit: int, key_block: np.ndarray,
                block_hash: np.ndarray) -> int:
    """How many of the first ``limit`` keys are cached, up to the first miss. A key with
    no entry maps to the null block, whose hash is NO_HASH: never a hit."""
    for i in range(limit):
        k = keys[i]
        if block_hash[key_block[k]] != k:
            return i
    return limit


@compiled
def hit_need(keys: np.ndarray, limit: int, key_block: np.ndarray, block_hash: np.ndarray,
              ref_cnt: np.ndarray) -> tuple[int, int]:
    """``hit_length``, with how many of the hit blocks have no reference (free)."""
    free = 0
    for i in range(limit):
        k = keys[i]
        b = key_block[k]
        if block_hash[b] != k:
            return i, free
        if ref_cnt[b] == 0:
            free += 1
    return limit, free


@compiled
def touch(ids: np.ndarray, ref_cnt: np.ndarray, position: np.ndarray) -> int:
    """Each block takes a reference; free ones leave the queue (``remove``). How many
    left it."""
    left = 0
    for j in range(len(ids)):
        b = ids[j]
        if ref_cnt[b] == 0:
            position[b] = -1
            left += 1
        ref_cnt[b] += 1
    return left


@compiled
def cache_blocks(blocks: np.ndarray, keys: np.ndarray, start: int, end: int,
                  block_hash: np.ndarray, key_block: np.ndarray, has_copies: np.ndarray,
                  pairs: np.ndarray) -> int:
    """Blocks ``[start, end)`` that hold no hash get their key (the others are prefix hits,
    cached already). A key whose map entry is live already keeps it: the block is a later
    copy, reported. Whether an entry is live is read for all blocks before any gets its
    key: an entry that is one of these very blocks (from when it held the key before) is
    not live, as the block holds none now. The number of copies."""
    state = np.zeros(end - start, dtype=np.int8)  # 0: cached already, 1: new, 2: new copy
    for i in range(start, end):
        if block_hash[blocks[i]] == NO_HASH:
            k = keys[i]
            state[i - start] = 2 if block_hash[key_block[k]] == k else 1
    m = 0
    for i in range(start, end):
        s = state[i - start]
        if s:
            b = blocks[i]
            k = keys[i]
            block_hash[b] = k
            if s == 2:
                has_copies[k] = True
                pairs[2 * m] = b
                pairs[2 * m + 1] = k
                m += 1
            else:
                key_block[k] = b
    return m


@compiled
def free_table(table: np.ndarray, num_full: int, num_keyed: int, caching: bool,
                ref_cnt: np.ndarray, block_hash: np.ndarray, slots: np.ndarray,
                position: np.ndarray, head: int, tail: int) -> tuple[int, int]:
    """vLLM's ``free_blocks`` of a request's table in reverse: each block drops a
    reference; those reaching zero go to the queue's front if they hold no hash (every
    block, without caching), to its back if they do, each side in that reverse order. Full
    blocks ``[num_keyed, num_full)`` get ``UNSHARED_HASH`` first. There must be room for
    ``len(table)`` slots on each side. The new head and tail."""
    if caching:
        for i in range(num_keyed, num_full):
            block_hash[table[i]] = UNSHARED_HASH
    # One pass in reverse: the back is filled in order; the front's blocks are written
    # from the old head down (its last first), then moved up to the new head.
    h, t = head, tail
    for i in range(len(table) - 1, -1, -1):
        b = table[i]
        ref_cnt[b] -= 1
        if ref_cnt[b] != 0:
            continue
        if not caching or (i >= num_full and block_hash[b] == NO_HASH):
            h -= 1
            slots[h] = b
        else:
            slots[t] = b
            position[b] = t
            t += 1
    # slots[h:head] holds the front's blocks last first: reverse them in place.
    lo, hi = h, head - 1
    while lo < hi:
        slots[lo], slots[hi] = slots[hi], slots[lo]
        lo += 1
        hi -= 1
    for j in range(h, head):
        position[slots[j]] = j
    return h, t
