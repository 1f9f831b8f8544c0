"""How long one engine step takes, from physics: bytes over bandwidth, FLOPs over matrix rate.

A step runs one forward pass over every scheduled token. It has to read every weight once
and the KV of every token the scheduled sequences attend to (memory time), and it does
``2 x active parameters`` FLOPs per token plus attention's ``4 x layers x heads x head_dim``
FLOPs per (query token, context token) pair (compute time). The step takes the larger of
the two (a roofline) plus a fixed overhead. Decode steps are memory-bound, long prefill
chunks compute-bound; mixed steps fall where their bytes and FLOPs put them.

The efficiencies (what fraction of datasheet bandwidth and FLOPs vLLM reaches) and the
overhead are data (``efficiency.json``), looked up per GPU class.

Async scheduling (vLLM 0.33's default): the engine schedules batch N+1 and prepares its inputs
while the GPU runs batch N (a two-deep batch queue), so the fixed per-step overhead, CPU work,
overlaps the GPU's: a step takes ``max(overhead, roofline)`` instead of ``overhead +
roofline`` (``overlapped=True``). All of the overhead is taken as CPU-side (scheduling, input
preparation, output processing); what part of it is GPU-side is not calibrated yet.

Worked example (Llama-3.1-8B in BF16 on one H100: 16.06e9 weight bytes, 131,072 KV bytes
per token, 3.35e12 B/s at 0.8): a decode step of 64 sequences of 2,000 tokens reads
16.06e9 + 64 x 2000 x 131072 = 32.8e9 bytes -> 12.2 ms, plus 4 ms overhead = 16.2 ms.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True, slots=True)
class Efficiency:
    bandwidth_efficiency: float
    compute_efficiency: float
    step_overhead_seconds: float


@cache
def _efficiency_table() -> dict[str, Any]:
    text = resources.files("kvtune.tuner.simulator").joinpath("efficiency.json").read_text()
    table: dict[str, Any] = json.loads(text)
    return table


def efficiency_for(gpu_class: str) -> Efficiency:
    """The efficiency factors of a GPU class (``efficiency.json``; 'default' otherwise)."""
    table = _efficiency_table()
    row = table.get(gpu_class) or table.get(gpu_class.upper()) or table["default"]
    return Efficiency(
        bandwidth_efficiency=float(row["bandwidth_efficiency"]),
        compute_efficiency=float(row["compute_efficiency"]),
        step_overhead_seconds=float(row["step_overhead_seconds"]),
    )


# A decode-only run's lines (``StepCostModel.run_lines``): a1, b1, a2, b2, first step at
# the overhead.
RunLines = tuple[float, float, float, float, int]


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Plain numbers per GPU (one tensor-parallel rank); see the module doc for the model."""

    weights_bytes: int
    kv_bytes_per_token: int
    hbm_bytes_per_second: float
    matrix_flops_per_second: float
    # 2 x active parameters / TP: the dense FLOPs of one token.
    flops_per_token: float
    # 4 x layers x query heads per GPU x head_dim: attention FLOPs per (query, key) pair.
    attention_flops_per_token_pair: float
    efficiency: Efficiency
    # The rates the model reaches and its overhead, derived once: every step reads them.
    _bytes_rate: float = field(init=False, repr=False, compare=False)
    _flops_rate: float = field(init=False, repr=False, compare=False)
    _overhead: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        eff = self.efficiency
        object.__setattr__(self, "_bytes_rate",
                           self.hbm_bytes_per_second * eff.bandwidth_efficiency)
        object.__setattr__(self, "_flops_rate",
                           self.matrix_flops_per_second * eff.compute_efficiency)
        object.__setattr__(self, "_overhead", eff.step_overhead_seconds)

    def step_seconds(
        self, num_tokens: int, kv_tokens_read: int, attention_token_pairs: float,
        overlapped: bool = False,
    ) -> float:
        """One step over ``num_tokens`` scheduled tokens (prefill chunks + one per decode),
        reading the KV of ``kv_tokens_read`` tokens, with ``attention_token_pairs``
        (query, key) pairs in attention; ``overlapped``: the overhead hides behind the GPU
        work (async scheduling)."""
        mem = (self.weights_bytes + self.kv_bytes_per_token * kv_tokens_read) / self._bytes_rate
        flops = (self.flops_per_token * num_tokens
                 + self.attention_flops_per_token_pair * attention_token_pairs)
        return _with_overhead(max(mem, flops / self._flops_rate), self._overhead, overlapped)

    def _decode_lines(
        self, num_seqs: int, context_tokens: int
    ) -> tuple[float, float, float, float]:
        # Step j of a decode-only run: every sequence one token longer than at step j-1.
        br, fr = self._bytes_rate, self._flops_rate
        a_mem = (self.weights_bytes + self.kv_bytes_per_token * context_tokens) / br
        b_mem = self.kv_bytes_per_token * num_seqs / br
        a_cmp = (self.flops_per_token * num_seqs
                 + self.attention_flops_per_token_pair * context_tokens) / fr
        b_cmp = self.attention_flops_per_token_pair * num_seqs / fr
        return a_mem, b_mem, a_cmp, b_cmp

    def decode_run_seconds(
        self, num_seqs: int, context_tokens: int, num_steps: int, overlapped: bool = False,
    ) -> float:
        """Total time of ``num_steps`` decode-only steps of ``num_seqs`` sequences that
        attend to ``context_tokens`` tokens at the first step (closed form, no loop)."""
        if num_steps <= 0:
            return 0.0
        return self.run_seconds(self.run_lines(num_seqs, context_tokens), num_steps, overlapped)

    def run_lines(self, num_seqs: int, context_tokens: int) -> RunLines:
        """What every length of one decode-only run shares: its two lines (memory and
        compute time of step j, ``a + b j``) and, for the overlapped sum, the first step
        whose GPU time reaches the overhead on either line, uncapped (``_first_at_least``
        capped at k is this capped at k). A run's callers compute it once."""
        a1, b1, a2, b2 = self._decode_lines(num_seqs, context_tokens)
        overhead = self._overhead
        first = min(_first_at_least(a1, b1, overhead, _UNCAPPED),
                    _first_at_least(a2, b2, overhead, _UNCAPPED))
        return a1, b1, a2, b2, first

    def run_seconds(self, lines: RunLines, num_steps: int, overlapped: bool) -> float:
        """``decode_run_seconds`` (``num_steps`` > 0) from ``run_lines``: the same sums."""
        a1, b1, a2, b2, first = lines
        overhead = self._overhead
        if not overlapped:
            return overhead * num_steps + _sum_max_of_lines(a1, b1, a2, b2, num_steps)
        # max(overhead, gpu_j) with gpu_j non-decreasing in j: the overhead up to the first
        # step whose GPU time reaches it, the GPU time from there on.
        m = min(first, num_steps)
        return (overhead * m + _sum_max_of_lines(a1, b1, a2, b2, num_steps)
                - _sum_max_of_lines(a1, b1, a2, b2, m))

    def decode_steps_to_reach(
        self, num_seqs: int, context_tokens: int, seconds: float, max_steps: int,
        overlapped: bool = False,
    ) -> int:
        """The fewest decode steps (at most ``max_steps``) whose total time is >= ``seconds``."""
        return self.steps_to_reach(self.run_lines(num_seqs, context_tokens), seconds,
                                   max_steps, overlapped)

    def steps_to_reach(self, lines: RunLines, seconds: float, max_steps: int,
                       overlapped: bool) -> int:
        """``decode_steps_to_reach`` from ``run_lines``."""
        if seconds <= 0:
            return 0
        run = self.run_seconds
        if max_steps <= 0 or run(lines, max_steps, overlapped) < seconds:
            return max_steps
        lo, hi = 0, max_steps  # run(lo) < seconds <= run(hi) (a run of 0 steps takes 0 s)
        # Steps only get longer along a run, so seconds / (first step) bounds the answer
        # from above and seconds / (last step) from below: a bisection over a few steps
        # instead of all of them (the bounds are checked, so rounding cannot mislead it).
        overhead = self._overhead
        first = _run_step_seconds(lines, 0, overhead, overlapped)
        if first > 0:
            guess = min(max_steps, math.ceil(seconds / first))
            if guess < max_steps and run(lines, guess, overlapped) >= seconds:
                hi = guess
            last = _run_step_seconds(lines, hi - 1, overhead, overlapped)
            low = max(0, math.ceil(seconds / last) - 1)
            if low > lo and run(lines, low, overlapped) < seconds:
                lo = low
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if run(lines, mid, overlapped) >= seconds:
                hi = mid
            else:
                lo = mid
        return hi


