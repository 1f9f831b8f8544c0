"""Picking among candidates a ``CandidateScorer`` (the simulator) has scored.

The rule: among the candidates that meet the TTFT and TPOT SLOs, the highest throughput;
throughputs within ``THROUGHPUT_TIE`` of it are a tie (simulation noise), broken by less
waste: the smaller block (less fragmentation), fewer preemptions, fewer sequences. When none
meets the SLOs, the one that misses by the least. Every candidate gets a verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtune.tuner.plan import CandidateScore, CandidateVerdict
from kvtune.tuner.planner import checks
from kvtune.tuner.planner.policy import SLO

THROUGHPUT_TIE = 0.005


def slo_violation(score: CandidateScore, slo: SLO) -> float:
    """How far the worse of TTFT and TPOT p95 is above its SLO (0: met), as a fraction."""
    worst = 0.0
    if slo.ttft_p95_seconds is not None:
        worst = max(worst, score.ttft_p95_seconds / slo.ttft_p95_seconds - 1.0)
    if slo.tpot_p95_seconds is not None:
        worst = max(worst, score.tpot_p95_seconds / slo.tpot_p95_seconds - 1.0)
    return worst


@dataclass(frozen=True, slots=True)
class ScoredPick:
    best: CandidateScore
    code: str  # checks.BEST_SCORED_WITHIN_SLO or checks.LEAST_SLO_VIOLATION
    verdicts: tuple[CandidateVerdict, ...]  # one per score, in order
    warning: str | None  # set when no candidate met the SLOs


def candidate_label(score: CandidateScore) -> str:
    return f"block {score.plan.block_size} x seqs {score.plan.max_num_seqs}"


def pick_scored(scores: Sequence[CandidateScore], slo: SLO) -> ScoredPick:
    if not scores:
        raise ValueError("pick_scored needs at least one score")
    meeting = [s for s in scores if slo_violation(s, slo) <= 0.0]
    top = max((s.throughput_requests_per_second for s in meeting), default=0.0)

    def tied(s: CandidateScore) -> bool:
        return s.throughput_requests_per_second >= top * (1.0 - THROUGHPUT_TIE)

    warning = None
    if meeting:
        best = min((s for s in meeting if tied(s)), key=lambda s: (
            s.plan.block_size, s.preemptions, s.plan.max_num_seqs,
            -s.throughput_requests_per_second))
        code = checks.BEST_SCORED_WITHIN_SLO
    else:
        best = min(scores, key=lambda s: (
            slo_violation(s, slo), -s.throughput_requests_per_second))
        code = checks.LEAST_SLO_VIOLATION
        warning = (
            f"no candidate met the SLOs in the simulator; the closest misses by "
            f"{slo_violation(best, slo):.0%} ({best.summary})"
        )
    verdicts = []
    for s in scores:
        if s is best:
            check, ok = checks.CHOSEN, True
        elif slo_violation(s, slo) > 0:
            check, ok = checks.FAILS_SLO, False
        elif not tied(s):
            check, ok = checks.LOWER_THROUGHPUT, True
        else:
            check, ok = checks.MORE_WASTE, True
        verdicts.append(
            CandidateVerdict(value=candidate_label(s), ok=ok, check=check, detail=s.summary))
    return ScoredPick(best, code, tuple(verdicts), warning)
