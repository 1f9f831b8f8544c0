"""What a request's tokens are, as far as the prefix cache can tell: segments and block hashes.

vLLM hashes each *full* block as ``H(parent_hash, block_token_ids, extra_keys)``, so a
block's hash names the whole prefix up to its last token. The simulator never sees token
ids; it sees *segments*: runs of tokens with a ``uid`` that is **prefix-determining** (two
segments with the same uid are preceded by the same tokens and hold the same tokens at the
same offsets). ``SegmentInterner.chain(parent_uid, label)`` makes such uids from any label
(a Mooncake ``hash_id``, "the system prompt", "turn 3's answer of session 17").

Then the hash of the block ending at token ``e`` is a pure function of (uid of the segment
holding token ``e - 1``, offset of ``e`` inside that segment): it names the same prefix as
vLLM's chained hash, and it costs one integer per block (``block_hashes`` makes them with
``range``, no per-token work).

Mooncake's ``hash_ids`` label 512-token blocks; ``len(hash_ids) == ceil(input_length/512)``.
The simulator chains them (a hash id after a different parent becomes a different uid, so
it does not rely on the trace's ids being chained already) and derives sub-block identities
for any block size from (uid, end offset). What that assumes:

1. equal leading ids mean equal tokens (Mooncake's definition of the ids);
2. inside one 512-token block, equal ids mean equal tokens at equal offsets, also when one
   request's copy is a partial last block: a 16-token sub-block at offset 256 of id 7 is
   the same content in every request whose prompt covers it;
3. prompt tokens after the last full shared id, and every output token, are unique to the
   request (the trace has no ids for them).

Only leading segments that appear in two or more requests can ever be hit
(``shareable_prefix_tokens``); ``block_hashes`` makes keys for those blocks only, and the
block pool marks the others ``UNSHARED_HASH`` (cached, never looked up).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

# Offsets live in the low bits of a key; a segment is never this long.
_OFFSET_BITS = 32

# (uid, tokens): a run of tokens whose uid names its content and everything before it.
Segment = tuple[int, int]


class SegmentInterner:
    """Hands out prefix-determining segment uids. Deterministic: the same calls in the same
    order give the same uids (no global counter, no randomness)."""

    def __init__(self) -> None:
        self._chained: dict[tuple[int, object], int] = {}
        self._next_uid = 1  # uid 0 is "no parent"

    def chain(self, parent_uid: int, label: object) -> int:
        """The uid of the segment labelled ``label`` that follows segment ``parent_uid``
        (0: the start of the prompt). The same (parent, label) always gives the same uid."""
        key = (parent_uid, label)
        uid = self._chained.get(key)
        if uid is None:
            uid = self._fresh()
            self._chained[key] = uid
        return uid

    def unique(self) -> int:
        """A uid no other segment has (a user's own message, a generated answer)."""
        return self._fresh()

    def _fresh(self) -> int:
        uid = self._next_uid
        self._next_uid += 1
        return uid


def block_hashes(segments: Sequence[Segment], num_tokens: int, block_size: int) -> list[int]:
    """Keys of the full blocks among the first ``num_tokens`` tokens, block i naming the
    prefix ``[0, (i + 1) * block_size)``. Equal keys <=> equal prefixes (see module doc)."""
    keys: list[int] = []
    seg_start = 0
    for uid, length in segments:
        seg_end = min(seg_start + length, num_tokens)
        # Block ends e (multiples of block_size) with seg_start < e <= seg_end.
        first_end = (seg_start // block_size + 1) * block_size
        if first_end <= seg_end:
            base = (uid << _OFFSET_BITS) - seg_start
            keys.extend(range(base + first_end, base + seg_end + 1, block_size))
        seg_start += length
        if seg_start >= num_tokens:
            break
    return keys


def shareable_prefix_tokens(requests_segments: Sequence[Sequence[Segment]]) -> list[int]:
    """Per request, how many leading tokens some *other* request also has (an upper bound:
    the whole of every leading segment whose uid two or more requests contain). Tokens past
    it can never be a prefix hit for anyone."""
    seen_in: dict[int, int] = {}
    for segments in requests_segments:
        for uid, _ in segments:
            seen_in[uid] = seen_in.get(uid, 0) + 1
    out: list[int] = []
    for segments in requests_segments:
        n = 0
        for uid, length in segments:
            if seen_in[uid] < 2:
                break
            n += length
        out.append(n)
    return out


class KeySpace:
    """Dense block keys for one block size: the same identity as ``block_hashes`` (a key
    names the prefix up to a block's end), numbered 0, 1, 2, ... so the block pool can map
    keys to blocks with an array instead of a dict.

    Segment ``uid`` at start ``seg_start`` has its i-th block end (in the request's block
    numbering) ``i`` in ``[seg_start // bs, end // bs)``; its key is the uid's base plus
    ``i - seg_start // bs``. A uid always starts at the same token (its uid is
    prefix-determining), so the numbering is the same in every request that holds it. A
    later copy that is longer than any seen before (a partial last Mooncake block first,
    the full one later) gets an extension range for the new blocks; the old keys stay.
    """

    __slots__ = ("_block_size", "_chunks", "num_keys")

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        # uid -> [(first relative block index, base key), ...], ascending.
        self._chunks: dict[int, list[tuple[int, int]]] = {}
        self.num_keys = 0

    def _ranges(self, uid: int, count: int) -> list[range]:
        chunks = self._chunks.get(uid)
        if chunks is None:
            chunks = self._chunks[uid] = [(0, self.num_keys)]
            self.num_keys += count
            self._chunks[uid].append((count, -1))  # sentinel: the covered length
            return [range(chunks[0][1], chunks[0][1] + count)]
        covered = chunks[-1][0]
        if count > covered:
            chunks[-1] = (covered, self.num_keys)
            self.num_keys += count - covered
            chunks.append((count, -1))
        if len(chunks) == 2:  # one chunk: the common case
            base = chunks[0][1]
            return [range(base, base + count)]
        out: list[range] = []
        for (lo, base), (hi, _) in pairwise(chunks):
            if lo >= count:
                break
            out.append(range(base, base + min(hi, count) - lo))
        return out

    def key_array(self, segments: Sequence[Segment], num_tokens: int) -> np.ndarray:
        """``keys`` as an int64 array (the same ranges, taken in the same order), built
        without a Python int per key: a multi-turn prompt is tens of short ranges."""
        bs = self._block_size
        starts: list[int] = []
        counts: list[int] = []
        seg_start = 0
        for uid, length in segments:
            seg_end = min(seg_start + length, num_tokens)
            first = seg_start // bs
            count = seg_end // bs - first
            if count > 0:
                for r in self._ranges(uid, count):
                    starts.append(r.start)
                    counts.append(len(r))
            seg_start += length
            if seg_start >= num_tokens:
                break
        if not starts:
            return np.zeros(0, dtype=np.int64)
        size = np.asarray(counts, dtype=np.int64)
        # Key j of range i is starts[i] + (j's index overall - keys before range i).
        before = np.cumsum(size) - size
        return (np.repeat(np.asarray(starts, dtype=np.int64) - before, size)
                + np.arange(int(size.sum()), dtype=np.int64))

    def keys(self, segments: Sequence[Segment], num_tokens: int) -> list[int]:
        """Keys of the full blocks among the first ``num_tokens`` tokens (``block_hashes``
        numbered densely)."""
        bs = self._block_size
        out: list[int] = []
        seg_start = 0
        for uid, length in segments:
            seg_end = min(seg_start + length, num_tokens)
            first = seg_start // bs
            count = seg_end // bs - first
            if count > 0:
                for r in self._ranges(uid, count):
                    out.extend(r)
            seg_start += length
            if seg_start >= num_tokens:
                break
        return out
