"""Workload profiles: named presets (the prior before traffic is observed), a fixed session
length, and profiles computed from a request trace.

Preset figures are round numbers typical of each pattern (the article's patterns: chat with
a shared system prompt, RAG with retrieved documents, agents with a growing history,
multi-tenant with per-tenant system prompts, long-context analysis). They are a starting
point that observed traffic replaces.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

from kvtune.tuner import reuse_profile
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.traces import Trace
from kvtune.tuner.workload import TokenQuantiles, WorkloadKind, WorkloadProfile

PRESET_KINDS: tuple[str, ...] = ("chat", "rag", "agent", "multi-tenant", "long-context")
_KINDS: dict[str, WorkloadKind] = {
    "chat": "chat", "rag": "rag", "agent": "agent", "multi-tenant": "multi-tenant",
    "long-context": "long-context",
}

# kind -> (context p50, p90, p95, p99, max), (output p50, p90, p95, p99, max),
#         shared prefix tokens, prefix hit rate, multi-turn
_PRESETS: dict[str, tuple[tuple[int, ...], tuple[int, ...], int, float, bool]] = {
    "chat": ((1000, 3000, 4000, 8000, 16384), (250, 600, 800, 1500, 4096), 800, 0.5, True),
    "rag": ((4000, 7000, 8000, 12000, 16384), (300, 500, 600, 1000, 2048), 500, 0.4, False),
    "agent": ((8000, 20000, 24000, 32000, 65536), (400, 1000, 1500, 3000, 8192), 3000, 0.8, True),
    "multi-tenant": ((1500, 3500, 4500, 8000, 16384), (250, 600, 800, 1500, 4096), 1500, 0.6,
                     False),
    "long-context": ((32000, 80000, 100000, 120000, 131072), (500, 1000, 1500, 3000, 8192), 0,
                     0.1, False),
}


def _quantiles(values: Sequence[int]) -> TokenQuantiles:
    p50, p90, p95, p99, top = values
    return TokenQuantiles(p50=p50, p90=p90, p95=p95, p99=p99, max=top)


def _scaled(values: Sequence[int], factor: float) -> tuple[int, ...]:
    return tuple(max(1, round(v * factor)) for v in values)


def preset_profile(kind: str, context_tokens: int | None = None) -> WorkloadProfile:
    """A named preset. ``context_tokens`` rescales the context distribution so that its p95
    equals it (the figure people quote as "our context length")."""
    preset = _PRESETS.get(kind)
    if preset is None:
        raise InvalidInput(
            "workload", kind, f"expected one of {', '.join(PRESET_KINDS)}"
        )
    ctx, out, shared, hit_rate, multi_turn = preset
    notes: tuple[str, ...] = (f"preset {kind!r}: typical figures, not observed traffic",)
    if context_tokens is not None:
        if context_tokens < 1:
            raise InvalidInput("context_tokens", context_tokens, "must be a positive token count")
        ctx = _scaled(ctx, context_tokens / ctx[2])
        shared = min(shared, ctx[0])
        notes += (f"context rescaled so that p95 = {context_tokens} tokens",)
    wk = _KINDS[kind]
    return WorkloadProfile(
        source="preset", kind=wk, context_tokens=_quantiles(ctx), output_tokens=_quantiles(out),
        shared_prefix_tokens=shared, prefix_hit_rate=hit_rate, multi_turn=multi_turn,
        notes=notes,
    )


def fixed_session_profile(session_tokens: int, output_tokens: int | None = None) -> WorkloadProfile:
    """Every request is one session of exactly ``session_tokens`` (prompt + output), the
    article's "4K-token sessions". Output defaults to an eighth of the session, at most 512."""
    if session_tokens < 2:
        raise InvalidInput("context_tokens", session_tokens, "must be at least 2 tokens")
    out = output_tokens if output_tokens is not None else min(512, max(1, session_tokens // 8))
    if not 0 < out < session_tokens:
        raise InvalidInput(
            "output_tokens", out, f"must be between 1 and session_tokens-1 ({session_tokens - 1})"
        )
    prompt = session_tokens - out
    return WorkloadProfile(
        source="declared", kind="custom",
        context_tokens=TokenQuantiles(p50=prompt, p90=prompt, p95=prompt, p99=prompt, max=prompt),
        output_tokens=TokenQuantiles(p50=out, p90=out, p95=out, p99=out, max=out),
        notes=(f"fixed sessions of {session_tokens} tokens ({prompt} prompt + {out} output)",),
    )


def _quantiles_of(values: Sequence[int]) -> TokenQuantiles:
    """Nearest-rank quantiles of a trace's lengths (``reuse_profile.token_quantiles``: a value
    that occurred, never interpolated); ``profile_from_trace`` refuses an empty trace first."""
    got = reuse_profile.token_quantiles(values)
    if got is None:
        raise InvalidInput("trace", "(empty)", "has no requests")
    return got


def _prefix_sharing(trace: Trace) -> tuple[float, int]:
    """(ideal prefix hit rate, shared prefix tokens) from Mooncake hash ids.

    The hit rate counts prompt tokens in blocks whose chained id was seen earlier in the
    trace (an unbounded cache: an upper bound of what vLLM's cache can hit). The shared
    prefix is the run of leading blocks that at least half of the requests start with.
    """
    seen: set[tuple[int, int]] = set()
    hit_tokens = 0
    prompt_tokens = 0
    first_blocks: Counter[int] = Counter()
    for req in trace.requests:
        prompt_tokens += req.prompt_tokens
        ids = req.prefix_block_ids
        if ids:
            first_blocks[ids[0]] += 1
        for i, block_id in enumerate(ids):
            # Ids are chained (a block's id implies its prefix), so the id alone keys it;
            # the position guards against reuse of small integers across positions.
            key = (i, block_id)
            block_tokens = min(req.hash_block_tokens,
                               req.prompt_tokens - i * req.hash_block_tokens)
            if block_tokens <= 0:
                break
            if key in seen:
                hit_tokens += block_tokens
            else:
                seen.add(key)
    hit_rate = hit_tokens / prompt_tokens if prompt_tokens else 0.0
    shared_tokens = 0
    n = len(trace.requests)
    if first_blocks and n:
        top_id, count = first_blocks.most_common(1)[0]
        if count * 2 >= n:
            sharing = [r for r in trace.requests if r.prefix_block_ids[:1] == (top_id,)]
            depth = 0
            while True:
                column = Counter(
                    r.prefix_block_ids[depth] for r in sharing if len(r.prefix_block_ids) > depth
                )
                if not column or column.most_common(1)[0][1] * 2 < n:
                    break
                depth += 1
            block = trace.requests[0].hash_block_tokens
            shared_tokens = depth * block
    return hit_rate, shared_tokens


def _arrival_cv(arrivals: Sequence[float]) -> float | None:
    """Coefficient of variation of the gaps between arrivals (1 for a Poisson process)."""
    times = sorted(arrivals)
    gaps = [b - a for a, b in pairwise(times)]
    if len(gaps) < 2:
        return None
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return None
    var = sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1)
    return round(math.sqrt(var) / mean, 4)


def profile_from_trace(trace: Trace, kind: WorkloadKind = "custom") -> WorkloadProfile:
    """Quantiles of prompt and output lengths from a trace; prefix sharing from Mooncake
    hash ids (Azure traces carry none: hit rate unknown)."""
    if not trace.requests:
        raise InvalidInput("trace", trace.name, "has no requests")
    context = _quantiles_of([r.prompt_tokens for r in trace.requests])
    output = _quantiles_of([r.output_tokens for r in trace.requests])
    duration = trace.duration_seconds
    rate = len(trace.requests) / duration if duration > 0 else None
    cv = _arrival_cv([r.arrival_seconds for r in trace.requests])
    notes = [f"{len(trace.requests)} requests from {trace.name} ({trace.format})"]
    hit_rate: float | None = None
    shared = 0
    multi_turn = False
    if trace.has_prefix_ids:
        hit_rate, shared = _prefix_sharing(trace)
        # Re-sent histories show up as high reuse of blocks that are not a common prefix.
        multi_turn = hit_rate > 0.3 and shared < context.p50 // 2
        notes.append(
            f"ideal prefix hit rate {hit_rate:.2f} from hash ids (unbounded cache)"
        )
    else:
        notes.append("no prefix information in this trace format; prefix hit rate unknown")
    reuse = reuse_profile.observe(trace)
    return WorkloadProfile(
        source="trace", kind=kind,
        context_tokens=context, output_tokens=output,
        shared_prefix_tokens=shared, prefix_hit_rate=hit_rate, multi_turn=multi_turn,
        request_rate_per_second=rate, arrival_cv=cv, requests=len(trace.requests),
        window_seconds=duration if duration > 0 else None, notes=tuple(notes),
        prefix_reuse_gap_seconds=reuse.prefix_reuse_gap_seconds,
        prefix_reuse_distance_tokens=reuse.prefix_reuse_distance_tokens,
        session_gap_seconds=reuse.session_gap_seconds,
    )
