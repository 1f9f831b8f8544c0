"""The CPU tier's compiled LRU (``tuner/simulator/offload_lru.py``) against plain Python: its heap
pops what ``heapq`` pops, and an eviction takes the least recent idle chunks that are not
protected, or none when there are too few."""

from __future__ import annotations

import heapq
import random

import numpy as np

from kvtune.tuner.simulator import offload_lru as lru
from kvtune.tuner.simulator.offload import CPUTier, RequestOffload


def test_the_heap_pops_in_heapq_order() -> None:
    rng = random.Random(7)
    hr = np.zeros(4000, np.int64)
    hk = np.zeros(4000, np.int64)
    n = 0
    ref: list[tuple[int, int]] = []
    for _ in range(3000):
        if ref and rng.random() < 0.4:
            got = (int(hr[0]), int(hk[0]))
            n = lru.heap_pop(hr, hk, n)
            assert got == heapq.heappop(ref)
        else:
            entry = (rng.randrange(50), rng.randrange(50))  # ties on rank and on both
            n = lru.heap_push(hr, hk, n, *entry)
            heapq.heappush(ref, entry)
        assert n == len(ref)


def test_eviction_takes_the_least_recent_idle_unprotected_chunks() -> None:
    rng = random.Random(11)
    tier = CPUTier(capacity_blocks=60, seconds_per_block=1.0)
    now = 0.0
    for step in range(400):
        keys = sorted(rng.sample(range(200), rng.randrange(1, 12)))
        req = RequestOffload(keys)
        before = tier._state.copy() if len(tier._state) else None
        idle_before = ({int(k): int(tier._rank[k]) for k in np.flatnonzero(tier._state == 0)}
                       if before is not None else {})
        evicted_before = tier.evicted_blocks
        tier.store(req, keys, 0, 16)
        gone = (sorted(int(k) for k in np.flatnonzero((before == 0) & (tier._state[:len(before)]
                                                                        == lru.ABSENT)))
                if before is not None else [])
        assert len(gone) == tier.evicted_blocks - evicted_before
        if gone:
            # The evicted are the least (rank, key) of the idle chunks not offered.
            candidates = sorted((r, k) for k, r in idle_before.items() if k not in keys)
            assert sorted(k for _, k in candidates[:len(gone)]) == gone
        if step % 3 == 0:
            tier.finish(req)
        now += 1.0
        tier.begin_step(now)
        tier.complete(now + rng.choice((0.0, 5.0, 50.0)))
        tier.check_invariants()
    assert tier.evicted_blocks > 0 and tier.size <= 60
