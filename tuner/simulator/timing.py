"""How long one engine step takes: measured kernels where kvtune has them, else a roofline.

With measured kernels (``KernelTimes``, from ``tuner/facts/data/step_kernels.json``: NVIDIA's
kernel database for vLLM, aiconfigurator-core 0.12.0) a step's GPU time is the sum of what it
runs, one after the other:

- the linear layers: four GEMMs per layer holding the weights every token passes through, at
  the measured seconds per GEMM and per weight for M = the step's tokens (small M reads the
  weights, large M runs at the measured matrix rate; between them measured, not a roofline),
  and the LM head at M = the step's sequences (vLLM computes logits of each sequence's last
  token only);
- attention: a fixed cost and a per-sequence cost per layer, plus the larger of the KV bytes
  read over the measured KV bandwidth and the (query, key) pairs' FLOPs at the prefill
  kernel's measured rate for the step's mean context per query token;
- tensor parallel: two all-reduces per layer of ``tokens x hidden x 2`` bytes each, at the
  measured time for that message size and TP size, on the critical path.

The roofline (a model built without ``kernels``; what the simulator's own tests use): the step
reads every weight once and the KV of every token the scheduled sequences attend to (memory
time), and does ``2 x active parameters`` FLOPs per token plus attention's ``4 x layers x heads
x head_dim`` FLOPs per (query token, context token) pair (compute time); it takes the larger
of the two. Its efficiencies come from ``efficiency.json``.

The fixed overhead per step (CPU work) is data (``efficiency.json``), per GPU class.

Async scheduling (vLLM 0.33's default): the engine schedules batch N+1 and prepares its inputs
while the GPU runs batch N (a two-deep batch queue), so the fixed per-step overhead, CPU work,
overlaps the GPU's: a step takes ``max(overhead, GPU time)`` instead of ``overhead + GPU
time`` (``overlapped=True``); the all-reduces are GPU time, so they never hide. All of the
overhead is taken as CPU-side (scheduling, input preparation, output processing); what part
of it is GPU-side is not calibrated yet.

Worked example (Llama-3.1-8B in BF16 on one H200, measured kernels): a decode step of 64
sequences of 2,000 tokens runs the linear layers at M = 64 (4.04 ms: 128 GEMMs of 6.98e9
weights) and the LM head (0.27 ms), attention's fixed 32 x 11.2 us = 0.36 ms and per-sequence
64 x 32 x 0.20 us = 0.41 ms, and reads 64 x 2000 x 131072 bytes of KV at 4.8e12 x 0.9425 B/s
(3.71 ms): 8.8 ms of GPU time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from kvtune.tuner.facts import data_files
from kvtune.tuner.facts.step_kernels import MESSAGE_FIRST_EXPONENT, interp_pow2


@dataclass(frozen=True, slots=True)
class Efficiency:
    bandwidth_efficiency: float
    compute_efficiency: float
    step_overhead_seconds: float


@cache
def _efficiency_table() -> dict[str, Any]:
    table: dict[str, Any] = data_files.read_json("efficiency.json",
                                                  package=data_files.SIMULATOR)
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


@dataclass(frozen=True, slots=True)
class KernelTimes:
    """One model's measured kernel costs on one GPU (one TP rank); module doc."""

    # The linear layers every token passes through (per GPU) and the LM head: their seconds
    # at M = 1, 2, 4, ... tokens.
    body_seconds: tuple[float, ...]
    head_seconds: tuple[float, ...]
    # Reading every weight once (MoE: all experts, as vLLM's fused kernel at small batches).
    weight_read_seconds: float
    attention_fixed_seconds: float  # all layers
    attention_seconds_per_seq: float  # all layers
    kv_bytes_per_second: float
    # Prefill attention FLOPs per second at 1, 2, 4, ... context tokens per query token.
    prefill_flops_per_second: tuple[float, ...]
    all_reduces_per_step: int  # 2 x layers under tensor parallel, else 0
    all_reduce_bytes_per_token: int
    # One all-reduce's seconds at 2^7, 2^8, ... bytes (one value: a constant).
    all_reduce_seconds: tuple[float, ...]
    # ``fixed_seconds`` by ``num_tokens << 24 | num_seqs``: a replay asks for few distinct
    # step shapes many times, and the step time is on the simulator's hot path.
    _fixed: dict[int, float] = field(default_factory=dict, init=False, repr=False,
                                     compare=False)

    def fixed_seconds(self, num_tokens: int, num_seqs: int) -> float:
        """Everything but attention's KV and pairs terms (memoised)."""
        key = num_tokens << 24 | num_seqs
        seconds = self._fixed.get(key)
        if seconds is None:
            if len(self._fixed) >= _FIXED_CACHE_SIZE:
                self._fixed.clear()
            seconds = self._fixed[key] = self._fixed_seconds(num_tokens, num_seqs)
        return seconds

    def _fixed_seconds(self, num_tokens: int, num_seqs: int) -> float:
        linear = max(interp_pow2(self.body_seconds, num_tokens), self.weight_read_seconds)
        linear += interp_pow2(self.head_seconds, num_seqs)
        fixed = (linear + self.attention_fixed_seconds
                 + self.attention_seconds_per_seq * num_seqs)
        if self.all_reduces_per_step:
            fixed += self.all_reduces_per_step * interp_pow2(
                self.all_reduce_seconds, num_tokens * self.all_reduce_bytes_per_token,
                MESSAGE_FIRST_EXPONENT)
        return fixed

    def prefill_rate(self, context_per_token: float) -> float:
        return interp_pow2(self.prefill_flops_per_second, context_per_token, 0, False)


