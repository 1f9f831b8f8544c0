"""The block pool, in the style of vLLM's tests/v1/core/test_prefix_caching.py: exact block
ids, reference counts and the exact eviction order on small hand-made cases."""

from __future__ import annotations

import pytest

from kvtune.tuner.simulator.blocks import UNSHARED_HASH, BlockPool


def test_null_block_is_block_0_and_never_handed_out() -> None:
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True)
    assert pool.null_block == 0
    assert pool.free_block_queue.block_ids() == [1, 2, 3, 4]
    blocks = pool.get_new_blocks(4)
    assert blocks.tolist() == [1, 2, 3, 4]
    assert pool.ref_cnt[blocks].tolist() == [1, 1, 1, 1]
    assert pool.get_num_free_blocks() == 0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    pool.check_invariants()


def test_freed_hashed_blocks_go_to_the_back_in_the_order_given() -> None:
    pool = BlockPool(num_gpu_blocks=11, enable_caching=True)
    req0 = pool.get_new_blocks(3)  # 1, 2, 3
    pool.cache_full_blocks(req0, [100, 101, 102], 0, 3)
    # A request frees its blocks in reverse: the chain's tail (3) is evicted first.
    pool.free_blocks(req0[::-1])
    assert pool.free_block_queue.block_ids() == [4, 5, 6, 7, 8, 9, 10, 3, 2, 1]
    pool.check_invariants()
    # Allocation takes the never-used blocks before the cached ones.
    fresh = pool.get_new_blocks(7)
    assert fresh.tolist() == [4, 5, 6, 7, 8, 9, 10]
    assert pool.get_cached_block(102) == req0[2]
    # The next allocation evicts the tail of the cached chain first.
    evicted = pool.get_new_blocks(1)
    assert evicted.tolist() == [3]
    assert pool.get_cached_block(102) is None
    assert pool.get_cached_block(101) == req0[1] and pool.get_cached_block(100) == req0[0]
    assert pool.hash_of(evicted[0]) is None
    pool.check_invariants()


def test_blocks_without_hash_go_to_the_front() -> None:
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True)
    req = pool.get_new_blocks(3)  # 1, 2, 3; only the first two are full
    pool.cache_full_blocks(req, [7, 8], 0, 2)
    pool.free_blocks(req[::-1])
    # Block 3 (partial, no hash) is reused first; 2 then 1 wait at the back.
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 6, 7, 2, 1]
    pool.check_invariants()


def test_caching_off_puts_every_freed_block_at_the_front() -> None:
    pool = BlockPool(num_gpu_blocks=6, enable_caching=False)
    req = pool.get_new_blocks(2)  # 1, 2
    pool.cache_full_blocks(req, [1, 2], 0, 2)  # a no-op without caching
    assert all(pool.hash_of(b) is None for b in req)
    pool.free_blocks(req[::-1])
    assert pool.free_block_queue.block_ids() == [2, 1, 3, 4, 5]


def test_touch_takes_a_cached_block_out_of_the_free_queue() -> None:
    pool = BlockPool(num_gpu_blocks=6, enable_caching=True)
    a = pool.get_new_blocks(2)  # 1, 2
    pool.cache_full_blocks(a, [10, 11], 0, 2)
    pool.free_blocks(a[::-1])
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 2, 1]
    hits = pool.find_longest_cache_hit([10, 11, 12], max_num_blocks=3)
    assert hits.tolist() == [1, 2]
    pool.touch(hits)
    assert pool.ref_cnt[hits].tolist() == [1, 1]
    assert pool.free_block_queue.block_ids() == [3, 4, 5]
    # A second request sharing the prefix: ref_cnt 2; freeing one keeps them out.
    pool.touch(hits)
    pool.free_blocks(hits[::-1])
    assert pool.ref_cnt[hits].tolist() == [1, 1]
    assert pool.free_block_queue.block_ids() == [3, 4, 5]
    pool.free_blocks(hits[::-1])
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 2, 1]
    pool.check_invariants()


def test_longest_hit_stops_at_the_first_miss_and_at_the_cap() -> None:
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True)
    a = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, [1, 2, 3], 0, 3)
    # Chained hashes: a miss in the middle ends the hit even if later blocks are cached.
    assert pool.find_longest_cache_hit([1, 99, 3], 3).tolist() == [1]
    assert pool.find_longest_cache_hit([1, 2, 3], 2).tolist() == [1, 2]
    assert pool.find_longest_cache_hit([5, 1, 2], 3).tolist() == []


def test_unshared_blocks_are_cached_but_never_in_the_map() -> None:
    pool = BlockPool(num_gpu_blocks=7, enable_caching=True)
    a = pool.get_new_blocks(4)  # 1..4: three full blocks and a partial one
    pool.cache_full_blocks(a, [42], 0, 3)  # one shareable key, two unique full blocks
    assert [pool.hash_of(b) for b in a] == [42, None, None, None]
    assert pool.cached_hashes() == {42}
    pool.free_request_blocks(a, num_full_blocks=3, num_keyed_blocks=1)
    # The unique full blocks are hashed (as in vLLM) when freed; the partial block is not.
    assert [pool.hash_of(b) for b in a] == [42, UNSHARED_HASH, UNSHARED_HASH, None]
    # Same order as vLLM's free_blocks(reversed(blocks)): partial block 4 to the front,
    # the hashed ones to the back, tail first.
    assert pool.free_block_queue.block_ids() == [4, 5, 6, 3, 2, 1]
    assert pool.num_cached_free_blocks() == 3
    assert pool.cached_hashes() == {42}
    pool.check_invariants()


def test_free_request_blocks_matches_free_blocks_order() -> None:
    pools = [BlockPool(num_gpu_blocks=9, enable_caching=True) for _ in range(2)]
    for i, pool in enumerate(pools):
        x = pool.get_new_blocks(3)
        y = pool.get_new_blocks(3)
        keys = [10, 11]
        pool.cache_full_blocks(x, keys, 0, 2)
        pool.cache_full_blocks(y, [], 0, 2)
        if i == 0:
            for blocks in (x, y):
                for b in blocks[:2]:
                    if pool.hash_of(b) is None:
                        pool.block_hash[b] = UNSHARED_HASH  # what vLLM's hashing would do
                pool.free_blocks(blocks[::-1])
        else:
            pool.free_request_blocks(x, 2, len(keys))
            pool.free_request_blocks(y, 2, 0)
        pool.check_invariants()
    assert pools[0].free_block_queue.block_ids() == pools[1].free_block_queue.block_ids()


def test_duplicate_hash_keeps_the_first_block() -> None:
    pool = BlockPool(num_gpu_blocks=6, enable_caching=True)
    a = pool.get_new_blocks(1)
    b = pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [7], 0, 1)
    pool.cache_full_blocks(b, [7], 0, 1)
    assert pool.get_cached_block(7) == a[0]
    pool.free_blocks(b)
    pool.free_blocks(a)
    # Evicting the duplicate (b, freed first, so evicted after the fresh blocks) keeps a.
    pool.get_new_blocks(3)  # 3, 4, 5
    assert pool.get_new_blocks(1).tolist() == [b[0]]
    assert pool.get_cached_block(7) == a[0]
    pool.check_invariants()


def test_usage_counts_usable_blocks_only() -> None:
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True)
    assert pool.get_usage() == 0.0
    pool.get_new_blocks(2)
    assert pool.get_usage() == pytest.approx(0.5)
