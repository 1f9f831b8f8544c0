"""The canary verdict from both revisions' figures (pure), and its PromQL."""

from __future__ import annotations

import pytest

from kvtune.operator.api import PrometheusSpec
from kvtune.operator.prometheus import selectors
from kvtune.operator.rollout import canary_metrics
from kvtune.operator.rollout.canary_analysis import AnalysisSettings, RevisionFigures, analyse

SETTINGS = AnalysisSettings(min_requests=100, ttft_bound_seconds=1.0, tpot_bound_seconds=0.1)


def fig(requests: float = 1000, ttft: float | None = 0.99, tpot: float | None = 0.99,
        preempt: float = 0.0, waiting: float | None = 0.5) -> RevisionFigures:
    return RevisionFigures(requests=requests, ttft_within_slo=ttft, tpot_within_slo=tpot,
                           preemptions_per_request=preempt, kv_usage_mean=0.5,
                           waiting_mean=waiting)


def test_no_verdict_before_the_minimum_sample() -> None:
    verdict = analyse(fig(), fig(requests=99, ttft=0.1), SETTINGS)
    assert verdict.verdict == "inconclusive"
    assert verdict.reason == "InsufficientSample"
    assert "canary 99" in verdict.message and "spec.rollout.minRequests" in verdict.message


def test_equal_revisions_promote_with_both_figures_as_evidence() -> None:
    verdict = analyse(fig(ttft=0.97), fig(ttft=0.965), SETTINGS)
    assert verdict.verdict == "promote"
    assert verdict.reason == "CanaryMeetsSLO"
    assert "96.5%" in verdict.message and "97.0%" in verdict.message


@pytest.mark.parametrize(("metric", "reason"), [("ttft", "TTFTAttainmentWorse"),
                                                ("tpot", "TPOTAttainmentWorse")])
def test_a_canary_clearly_worse_and_below_the_objective_rolls_back(metric: str,
                                                                   reason: str) -> None:
    worse = fig(**{metric: 0.80})
    verdict = analyse(fig(), worse, SETTINGS)
    assert verdict.verdict == "rollback"
    assert verdict.reason == reason
    assert "80.0%" in verdict.message and "99.0%" in verdict.message


def test_worse_but_still_meeting_the_objective_is_not_a_regression() -> None:
    verdict = analyse(fig(ttft=0.999), fig(ttft=0.96), SETTINGS)
    assert verdict.verdict == "promote"


def test_a_drop_within_the_noise_of_small_samples_is_not_a_regression() -> None:
    # 150 requests each: 93 % vs 90 % is within two binomial standard errors.
    verdict = analyse(fig(requests=150, ttft=0.93), fig(requests=150, ttft=0.90), SETTINGS)
    assert verdict.verdict == "promote"
    # The same shares over 20,000 requests each are told apart.
    verdict = analyse(fig(requests=20000, ttft=0.93), fig(requests=20000, ttft=0.90), SETTINGS)
    assert verdict.verdict == "rollback"


def test_preemptions_and_queue_roll_back_even_when_latency_holds() -> None:
    assert analyse(fig(preempt=0.01), fig(preempt=0.2), SETTINGS).reason == "PreemptionsRising"
    assert analyse(fig(preempt=0.2), fig(preempt=0.25), SETTINGS).verdict == "promote"
    assert analyse(fig(waiting=1.0), fig(waiting=8.0), SETTINGS).reason == "QueueGrowing"


def test_without_slo_data_only_preemptions_and_queue_judge() -> None:
    verdict = analyse(fig(ttft=None, tpot=None), fig(ttft=None, tpot=None), SETTINGS)
    assert verdict.verdict == "promote"


def test_track_selectors_split_stable_and_canary_pods() -> None:
    import re

    prom = PrometheusSpec(url="http://127.0.0.1:9090")
    pair = selectors.track_selectors(prom, namespace="llm", deployment="bot", pool="h200")
    assert pair is not None
    stable, canary = pair
    s_re, c_re = stable.regex["pod"], canary.regex["pod"]
    assert re.fullmatch(s_re, "bot-h200-6f7d9c8b5-x2x7q")
    assert not re.fullmatch(s_re, "bot-h200-canary-6f7d9c8b5-x2x7q")
    assert re.fullmatch(c_re, "bot-h200-canary-6f7d9c8b5-x2x7q")
    assert not re.fullmatch(c_re, "bot-h200-6f7d9c8b5-x2x7q")
    assert not re.fullmatch(s_re, "bot-h200-long-6f7d9c8b5-x2x7q")
    labels = PrometheusSpec(url="http://127.0.0.1:9090", pool_selector="labels")
    pair = selectors.track_selectors(labels, namespace="llm", deployment="bot", pool="h200")
    assert pair is not None and pair[1].equal["kvtune_io_track"] == "canary"
    none = PrometheusSpec(url="http://127.0.0.1:9090", pool_selector="none")
    assert selectors.track_selectors(none, namespace="llm", deployment="bot", pool="h200") \
        is None


def test_queries_read_the_slo_at_the_bucket_bound_below_it() -> None:
    assert canary_metrics.ttft_bound(2.0) == 1.0  # TTFT buckets: … 1.0, 2.5 …
    assert canary_metrics.tpot_bound(0.08) == 0.075
    qs = canary_metrics.revision_queries(selectors.SeriesSelector(equal={"namespace": "llm"}),
                                         600, ttft_bound_seconds=1.0,
                                         tpot_bound_seconds=0.075)
    assert 'le="1.0"' in qs["ttft_within_slo"]
    assert 'le="0.075"' in qs["tpot_within_slo"]
    assert "[600s]" in qs["requests"]


def test_figures_from_missing_or_not_finite_answers_are_no_data() -> None:
    got = canary_metrics.figures({"requests": 200.0, "preemptions": 10.0,
                                  "ttft_within_slo": float("nan"), "tpot_within_slo": None,
                                  "kv_usage_mean": 1.3})
    assert got.requests == 200
    assert got.preemptions_per_request == pytest.approx(0.05)
    assert got.ttft_within_slo is None and got.tpot_within_slo is None
    assert got.kv_usage_mean == 1.0  # a share, clamped
    assert got.waiting_mean is None
    assert canary_metrics.figures({}).requests == 0


def test_rendered_slo_buckets_read_the_exact_threshold() -> None:
    # The pods render the targets as bounds (slo_buckets): le is the target itself.
    assert canary_metrics.ttft_bound(2.0, rendered=True) == 2.0
    assert canary_metrics.tpot_bound(0.08, rendered=True) == 0.08
    qs = canary_metrics.revision_queries(selectors.SeriesSelector(equal={"namespace": "llm"}),
                                         600, ttft_bound_seconds=2.0, tpot_bound_seconds=0.08)
    assert 'le="2.0"' in qs["ttft_within_slo"] and 'le="0.08"' in qs["tpot_within_slo"]


@pytest.mark.parametrize(("bound", "said"), [
    (2.0, "read at the 2 s bucket)"),
    (1.0, "judged at the lower 1 s bucket bound, not the 2 s target"),
])
def test_the_verdict_says_at_which_bound_the_slo_was_read(bound: float, said: str) -> None:
    settings = AnalysisSettings(min_requests=100, ttft_bound_seconds=bound, ttft_slo_seconds=2.0)
    worse = analyse(RevisionFigures(requests=500, ttft_within_slo=0.99),
                    RevisionFigures(requests=500, ttft_within_slo=0.80), settings)
    assert worse.verdict == "rollback" and said in worse.message
