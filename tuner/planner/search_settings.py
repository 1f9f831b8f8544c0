"""The capacity search's settings, constants and progress reports (``search.py``). Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

# Capacities within 2% of the best are a tie: the spread of repeated simulations with
# different seeds on the shipped traces (bench/oracle.py) stays under it, and the final
# ladder measures capacity to within it.
CAPACITY_TIE = 0.02
# The targets are p95 targets: the SLO holds when 95% of the requests meet both.
SLO_ATTAINMENT = 0.95
# max-num-batched-tokens candidates besides the rule's (vLLM's defaults are 2K/8K/16K). 512:
# when compute binds, a step carrying a large prefill chunk stalls every decoding request
# (8K tokens of an 8B model: ~0.2 s on an H100), and a small budget piggybacks prefill on
# memory-bound decode steps instead (Sarathi-Serve's stall-free batching): on Azure at 5x
# on an H100 (bench/oracle.py, compute-bound) TPOT p95 falls from 50 to 16 ms and every
# request meets the SLO, where 2K leaves 5 % short.
BATCHED_TOKENS = (512, 2048, 8192, 16384)
# Rung sizes of the successive halving, in requests of the traffic (the last: everything).
RUNGS = (100, 300, 800)
KEEP_FRACTION = 3  # keep the best third at each rung
# Block sizes tried for the best few after the first pass.
BLOCK_FINALISTS = 1
# Candidates that also try CPU KV offload (when it is searched at all).
OFFLOAD_FINALISTS = 2
# Default targets when the policy sets none (the rule-based planner's defaults).
DEFAULT_TTFT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class SearchSettings:
    rungs: tuple[int, ...] = RUNGS
    tie: float = CAPACITY_TIE
    slo_attainment: float = SLO_ATTAINMENT
    # How close the ladder brackets the best capacity: on the last rung (the figure the
    # plan reports, and the replicas needed), and on the shorter ones (only to promote).
    capacity_tolerance: float = CAPACITY_TIE
    rung_tolerance: float = 0.08
    alternatives: int = 3
    batched_tokens: tuple[int, ...] = BATCHED_TOKENS


DEFAULT_SETTINGS = SearchSettings()


@dataclass(frozen=True, slots=True)
class SearchProgress:
    """Where a running search is, for a caller that shows it (``kvtune plan`` on stderr):
    ``done`` of ``total`` scores taken in the current stage (``capacity``: probes of the
    ladder so far, no total). The search takes seconds; it reports after every score and
    never reads a clock."""

    stage: Literal["halving", "offload", "block size", "capacity"]
    done: int
    total: int
    candidates: int  # candidates that passed pre-flight
    round: int = 0  # successive-halving round, from 1
    rounds: int = 0
    requests: int = 0  # requests each score replays
    rate_scale: float = 1.0  # capacity: the rate probed, as a multiple of the observed one

    def text(self) -> str:
        if self.stage == "halving":
            return (f"searching {self.candidates} candidates: {self.done}/{self.total} "
                    f"(successive halving round {self.round}/{self.rounds}, "
                    f"{self.requests} requests each)")
        if self.stage == "offload":
            return (f"trying CPU KV offload on the best candidates: {self.done}/{self.total} "
                    f"({self.requests} requests each)")
        if self.stage == "block size":
            return (f"trying block sizes on the best candidate: {self.done}/{self.total} "
                    f"({self.requests} requests each)")
        return (f"measuring capacity at SLO: {self.done} scores, now at {self.rate_scale:.3g}x "
                f"the observed rate ({self.requests} requests each)")


SearchProgressHook = Callable[[SearchProgress], None]

__all__ = [
    "BATCHED_TOKENS",
    "BLOCK_FINALISTS",
    "CAPACITY_TIE",
    "DEFAULT_SETTINGS",
    "DEFAULT_TTFT_SECONDS",
    "KEEP_FRACTION",
    "OFFLOAD_FINALISTS",
    "RUNGS",
    "SLO_ATTAINMENT",
    "SearchProgress",
    "SearchProgressHook",
    "SearchSettings",
]
