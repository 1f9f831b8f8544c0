"""Judge a canary revision against the stable one on what users feel. Pure: figures in, verdict out.

A KV plan can be worse for users while every pod is healthy (a smaller cache preempts, a larger
batched-token budget stretches inter-token gaps). So after the canary is available, kvtune
compares the two revisions over the analysis window with vLLM's own histograms: the share of
requests whose TTFT and whose time per output token meet the SLO, preemptions per request,
KV-cache usage and queue length.

The checks run in order, each returning (reason, message, failed), as cert-manager's do:

1. ``InsufficientSample``: each revision must have finished ``min_requests`` requests in the
   window; before that there is no verdict (the caller waits, then applies
   ``rollout.onInconclusive``).
2. ``TTFTAttainmentWorse`` / ``TPOTAttainmentWorse``: the canary's share of requests within the
   SLO is lower than the stable revision's by more than the noise of two binomial proportions
   (one-sided z = 2.326, i.e. a 1 % false-rollback rate for equal revisions) and more than
   ``min_drop`` (2 points), *and* it is below the SLO's objective (95 % for a p95 target). A
   canary that is slightly worse but still meets the objective is not a regression users see.
3. ``PreemptionsRising``: preemptions per request above the stable revision's by more than
   0.05 and more than twice it (each preemption recomputes a prompt: TTFT and TPOT follow).
4. ``QueueGrowing``: mean waiting requests per pod more than twice the stable's plus one.
5. Otherwise ``CanaryMeetsSLO``: promote. KV usage is evidence only: a tighter plan is expected
   to fill more of its cache.

The SLO threshold is read at its own bucket bound where the pods render kvtune's SLO buckets
(``slo_buckets``), else at vLLM's default bound at or below it, as the alert rules do:
stricter, never laxer, and the message says which.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict

Verdict = Literal["promote", "rollback", "inconclusive"]

# One-sided 99 % quantile of the standard normal: the chance that two equal revisions are told
# apart by noise alone is 1 % per check.
_Z_ONE_SIDED_99 = 2.326
# A p95 SLO: 95 % of requests within the threshold.
SLO_OBJECTIVE = 0.95


class RevisionFigures(BaseModel):
    """One revision's figures over the analysis window (all pods of that revision)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: float
    ttft_within_slo: float | None = None  # share of requests, 0..1; None: no TTFT SLO / no data
    tpot_within_slo: float | None = None
    preemptions_per_request: float = 0.0
    kv_usage_mean: float | None = None  # 0..1
    waiting_mean: float | None = None  # waiting requests per pod

    def describe(self) -> str:
        parts = [f"{self.requests:.0f} requests"]
        if self.ttft_within_slo is not None:
            parts.append(f"TTFT within SLO {self.ttft_within_slo:.1%}")
        if self.tpot_within_slo is not None:
            parts.append(f"TPOT within SLO {self.tpot_within_slo:.1%}")
        parts.append(f"{self.preemptions_per_request:.3f} preemptions/request")
        if self.kv_usage_mean is not None:
            parts.append(f"KV usage {self.kv_usage_mean:.0%}")
        if self.waiting_mean is not None:
            parts.append(f"{self.waiting_mean:.1f} waiting/pod")
        return ", ".join(parts)


class AnalysisSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    min_requests: int = 100
    min_drop: float = 0.02
    objective: float = SLO_OBJECTIVE
    ttft_bound_seconds: float | None = None  # the bucket bound the SLO was read at
    tpot_bound_seconds: float | None = None
    # The targets themselves: a bound below its target is said to be one in the message.
    ttft_slo_seconds: float | None = None
    tpot_slo_seconds: float | None = None


