"""How many tokens one scheduler step may carry (``--max-num-batched-tokens``).

Every running sequence puts one decode token in a step; the rest of the budget prefills
prompts in chunks. Under steady load the chunk size barely moves TPOT p95: the prompt tokens
that arrive per second must be computed whatever the chunking, so the average step is
``decode / (1 - prompt load)`` for any size. It moves two things: inter-token spikes (a step
that carries a full chunk takes ``decode + chunk x prefill-per-token``) and TTFT (a prompt
split into more chunks waits for more decode steps). So kvtune keeps vLLM's default and
grows it (2x, then 4x) only when the TTFT SLO needs it, memory allows it, and it helps.

Worked example, Llama 3.1 8B BF16 on one H100, 24 running sequences, a 100,000-token p95
prompt: 2 x 8.03 B FLOPs per token at 40% of 989 TFLOPS = 40.6 us per token, 4.06 s of
compute; at 8,192 tokens per step the prompt takes 13 steps, each also decoding (about
28 ms): 4.42 s; at 16,384, 7 steps: 4.25 s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

# Prefill room always left beside the decode tokens.
MIN_PREFILL_TOKENS = 512
# Growth steps tried for the TTFT SLO, and the least TTFT gain that justifies one.
GROWTH_FACTORS: tuple[int, ...] = (2, 4)
MIN_TTFT_GAIN = 0.02


@dataclass(frozen=True, slots=True)
class StepBudget:
    tokens: int
    code: str  # "RuntimeDefault" | "TTFTBudget"
    message: str
    warnings: tuple[str, ...]
    ttft_seconds: float  # of the p95 prompt at ``tokens``
    spike_seconds: float  # a step that carries a full chunk


def prompt_ttft_seconds(
    prompt_tokens: int, step_tokens: int, num_seqs: int, decode_seconds: float,
    prefill_seconds_per_token: float,
) -> float:
    """The prompt's compute plus one decode step per chunk it is split into."""
    room = max(1, step_tokens - num_seqs)
    return prompt_tokens * prefill_seconds_per_token + math.ceil(prompt_tokens / room) * (
        decode_seconds
    )


def step_token_budget(
    *,
    default_tokens: int,
    num_seqs: int,
    prompt_tokens: int,
    decode_seconds: float,
    prefill_seconds_per_token: float,
    ttft_slo_seconds: float | None,
    fits: Callable[[int], bool],
    default_label: str,
) -> StepBudget:
    """``default_tokens`` (at least the decodes plus ``MIN_PREFILL_TOKENS``), grown for the
    TTFT SLO while ``fits(tokens)`` (pre-flight at that budget) holds and TTFT improves."""

    def ttft(tokens: int) -> float:
        return prompt_ttft_seconds(
            prompt_tokens, tokens, num_seqs, decode_seconds, prefill_seconds_per_token)

    chosen = max(default_tokens, num_seqs + MIN_PREFILL_TOKENS)
    code = "RuntimeDefault"
    warnings: list[str] = []
    message = f"{default_label}: {chosen} tokens per step; the p95 prompt ({prompt_tokens} " \
        f"tokens) prefills in about {ttft(chosen):.2f} s"
    if ttft_slo_seconds is not None and ttft(chosen) > ttft_slo_seconds:
        start, before = chosen, ttft(chosen)
        for factor in GROWTH_FACTORS:
            tokens = start * factor
            if not fits(tokens) or ttft(tokens) >= ttft(chosen) * (1.0 - MIN_TTFT_GAIN):
                break
            chosen, code = tokens, "TTFTBudget"
            if ttft(tokens) <= ttft_slo_seconds:
                break
        if code == "TTFTBudget":
            message = (
                f"the p95 prompt ({prompt_tokens} tokens) takes {before:.2f} s to prefill at "
                f"{start} tokens per step; at {chosen} it takes {ttft(chosen):.2f} s (TTFT p95 "
                f"SLO {ttft_slo_seconds:g} s)"
            )
        if ttft(chosen) > ttft_slo_seconds:
            warnings.append(
                f"the p95 prompt ({prompt_tokens} tokens) needs about {ttft(chosen):.2f} s to "
                f"prefill, above the TTFT p95 SLO of {ttft_slo_seconds:g} s, even at {chosen} "
                "tokens per step; more tensor parallel or a faster GPU would help"
            )
    spike = decode_seconds + max(0, chosen - num_seqs) * prefill_seconds_per_token
    message += (
        f"; a step that carries a full chunk takes about {spike * 1000:.0f} ms (an "
        f"inter-token spike for the {num_seqs} running sequences)"
    )
    return StepBudget(chosen, code, message, tuple(warnings), ttft(chosen), spike)
