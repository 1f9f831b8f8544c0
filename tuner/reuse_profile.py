"""How a trace reuses its KV: the figures a tier is sized from (``WorkloadProfile``'s
``prefix_reuse_gap_seconds``, ``prefix_reuse_distance_tokens``, ``session_gap_seconds``).

Read from the prefix-block ids a Mooncake trace carries (Azure traces carry none: nothing is
observed). Every prompt is a run of blocks keyed by (position, id) (ids are chained, so a key
implies its prefix); every block use after the first is a *reuse*:

- its **gap** is the seconds since the block's previous use;
- its **distance** is the distinct prompt tokens used in between (each block counted once, at
  its own length): the LRU stack distance. An LRU cache of C tokens still holds the block at
  its reuse exactly when the distance is below C, so the distance quantiles are the cache
  sizes that catch that share of the reuses (vLLM's GPU prefix cache and its CPU tier both
  evict least recently used blocks; the prompt is what they are keyed by).

A **session gap** is the seconds from a request to a later one whose prompt starts with all
of its full blocks (the next turn re-sends the history): conversations and agents' calls.
Pure; one pass with a Fenwick tree over the uses (n log n).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvtune.tuner.traces import Trace
from kvtune.tuner.workload import SecondsQuantiles, TokenQuantiles


@dataclass(frozen=True, slots=True)
class ReuseFigures:
    """What ``observe`` reads from a trace (None: nothing of that kind in it)."""

    prefix_reuse_gap_seconds: SecondsQuantiles | None
    prefix_reuse_distance_tokens: TokenQuantiles | None
    session_gap_seconds: SecondsQuantiles | None
    reuses: int  # block reuses seen


def _rank(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile (the value below which a fraction q of them fall)."""
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def seconds_quantiles(values: Sequence[float]) -> SecondsQuantiles | None:
    """p50, p90, p99 and max of ``values`` (None: empty)."""
    if not values:
        return None
    s = sorted(values)
    return SecondsQuantiles(p50=round(_rank(s, 0.5), 3), p90=round(_rank(s, 0.9), 3),
                            p99=round(_rank(s, 0.99), 3), max=round(s[-1], 3), count=len(s))


def token_quantiles(values: Sequence[int]) -> TokenQuantiles | None:
    if not values:
        return None
    s = sorted(values)
    return TokenQuantiles(p50=int(_rank(s, 0.5)), p90=int(_rank(s, 0.9)),
                          p95=int(_rank(s, 0.95)), p99=int(_rank(s, 0.99)), max=s[-1])


class _Fenwick:
    """Prefix sums over use indices: the tokens of each block at its latest use."""

    def __init__(self, n: int) -> None:
        self.tree = [0] * (n + 1)

    def add(self, i: int, delta: int) -> None:
        i += 1
        while i < len(self.tree):
            self.tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum over uses [0, i)."""
        total = 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total


def _block_uses(trace: Trace) -> list[tuple[float, tuple[int, int], int]]:
    """Every prompt block use in arrival order: (arrival, key, tokens)."""
    uses: list[tuple[float, tuple[int, int], int]] = []
    for req in trace.requests:
        size = req.hash_block_tokens
        for i, block_id in enumerate(req.prefix_block_ids):
            tokens = min(size, req.prompt_tokens - i * size)
            if tokens <= 0:
                break
            uses.append((req.arrival_seconds, (i, block_id), tokens))
    return uses


def _reuses(trace: Trace) -> tuple[list[float], list[int]]:
    """(gap seconds, distance tokens) of every block reuse (module doc)."""
    uses = _block_uses(trace)
    tree = _Fenwick(len(uses))
    last: dict[tuple[int, int], tuple[int, float, int]] = {}  # key -> (use, time, tokens)
    gaps: list[float] = []
    distances: list[int] = []
    for n, (t, key, tokens) in enumerate(uses):
        prev = last.get(key)
        if prev is not None:
            use, t_prev, prev_tokens = prev
            gaps.append(t - t_prev)
            distances.append(tree.prefix(n) - tree.prefix(use + 1))
            tree.add(use, -prev_tokens)
        tree.add(n, tokens)
        last[key] = (n, t, tokens)
    return gaps, distances


def _session_gaps(trace: Trace) -> list[float]:
    """Seconds from a request to the next one that re-sends all of its full blocks."""
    # A prompt's last full block -> (its arrival, its prompt tokens).
    ends: dict[tuple[int, int], tuple[float, int]] = {}
    gaps: list[float] = []
    for req in trace.requests:
        ids = req.prefix_block_ids
        full = min(len(ids), req.prompt_tokens // req.hash_block_tokens)
        # The longest earlier prompt this one extends (strictly: a longer prompt, the same
        # prompt again is a repeat, not a next turn).
        for i in range(len(ids) - 2, -1, -1):
            prev = ends.get((i, ids[i]))
            if prev is not None and prev[1] < req.prompt_tokens:
                gaps.append(req.arrival_seconds - prev[0])
                break
        if full:
            ends[(full - 1, ids[full - 1])] = (req.arrival_seconds, req.prompt_tokens)
    return gaps


def observe(trace: Trace) -> ReuseFigures:
    """The trace's reuse (module doc); all None for a trace without prefix ids."""
    if not trace.has_prefix_ids:
        return ReuseFigures(None, None, None, 0)
    gaps, distances = _reuses(trace)
    return ReuseFigures(
        prefix_reuse_gap_seconds=seconds_quantiles(gaps),
        prefix_reuse_distance_tokens=token_quantiles(distances),
        session_gap_seconds=seconds_quantiles(_session_gaps(trace)),
        reuses=len(gaps),
    )


__all__ = ["ReuseFigures", "observe", "seconds_quantiles", "token_quantiles"]
