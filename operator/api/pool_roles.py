"""The rules between pools with a role (prefill/decode disaggregation, docs/disaggregation.md):
a decode pool's ``prefillPool`` names a prefill pool of the same spec, and each prefill pool is
named by exactly one decode pool (kvtune plans, checks and rolls out the two as a pair).

CEL rules on the spec (so ``kubectl apply`` refuses them) and the same checks in Python (for a
spec read from a file or the API before CEL existed). Part of ``kvtune.operator.api``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtune.operator.api.pool_spec import _POOL_KEY, PoolSpec

_KEY_P, _KEY_Q = _POOL_KEY.format(v="p"), _POOL_KEY.format(v="q")
PEER_EXISTS = "a decode pool's prefillPool must name a pool of this spec with role: prefill; " \
              "fix pools[].prefillPool"
PREFILL_PAIRED = "a pool with role: prefill must be named by the prefillPool of exactly one " \
                 "decode pool; add that decode pool or drop role: prefill"
ROLE_RULES: tuple[tuple[str, str], ...] = (
    (f"self.pools.all(p, !has(p.prefillPool) || self.pools.exists(q, {_KEY_Q} == "
     "p.prefillPool && has(q.role) && q.role == 'prefill'))", PEER_EXISTS),
    ("self.pools.all(p, !has(p.role) || p.role != 'prefill' || self.pools.exists_one(q, "
     f"has(q.prefillPool) && q.prefillPool == {_KEY_P}))", PREFILL_PAIRED),
)


def check_pairs(pools: Sequence[PoolSpec]) -> None:
    """``ROLE_RULES`` in Python: ``ValueError`` naming the pool."""
    by_name = {p.pool_name: p for p in pools}
    for i, pool in enumerate(pools):
        if pool.prefill_pool is not None:
            peer = by_name.get(pool.prefill_pool)
            if peer is None or peer.role != "prefill":
                raise ValueError(f"spec.pools[{i}].prefillPool={pool.prefill_pool!r}: "
                                 f"{PEER_EXISTS}")
        if pool.role == "prefill":
            named = [q for q in pools if q.prefill_pool == pool.pool_name]
            if len(named) != 1:
                raise ValueError(f"spec.pools[{i}] ({pool.pool_name}): named by "
                                 f"{len(named)} decode pools; {PREFILL_PAIRED}")


def pair_of(pools: Sequence[PoolSpec], pool: PoolSpec) -> tuple[PoolSpec, PoolSpec] | None:
    """(prefill pool, decode pool) of the pair ``pool`` belongs to; None without a role."""
    if pool.role is None:
        return None
    if pool.role == "decode":
        prefill = next(p for p in pools if p.pool_name == pool.prefill_pool)
        return prefill, pool
    decode = next(p for p in pools if p.prefill_pool == pool.pool_name)
    return pool, decode
