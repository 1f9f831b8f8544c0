"""Token ids for a simulator request, so that vLLM's block hasher sees two prompts alike
exactly where kvtune's prefix keys say their contents are equal.

A segment uid is prefix-determining (``kvtune.tuner.simulator.prefix``): the token at offset
``o`` of segment ``u`` is the same token, after the same tokens, in every request that has
it. So the token id is a function of ``(u, o)``, injective: each uid owns a range of ids as
long as its longest copy in the request set (``TokenSpace``). vLLM then hashes a block
``H(parent, ids)``: equal ids block by block from the start <=> equal kvtune keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvtune.tuner.simulator.workload import SimRequest


class TokenSpace:
    """The ids of every (segment uid, offset) of ``requests``; ids start at 1 (0 is left
    free) and stay below 2**31 for any trace kvtune ships."""

    def __init__(self, requests: Iterable[SimRequest]) -> None:
        longest: dict[int, int] = {}
        for r in requests:
            for uid, length in r.segments:
                if length > longest.get(uid, 0):
                    longest[uid] = length
        self._base: dict[int, int] = {}
        nxt = 1
        for uid in sorted(longest):
            self._base[uid] = nxt
            nxt += longest[uid]
        self.size = nxt

    def ids(self, req: SimRequest, start: int, stop: int) -> list[int]:
        """Token ids of positions ``[start, stop)`` of ``req`` (prompt, then output)."""
        out: list[int] = []
        seg_start = 0
        for uid, length in req.segments:
            seg_stop = seg_start + length
            lo, hi = max(start, seg_start), min(stop, seg_stop)
            if lo < hi:
                base = self._base[uid] - seg_start
                out.extend(range(base + lo, base + hi))
            seg_start = seg_stop
            if seg_start >= stop:
                break
        if len(out) != stop - start:
            raise ValueError(
                f"request {req.request_id}: its segments cover {seg_start} tokens, not "
                f"position {stop - 1}")
        return out

    def prompt(self, req: SimRequest) -> list[int]:
        return self.ids(req, 0, req.prompt_tokens)


def prompt_ids(requests: Sequence[SimRequest]) -> dict[int, list[int]]:
    """Every request's prompt ids (tests and debugging)."""
    space = TokenSpace(requests)
    return {r.request_id: space.prompt(r) for r in requests}
