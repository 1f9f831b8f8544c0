"""The CPU tier's chunk table and LRU as compiled loops over int64 arrays (``offload.py``).

Why: a multi-turn prompt stores, reuses and re-ranks hundreds of chunks (a Mooncake prompt
holds ~900 blocks of 16 tokens), and the LRU's lazily cleaned heap pops several entries per
eviction. As Python dicts and ``heapq`` tuples that was ~95% of a replay with offload (10-70x
slower than without); as arrays indexed by the dense block keys (``prefix.KeySpace``) and
one compiled call per tier operation it is a few microseconds per call.

What the loops keep (``CPUTier`` holds the arrays; the semantics are ``offload.py``'s):

- ``state[key]``: ``ABSENT`` (not in the tier), ``WRITING``, 0 (idle) or n > 0 loads reading it;
- ``rank[key]``: its LRU rank, ``pack_rank(major, position)`` (lower is evicted first);
- ``loading[key]``: loads in flight that bring it (a lookup meeting one defers);
- the heap: (rank, key) pairs of idle chunks, lazily cleaned (an entry whose key is no longer
  idle at that rank is skipped), ordered as Python orders the tuples. Which stale entries
  it holds never matters: an eviction takes the ``count`` least (rank, key) idle chunks not
  protected, whatever else the heap holds;
- a request's ``seen[i]``: the key it met at prompt chunk ``i`` (``NOT_SEEN``: none yet);
  a chunk's token position is ``(i + 1) * block_size``, so "sorted by position" is "by i".

Counters (``ctr``): the next request rank, the heap's length and the idle chunks (an
eviction that cannot succeed is known without a pass over the heap: a store the tier cannot
make room for is offered again at every schedule until it can).
"""

from __future__ import annotations

import numpy as np

from kvtune.tuner.simulator.compiled import compiled

ABSENT = -2
WRITING = -1
NOT_SEEN = -1
# A rank is (major, minor) in vLLM: (request rank, -token position) or (fresh, 0), packed into
# one int64 (minor in the low bits) so ranks compare as ints. 28 bits of position (268M
# tokens, far past any max-model-len) leave 35 bits of major: ranks are taken once per
# request and once per chunk a finished request refreshes (~10M on an hour of traffic).
MINOR_BITS = 28
MAX_POSITION = (1 << MINOR_BITS) - 1
# ``ctr``'s slots.
NEXT_RANK, HEAP_LEN, IDLE = 0, 1, 2


@compiled
def pack_rank(major: int, position: int) -> int:
    return (major << MINOR_BITS) + MAX_POSITION - position


@compiled
def heap_push(hr: np.ndarray, hk: np.ndarray, n: int, r: int, k: int) -> int:
    """Push (r, k) on the heap of length ``n`` (room assured by the caller); the new length."""
    i = n
    while i > 0:
        p = (i - 1) >> 1
        pr = hr[p]
        if r < pr or (r == pr and k < hk[p]):
            hr[i] = pr
            hk[i] = hk[p]
            i = p
        else:
            break
    hr[i] = r
    hk[i] = k
    return n + 1


