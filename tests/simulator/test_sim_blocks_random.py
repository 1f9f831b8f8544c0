"""The block pool's compiled loops against a plain reference of vLLM 0.33's pool, on random
operation sequences: one Python object per block, a list for the free queue and a list of
copies per hash, written from ``vllm/v1/core/block_pool.py`` (``get_new_blocks`` evicts,
``touch`` takes hits out of the queue, ``free_blocks`` puts unhashed blocks at the front and
hashed ones at the back, each in the order given; callers free a table in reverse).

The loops run without bounds checks, so every operation is followed by a full comparison:
the queue's order, each block's references and hash, and every key's lookup."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtune.tuner.simulator.blocks import NO_HASH, UNSHARED_HASH, BlockPool


class ReferencePool:
    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.caching = caching
        self.queue = list(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.hash: list[int] = [NO_HASH] * num_blocks
        self.copies: dict[int, list[int]] = {}  # key -> blocks holding it, cache order

    def get_new_blocks(self, n: int) -> list[int]:
        taken, self.queue = self.queue[:n], self.queue[n:]
        for b in taken:
            h = self.hash[b]
            if h >= 0:
                self.copies[h].remove(b)
                if not self.copies[h]:
                    del self.copies[h]
            self.hash[b] = NO_HASH
            self.ref[b] = 1
        return taken

    def lookup(self, key: int) -> int | None:
        held = self.copies.get(key)
        return held[0] if held else None

    def longest_hit(self, keys: list[int], limit: int) -> list[int]:
        out = []
        for k in keys[:limit]:
            b = self.lookup(k)
            if b is None:
                break
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1

    def cache(self, blocks: list[int], keys: list[int], start: int, end: int) -> None:
        if not self.caching:
            return
        for i in range(start, min(len(keys), end)):
            b = blocks[i]
            if self.hash[b] == NO_HASH:
                self.hash[b] = keys[i]
                self.copies.setdefault(keys[i], []).append(b)

    def free(self, blocks: list[int], num_full: int, num_keyed: int) -> None:
        if self.caching:
            for b in blocks[num_keyed:num_full]:
                self.hash[b] = UNSHARED_HASH
        front, back = [], []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (back if self.caching and self.hash[b] != NO_HASH else front).append(b)
        self.queue = front + self.queue + back


@dataclass
class Req:
    keys: list[int]
    blocks: list[int] = field(default_factory=list)
    num_cached: int = 0


def _same(pool: BlockPool, ref: ReferencePool, num_keys: int) -> None:
    pool.check_invariants()
    assert pool.free_block_queue.block_ids() == ref.queue
    assert pool.get_num_free_blocks() == len(ref.queue)
    assert pool.ref_cnt.tolist() == ref.ref
    assert pool.block_hash.tolist() == ref.hash
    for k in range(num_keys):
        assert pool.get_cached_block(k) == ref.lookup(k), f"key {k}"


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), caching=st.booleans())
def test_random_operations_match_the_reference_pool(seed: int, caching: bool) -> None:
    rnd = random.Random(seed)
    num_blocks = rnd.randint(3, 40)
    pool, ref = BlockPool(num_blocks, caching), ReferencePool(num_blocks, caching)
    num_keys = 0
    live: list[Req] = []
    for _ in range(60):
        op = rnd.random()
        if op < 0.35 or not live:
            # A new request: a chain sharing a prefix with an earlier one, then its own keys.
            base = rnd.choice(live).keys if live and rnd.random() < 0.7 else []
            shared = base[:rnd.randint(0, len(base))]
            own = rnd.randint(0, 6)
            keys = shared + list(range(num_keys, num_keys + own))
            num_keys += own
            pool.reserve_keys(max(num_keys, 1))
            limit = rnd.randint(0, len(keys))
            hits = pool.find_longest_cache_hit(keys, limit).tolist()
            assert hits == ref.longest_hit(keys, limit)
            # The admission check's one pass: the same length and free hits.
            free_hits = sum(1 for b in hits if b in ref.queue)
            assert pool.cache_hit_need(np.asarray(keys, np.int64), limit) == (
                len(hits), free_hits)
            new = rnd.randint(0 if hits else 1, 4)
            if new + pool.num_free_among(hits) > pool.get_num_free_blocks():
                continue
            pool.touch(hits)
            ref.touch(hits)
            got = pool.get_new_blocks(new).tolist()
            assert got == ref.get_new_blocks(new)
            live.append(Req(keys, hits + got, len(hits)))
        elif op < 0.55:
            # Compute more of a request: its next full blocks get their keys.
            r = rnd.choice(live)
            full = rnd.randint(r.num_cached, len(r.blocks))
            pool.cache_full_blocks(r.blocks, r.keys, r.num_cached, full)
            ref.cache(r.blocks, r.keys, r.num_cached, full)
            r.num_cached = max(r.num_cached, full)
        elif op < 0.7:
            # A decode step crosses into new blocks.
            r = rnd.choice(live)
            k = rnd.randint(1, 3)
            if k > pool.get_num_free_blocks():
                continue
            got = pool.get_new_blocks(k).tolist()
            assert got == ref.get_new_blocks(k)
            r.blocks += got
        else:
            # Finished (or preempted): the table goes back, tail first.
            r = live.pop(rnd.randrange(len(live)))
            keyed = min(len(r.keys), r.num_cached)
            pool.free_request_blocks(r.blocks, r.num_cached, keyed)
            ref.free(r.blocks, r.num_cached, keyed)
        _same(pool, ref, num_keys)
