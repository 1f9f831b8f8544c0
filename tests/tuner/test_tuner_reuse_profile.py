"""Reuse figures read from a trace's prefix ids (``tuner/reuse_profile.py``): gaps, LRU
stack distances and session gaps, checked on traces small enough to count by hand."""

from __future__ import annotations

import pytest

from kvtune.e2e.traces import AZURE_TRACE
from kvtune.tuner import reuse_profile
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.traces import Trace, TraceRequest, load_trace


def _trace(*rows: tuple[float, int, tuple[int, ...]]) -> Trace:
    return Trace(name="hand", format="mooncake-jsonl", requests=[
        TraceRequest(arrival_seconds=t, prompt_tokens=p, output_tokens=10, prefix_block_ids=ids)
        for t, p, ids in rows])


def test_gaps_distances_and_sessions_counted_by_hand() -> None:
    # A (blocks 1, 2) at 0 s; B (block 9) at 1 s; A's next turn (1, 2, then 3) at 5 s.
    trace = _trace((0.0, 1024, (1, 2)), (1.0, 512, (9,)), (5.0, 1300, (1, 2, 3)))
    gaps, distances = reuse_profile._reuses(trace)
    assert gaps == [5.0, 5.0]
    # Block 1 comes back after blocks 2 and 9 were used (1,024 tokens); block 2 after 9 and 1.
    assert distances == [1024, 1024]
    # The third request re-sends all of A's full blocks: a session gap of 5 s (B extends none).
    assert reuse_profile._session_gaps(trace) == [5.0]
    got = reuse_profile.observe(trace)
    assert got.reuses == 2
    assert got.prefix_reuse_gap_seconds is not None
    assert got.prefix_reuse_gap_seconds.p50 == 5.0 and got.prefix_reuse_gap_seconds.count == 2
    assert got.prefix_reuse_distance_tokens is not None
    assert got.prefix_reuse_distance_tokens.p99 == 1024


def test_a_block_used_again_at_once_has_no_distance_and_partial_blocks_count_their_tokens() -> None:
    # The same 700-token prompt twice: block 0 (512) and block 1 (188 tokens).
    trace = _trace((0.0, 700, (4, 5)), (2.0, 700, (4, 5)), (3.0, 700, (4, 5)))
    gaps, distances = reuse_profile._reuses(trace)
    assert gaps == [2.0, 2.0, 1.0, 1.0]
    # Between block 4's uses only block 5 (188 tokens) was used; between 5's, only 4 (512).
    assert distances == [188, 512, 188, 512]
    # The prompt's one full block is re-sent, but the next prompt adds no block: no session.
    assert reuse_profile._session_gaps(trace) == []


def test_a_trace_without_prefix_ids_observes_nothing() -> None:
    profile = profile_from_trace(load_trace(AZURE_TRACE))
    assert profile.prefix_reuse_gap_seconds is None
    assert profile.prefix_reuse_distance_tokens is None
    assert profile.session_gap_seconds is None


def test_the_profile_carries_the_figures_with_units_in_their_names() -> None:
    trace = _trace(*[(float(t), 1024, (1, 2)) for t in range(10)])
    profile = profile_from_trace(trace)
    assert profile.prefix_reuse_gap_seconds is not None
    assert profile.prefix_reuse_gap_seconds.max == 1.0
    assert profile.prefix_reuse_distance_tokens is not None
    assert profile.prefix_reuse_distance_tokens.max == 512
    dumped = profile.model_dump(mode="json")
    assert dumped["prefix_reuse_gap_seconds"]["count"] == 18


def test_quantiles_must_not_decrease() -> None:
    from kvtune.tuner.workload import SecondsQuantiles

    with pytest.raises(ValueError, match=r"p90=1\.0 > p99=0\.5"):
        SecondsQuantiles(p50=0.1, p90=1.0, p99=0.5, max=2.0)