class CanaryAnalysis(BaseModel):
    """The verdict and its evidence (both revisions' figures), for status and Events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Verdict
    reason: str
    message: str
    stable: RevisionFigures
    canary: RevisionFigures


Check = tuple[str, str, bool]


def binomial_noise(p1: float, n1: float, p2: float, n2: float) -> float:
    """The one-sided 99 % bound on the difference of two binomial shares by chance alone."""
    variance = p1 * (1 - p1) / max(n1, 1.0) + p2 * (1 - p2) / max(n2, 1.0)
    return _Z_ONE_SIDED_99 * math.sqrt(variance)


def _read_at(bound_seconds: float | None, slo_seconds: float | None) -> str:
    if bound_seconds is None:
        return ""
    if slo_seconds is not None and bound_seconds < slo_seconds - 1e-12:
        return (f" (judged at the lower {bound_seconds:g} s bucket bound, not the "
                f"{slo_seconds:g} s target: the pods do not render kvtune's SLO buckets)")
    return f" (read at the {bound_seconds:g} s bucket)"


def _attainment(name: str, stable: float | None, canary: float | None, n_stable: float,
                n_canary: float, settings: AnalysisSettings,
                bound_seconds: float | None, slo_seconds: float | None = None) -> Check:
    reason = f"{name}AttainmentWorse"
    if stable is None or canary is None:
        return reason, f"{name}: no SLO or no data", False
    drop = stable - canary
    margin = max(settings.min_drop, binomial_noise(stable, n_stable, canary, n_canary))
    at = _read_at(bound_seconds, slo_seconds)
    if drop > margin and canary < settings.objective:
        return reason, (f"{name} within SLO{at}: canary {canary:.1%} vs stable {stable:.1%}, "
                        f"{drop:.1%} lower (noise margin {margin:.1%}) and below the "
                        f"{settings.objective:.0%} objective"), True
    return reason, f"{name} within SLO{at}: canary {canary:.1%} vs stable {stable:.1%}", False


def _preemptions(stable: RevisionFigures, canary: RevisionFigures) -> Check:
    s, c = stable.preemptions_per_request, canary.preemptions_per_request
    failed = c > s + 0.05 and c > 2 * s
    return "PreemptionsRising", (f"preemptions per request: canary {c:.3f} vs stable "
                                 f"{s:.3f}"), failed


def _queue(stable: RevisionFigures, canary: RevisionFigures) -> Check:
    if stable.waiting_mean is None or canary.waiting_mean is None:
        return "QueueGrowing", "queue: no data", False
    s, c = stable.waiting_mean, canary.waiting_mean
    return "QueueGrowing", f"waiting per pod: canary {c:.1f} vs stable {s:.1f}", c > 2 * s + 1


def analyse(stable: RevisionFigures, canary: RevisionFigures,
            settings: AnalysisSettings) -> CanaryAnalysis:
    """The verdict on a canary from both revisions' figures over the analysis window."""

    def result(verdict: Verdict, reason: str, message: str) -> CanaryAnalysis:
        return CanaryAnalysis(verdict=verdict, reason=reason, message=message, stable=stable,
                              canary=canary)

    need = settings.min_requests
    if stable.requests < need or canary.requests < need:
        return result("inconclusive", "InsufficientSample",
                      f"too few requests for a verdict: canary {canary.requests:.0f}, stable "
                      f"{stable.requests:.0f}, need {need} each (spec.rollout.minRequests)")
    checks = [
        _attainment("TTFT", stable.ttft_within_slo, canary.ttft_within_slo, stable.requests,
                    canary.requests, settings, settings.ttft_bound_seconds,
                    settings.ttft_slo_seconds),
        _attainment("TPOT", stable.tpot_within_slo, canary.tpot_within_slo, stable.requests,
                    canary.requests, settings, settings.tpot_bound_seconds,
                    settings.tpot_slo_seconds),
        _preemptions(stable, canary),
        _queue(stable, canary),
    ]
    for reason, message, failed in checks:
        if failed:
            return result("rollback", reason,
                          f"{message}; canary: {canary.describe()}; stable: {stable.describe()}")
    return result("promote", "CanaryMeetsSLO",
                  f"canary: {canary.describe()}; stable: {stable.describe()}")