# Larger than any run: ``_first_at_least`` without its cap.
_UNCAPPED = 1 << 62


def _with_overhead(gpu_seconds: float, overhead_seconds: float, overlapped: bool) -> float:
    """A step's time from its GPU time: the overhead hides behind it under async scheduling
    (``overlapped``), else adds to it (module doc)."""
    if overlapped:
        return max(overhead_seconds, gpu_seconds)
    return overhead_seconds + gpu_seconds


def _run_step_seconds(lines: RunLines, j: int, overhead_seconds: float,
                      overlapped: bool) -> float:
    """Step ``j`` of a decode-only run (``StepCostModel.run_lines``)."""
    a1, b1, a2, b2, _ = lines
    return _with_overhead(max(a1 + b1 * j, a2 + b2 * j), overhead_seconds, overlapped)


def _first_at_least(a: float, b: float, c: float, k: int) -> int:
    """The first j in [0, k] with a + b j >= c (k if none below k); b >= 0."""
    if a >= c:
        return 0
    if b <= 0:
        return k
    return min(k, max(0, math.ceil((c - a) / b)))


def _sum_linear(a: float, b: float, lo: int, hi: int) -> float:
    """sum_{j=lo}^{hi-1} (a + b j)."""
    if hi <= lo:
        return 0.0
    return (hi - lo) * a + b * (hi * (hi - 1) - lo * (lo - 1)) / 2.0


def _sum_max_of_lines(a1: float, b1: float, a2: float, b2: float, k: int) -> float:
    """sum_{j=0}^{k-1} max(a1 + b1 j, a2 + b2 j): two lines cross at most once."""
    if b1 == b2:
        return max(a1, a2) * k + b1 * k * (k - 1) / 2.0
    # Line 1 is the larger from index m on (if b1 > b2) or up to m (if b1 < b2).
    cross = (a2 - a1) / (b1 - b2)
    m = min(max(0, int(-(-cross // 1))), k)  # ceil(cross), clamped to [0, k]
    if b1 > b2:
        return _sum_linear(a2, b2, 0, m) + _sum_linear(a1, b1, m, k)
    return _sum_linear(a1, b1, 0, m) + _sum_linear(a2, b2, m, k)