@compiled
def heap_pop(hr: np.ndarray, hk: np.ndarray, n: int) -> int:
    """Remove the least entry (``hr[0], hk[0]``, read it first) of a heap of length ``n`` > 0;
    the new length."""
    n -= 1
    r = hr[n]
    k = hk[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (hr[c + 1] < hr[c] or (hr[c + 1] == hr[c] and hk[c + 1] < hk[c])):
            c += 1
        if hr[c] < r or (hr[c] == r and hk[c] < k):
            hr[i] = hr[c]
            hk[i] = hk[c]
            i = c
        else:
            break
    if n > 0:
        hr[i] = r
        hk[i] = k
    return n


@compiled
def set_rank(state: np.ndarray, rank: np.ndarray, hr: np.ndarray, hk: np.ndarray,
             ctr: np.ndarray, key: int, r: int) -> None:
    rank[key] = r
    if state[key] == 0:
        ctr[HEAP_LEN] = heap_push(hr, hk, ctr[HEAP_LEN], r, key)


@compiled
def access(keys: np.ndarray, chunks: np.ndarray, seen: np.ndarray, req_rank: int,
           block_size: int, state: np.ndarray, rank: np.ndarray, hr: np.ndarray,
           hk: np.ndarray, ctr: np.ndarray) -> int:
    """vLLM's ``on_request_access`` for ``keys`` at prompt chunks ``chunks``: chunks the
    request meets for the first time rise to its rank (never fall); it takes a rank at the
    first such chunk. Returns the request's rank (0: still none)."""
    for i in range(len(keys)):
        key = keys[i]
        c = chunks[i]
        if seen[c] == key:
            continue
        if req_rank == 0:
            ctr[NEXT_RANK] += 1
            req_rank = ctr[NEXT_RANK]
        seen[c] = key
        if state[key] != ABSENT:
            r = pack_rank(req_rank, (c + 1) * block_size)
            if rank[key] < r:
                set_rank(state, rank, hr, hk, ctr, key, r)
    return req_rank


@compiled
def finish(seen: np.ndarray, state: np.ndarray, rank: np.ndarray, hr: np.ndarray,
           hk: np.ndarray, ctr: np.ndarray) -> None:
    """What the request stored or reused becomes the most recent, tail first, head last."""
    for c in range(len(seen) - 1, -1, -1):
        key = seen[c]
        if key != NOT_SEEN and state[key] != ABSENT:
            ctr[NEXT_RANK] += 1
            set_rank(state, rank, hr, hk, ctr, key, pack_rank(ctr[NEXT_RANK], 0))


@compiled
def evict(count: int, protected: np.ndarray, state: np.ndarray, rank: np.ndarray,
          mark: np.ndarray, epoch: int, hr: np.ndarray, hk: np.ndarray, ctr: np.ndarray
          ) -> bool:
    """Evict the ``count`` least recent idle chunks not ``protected`` (their ``state`` set to
    ``ABSENT``); False, nothing evicted, when there are not that many. ``mark`` is scratch
    (one slot per key) that ``epoch`` and ``epoch + 1`` are new to."""
    idle_protected = 0
    for k in protected:
        if state[k] == 0 and mark[k] != epoch:
            idle_protected += 1
        mark[k] = epoch  # protected
    if ctr[IDLE] - idle_protected < count:
        return False  # not that many idle chunks to evict (what the heap pass would find)
    chosen_r = np.empty(count, np.int64)
    chosen_k = np.empty(count, np.int64)
    kept_r = np.empty(len(protected), np.int64)
    kept_k = np.empty(len(protected), np.int64)
    num_chosen = 0
    num_kept = 0
    n = ctr[HEAP_LEN]
    while n > 0 and num_chosen < count:
        r = hr[0]
        key = hk[0]
        n = heap_pop(hr, hk, n)
        if state[key] != 0 or rank[key] != r or mark[key] == epoch + 1:
            continue  # stale, or a second entry of the same rank
        if mark[key] == epoch:
            kept_r[num_kept] = r
            kept_k[num_kept] = key
            num_kept += 1
        else:
            chosen_r[num_chosen] = r
            chosen_k[num_chosen] = key
            num_chosen += 1
        mark[key] = epoch + 1  # taken
    ok = num_chosen >= count
    for i in range(num_kept):
        n = heap_push(hr, hk, n, kept_r[i], kept_k[i])
    for i in range(num_chosen):
        if ok:
            state[chosen_k[i]] = ABSENT
        else:
            n = heap_push(hr, hk, n, chosen_r[i], chosen_k[i])
    ctr[HEAP_LEN] = n
    if ok:
        ctr[IDLE] -= count
    return ok


@compiled
def offer(keys: np.ndarray, first_chunk: int, seen: np.ndarray, req_rank: int,
          block_size: int, state: np.ndarray, rank: np.ndarray, hr: np.ndarray,
          hk: np.ndarray, ctr: np.ndarray, was_new: np.ndarray) -> tuple[int, int]:
    """A store's offer of ``keys`` (prompt chunks ``first_chunk``...): which are new (into
    ``was_new``), and the access of those the LRU sees (new or readable, not being written).
    Returns the request's rank and how many are new."""
    num_new = 0
    for i in range(len(keys)):
        was_new[i] = state[keys[i]] == ABSENT
        num_new += was_new[i]
    for i in range(len(keys)):
        key = keys[i]
        if state[key] == WRITING:
            continue
        c = first_chunk + i
        if seen[c] == key:
            continue
        if req_rank == 0:
            ctr[NEXT_RANK] += 1
            req_rank = ctr[NEXT_RANK]
        seen[c] = key
        if state[key] != ABSENT:
            r = pack_rank(req_rank, (c + 1) * block_size)
            if rank[key] < r:
                set_rank(state, rank, hr, hk, ctr, key, r)
    return req_rank, num_new


@compiled
def write_new(keys: np.ndarray, first_chunk: int, major: int, block_size: int,
              was_new: np.ndarray, state: np.ndarray, rank: np.ndarray, out: np.ndarray
              ) -> int:
    """The new chunks of a store start being written at ``major``'s rank; their keys into
    ``out``; how many."""
    n = 0
    for i in range(len(keys)):
        if was_new[i]:
            key = keys[i]
            state[key] = WRITING
            rank[key] = pack_rank(major, (first_chunk + i + 1) * block_size)
            out[n] = key
            n += 1
    return n


@compiled
def lookup(keys: np.ndarray, state: np.ndarray, loading: np.ndarray) -> int:
    """Consecutive stored chunks from ``keys[0]``; -1 when one is being written or loaded."""
    n = 0
    pending = False
    for key in keys:
        if key >= len(state):
            break  # a key the tier never held
        s = state[key]
        if s == ABSENT:
            break
        if s == WRITING or loading[key] > 0:
            pending = True
        n += 1
    return -1 if pending else n


@compiled
def start_load(keys: np.ndarray, state: np.ndarray, loading: np.ndarray, ctr: np.ndarray
               ) -> bool:
    """A load of ``keys`` begins (False, nothing changed: one is still being written)."""
    for key in keys:
        if state[key] < 0:
            return False
    for key in keys:
        if state[key] == 0:
            ctr[IDLE] -= 1
        state[key] += 1
        loading[key] += 1
    return True


@compiled
def complete(keys: np.ndarray, is_store: bool, state: np.ndarray, rank: np.ndarray,
             loading: np.ndarray, hr: np.ndarray, hk: np.ndarray, ctr: np.ndarray) -> bool:
    """A transfer of ``keys`` is done: written chunks become idle, loaded ones lose a reader
    (idle at none). False when a loaded chunk had no reader (a broken invariant)."""
    for key in keys:
        s = state[key]
        if is_store:
            if s == WRITING:
                state[key] = 0
                ctr[IDLE] += 1
                ctr[HEAP_LEN] = heap_push(hr, hk, ctr[HEAP_LEN], rank[key], key)
            continue
        if s <= 0:
            return False
        loading[key] -= 1
        state[key] = s - 1
        if s == 1:
            ctr[IDLE] += 1
            ctr[HEAP_LEN] = heap_push(hr, hk, ctr[HEAP_LEN], rank[key], key)
    return True


@compiled
def idle_heap(state: np.ndarray, rank: np.ndarray, hr: np.ndarray, hk: np.ndarray) -> int:
    """The heap rebuilt from the idle chunks alone (no stale entries); its length."""
    n = 0
    for key in range(len(state)):
        if state[key] == 0:
            n = heap_push(hr, hk, n, rank[key], key)
    return n
