"""The per-step token budget, with plain numbers."""

from __future__ import annotations

import pytest

from kvtune.tuner.planner.prefill import prompt_ttft_seconds, step_token_budget

PER_TOKEN = 40.6e-6  # Llama 3.1 8B BF16 on one H100 at 40% MFU
DECODE = 0.0277


def budget(slo: float | None, fits_up_to: int = 1 << 20, seqs: int = 24, prompt: int = 100_000):
    return step_token_budget(
        default_tokens=8192, num_seqs=seqs, prompt_tokens=prompt, decode_seconds=DECODE,
        prefill_seconds_per_token=PER_TOKEN, ttft_slo_seconds=slo,
        fits=lambda tokens: tokens <= fits_up_to, default_label="default",
    )


def test_prompt_ttft_counts_chunks() -> None:
    # 100,000 tokens in chunks of 8,192 - 24 decode tokens: 13 steps.
    assert prompt_ttft_seconds(100_000, 8192, 24, DECODE, PER_TOKEN) == pytest.approx(
        100_000 * PER_TOKEN + 13 * DECODE)


def test_default_without_slo_reports_the_spike() -> None:
    b = budget(None)
    assert (b.tokens, b.code, b.warnings) == (8192, "RuntimeDefault", ())
    assert b.spike_seconds == pytest.approx(DECODE + (8192 - 24) * PER_TOKEN)
    assert "inter-token spike" in b.message


def test_grows_for_ttft_while_it_helps_and_fits() -> None:
    b = budget(3.0)
    assert b.code == "TTFTBudget" and b.tokens == 16384  # 32,768 gains < 2%
    assert b.ttft_seconds == pytest.approx(100_000 * PER_TOKEN + 7 * DECODE)
    assert b.warnings  # 4.25 s is still above 3 s: said
    assert budget(3.0, fits_up_to=8192).tokens == 8192  # memory refuses larger
    assert budget(10.0).tokens == 8192  # already within the SLO


def test_decodes_leave_prefill_room() -> None:
    assert budget(None, seqs=8000).tokens == 8000 + 512
