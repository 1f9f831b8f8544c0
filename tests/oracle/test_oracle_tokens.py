"""Token ids from segments: equal exactly where kvtune's prefix keys are equal (no vLLM)."""

from __future__ import annotations

import pytest
from oraclecases import MOONCAKE, trace_slice

from kvtune.oracle.tokens import TokenSpace
from kvtune.tuner.simulator.prefix import block_hashes


def _blocks(ids: list[int], bs: int, chain: dict[tuple[int, tuple[int, ...]], int]
            ) -> list[int]:
    """A prompt's full blocks as vLLM hashes them, H(parent, block tokens), with ``chain``
    interning each (parent, tokens) pair as a small int instead of a digest."""
    out: list[int] = []
    parent = -1
    for i in range(len(ids) // bs):
        parent = chain.setdefault((parent, tuple(ids[i * bs:(i + 1) * bs])), len(chain))
        out.append(parent)
    return out


@pytest.mark.parametrize("block_size", [16, 64])
def test_equal_token_blocks_iff_equal_prefix_keys(block_size: int) -> None:
    reqs = trace_slice(MOONCAKE, 60)
    space = TokenSpace(reqs)
    chain: dict[tuple[int, tuple[int, ...]], int] = {}
    by_tokens: dict[int, set[tuple[int, int]]] = {}
    by_keys: dict[int, set[tuple[int, int]]] = {}
    for r in reqs:
        ids = space.prompt(r)
        assert len(ids) == r.prompt_tokens
        keys = block_hashes(r.segments, r.prompt_tokens, block_size)
        blocks = _blocks(ids, block_size, chain)
        assert len(keys) == len(blocks)
        for i, (k, b) in enumerate(zip(keys, blocks, strict=True)):
            by_keys.setdefault(k, set()).add((r.request_id, i))
            by_tokens.setdefault(b, set()).add((r.request_id, i))
    # The same partition of (request, block) pairs: equal keys <=> equal token prefixes.
    assert sorted(map(sorted, by_keys.values())) == sorted(map(sorted, by_tokens.values()))
    shared = sum(1 for v in by_keys.values() if len(v) > 1)
    assert shared > 100, "the slice should share prefix blocks"


def test_output_tokens_continue_the_segments() -> None:
    reqs = trace_slice(MOONCAKE, 5)
    space = TokenSpace(reqs)
    r = reqs[0]
    whole = space.ids(r, 0, r.prompt_tokens + r.output_tokens)
    assert whole[: r.prompt_tokens] == space.prompt(r)
    assert len(set(whole)) == len(whole)
    with pytest.raises(ValueError, match="segments cover"):
        space.ids(r, 0, r.prompt_tokens + r.output_tokens + 1)
