"""Workload presets and profiles from the real traces shipped in examples/traces."""

from __future__ import annotations

import pytest

from kvtune.e2e.traces import AZURE_TRACE, MOONCAKE_TRACE
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.planner.presets import (
    PRESET_KINDS,
    fixed_session_profile,
    preset_profile,
    profile_from_trace,
)
from kvtune.tuner.traces import Trace, TraceRequest, load_trace


@pytest.mark.parametrize("kind", PRESET_KINDS)
def test_presets_are_valid_and_rescale(kind: str) -> None:
    profile = preset_profile(kind)
    assert profile.kind == kind and profile.source == "preset"
    rescaled = preset_profile(kind, context_tokens=10_000)
    assert rescaled.context_tokens.p95 == 10_000
    assert rescaled.shared_prefix_tokens <= rescaled.context_tokens.p50


def test_unknown_preset() -> None:
    with pytest.raises(InvalidInput, match="chat"):
        preset_profile("batch")


def test_fixed_session() -> None:
    p = fixed_session_profile(4096)
    assert p.context_tokens.p95 + p.output_tokens.p95 == 4096
    assert p.context_tokens.max + p.output_tokens.max == 4096
    with pytest.raises(InvalidInput, match="output_tokens"):
        fixed_session_profile(100, output_tokens=100)


def test_prefix_sharing_from_hash_ids() -> None:
    # Three requests share two leading 512-token blocks; the third adds a fresh one.
    reqs = [
        TraceRequest(0.0, 1024, 10, (1, 2)),
        TraceRequest(1.0, 1024, 10, (1, 2)),
        TraceRequest(2.0, 1536, 10, (1, 2, 3)),
    ]
    profile = profile_from_trace(Trace("t", "mooncake-jsonl", reqs))
    assert profile.shared_prefix_tokens == 1024
    # Hits: request 2 (1024 tokens) and request 3's first 1024 of 1536; of 3584 prompt tokens.
    assert profile.prefix_hit_rate == pytest.approx(2048 / 3584)
    assert profile.request_rate_per_second == pytest.approx(1.5)
    assert profile.context_tokens.p50 == 1024 and profile.context_tokens.max == 1536


def test_mooncake_trace_profile() -> None:
    trace = load_trace(MOONCAKE_TRACE)
    profile = profile_from_trace(trace)
    assert profile.requests == len(trace.requests)
    assert profile.prefix_hit_rate is not None and 0.0 < profile.prefix_hit_rate < 1.0
    prompts = sorted(r.prompt_tokens for r in trace.requests)
    assert profile.context_tokens.max == prompts[-1]
    assert profile.context_tokens.p50 <= profile.context_tokens.p95 <= profile.context_tokens.p99


def test_azure_trace_profile() -> None:
    trace = load_trace(AZURE_TRACE)
    profile = profile_from_trace(trace)
    assert profile.prefix_hit_rate is None  # Azure carries no prefix information
    assert profile.request_rate_per_second is not None and profile.request_rate_per_second > 0
    assert profile.output_tokens.p50 > 0