# Distinct step shapes ``KernelTimes`` remembers before it starts again.
_FIXED_CACHE_SIZE = 1 << 16


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
    # Measured kernels (module doc); None: the roofline.
    kernels: KernelTimes | None = None
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
        overlapped: bool = False, num_seqs: int = 0,
    ) -> float:
        """One step over ``num_tokens`` scheduled tokens (prefill chunks + one per decode) of
        ``num_seqs`` sequences (0: one per token), reading the KV of ``kv_tokens_read``
        tokens, with ``attention_token_pairs`` (query, key) pairs in attention;
        ``overlapped``: the overhead hides behind the GPU work (async scheduling)."""
        k = self.kernels
        if k is None:
            mem = ((self.weights_bytes + self.kv_bytes_per_token * kv_tokens_read)
                   / self._bytes_rate)
            flops = (self.flops_per_token * num_tokens
                     + self.attention_flops_per_token_pair * attention_token_pairs)
            return _with_overhead(max(mem, flops / self._flops_rate), self._overhead,
                                  overlapped)
        if num_tokens <= 0:
            return _with_overhead(0.0, self._overhead, overlapped)
        kv = self.kv_bytes_per_token * kv_tokens_read / k.kv_bytes_per_second
        pairs = self.attention_flops_per_token_pair * attention_token_pairs / interp_pow2(
            k.prefill_flops_per_second, attention_token_pairs / num_tokens, 0, False)
        gpu = k.fixed_seconds(num_tokens, num_seqs or num_tokens) + (kv if kv > pairs
                                                                     else pairs)
        return _with_overhead(gpu, self._overhead, overlapped)

    def _decode_lines(
        self, num_seqs: int, context_tokens: int
    ) -> tuple[float, float, float, float]:
        # Step j of a decode-only run: every sequence one token longer than at step j-1.
        k = self.kernels
        if k is not None:
            # The prefill rate is taken at the run's first step (decode attention is bound
            # by its KV bytes, so the pairs line is far below and the rate never decides).
            fixed = k.fixed_seconds(num_seqs, num_seqs)
            kv = self.kv_bytes_per_token / k.kv_bytes_per_second
            pair = self.attention_flops_per_token_pair / k.prefill_rate(
                context_tokens / max(1, num_seqs))
            return (fixed + kv * context_tokens, kv * num_seqs,
                    fixed + pair * context_tokens, pair * num_seqs)
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
                       overlapped: bool, start_seconds: float = 0.0) -> int:
        """``decode_steps_to_reach`` from ``run_lines``; with ``start_seconds``, the fewest
        steps whose end, ``start_seconds + run_seconds(j)``, is >= the time ``seconds``.
        The end is compared as a time, not the run's length against ``seconds -
        start_seconds``: that difference rounds, and a run that ends exactly at an arrival
        would then take one step past it, where the clock (the same sum) has reached it."""
        if seconds <= start_seconds:
            return 0
        run = self.run_seconds

        def reaches(j: int) -> bool:
            return start_seconds + run(lines, j, overlapped) >= seconds

        if max_steps <= 0 or not reaches(max_steps):
            return max_steps
        lo, hi = 0, max_steps  # not reaches(lo), reaches(hi) (a run of 0 steps takes 0 s)
        # Steps only get longer along a run, so span / (first step) bounds the answer
        # from above and span / (last step) from below: a bisection over a few steps
        # instead of all of them (the bounds are checked, so rounding cannot mislead it).
        span = seconds - start_seconds
        overhead = self._overhead
        first = _run_step_seconds(lines, 0, overhead, overlapped)
        if first > 0:
            guess = min(max_steps, math.ceil(span / first))
            if guess < max_steps and reaches(guess):
                hi = guess
            last = _run_step_seconds(lines, hi - 1, overhead, overlapped)
            low = max(0, math.ceil(span / last) - 1)
            if low > lo and not reaches(low):
                lo = low
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if reaches(mid):
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
