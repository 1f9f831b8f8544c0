"""The canary decision, step by step, and the canary Deployment's shape."""

from __future__ import annotations

from typing import Any

import pytest
from op_samples import make_pool_plan

from kvtune.operator.render.objects import RenderInput, render_pool
from kvtune.operator.rollout.canary_analysis import CanaryAnalysis, RevisionFigures
from kvtune.operator.rollout.canary_objects import TRACK_LABEL, canary_objects, decide

T0, T5, T20, T700 = ("2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z", "2026-01-01T00:00:20Z",
                     "2026-01-01T00:11:40Z")


def _dep(available: int, stuck: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Progressing", "status": "False",
                   "reason": "ProgressDeadlineExceeded", "message": "timed out"}] if stuck else []
    return {"metadata": {"generation": 1}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 1, "updatedReplicas": available, "replicas": 1,
                       "availableReplicas": available, "conditions": conditions}}


BASE: dict[str, Any] = dict(
    canary_replicas=1, replicas=4, running_hash="old", new_hash="new", canary_hash="new",
    canary_started_at=T0, rejected_hash=None, canary_deployment=_dep(1), now=T20,
    analysis_seconds=10, deadline_seconds=600,
)


@pytest.mark.parametrize(("change", "action"), [
    ({}, "promote"),  # available through the analysis
    ({"now": T5}, "wait"),  # available, analysis not over
    ({"canary_deployment": _dep(0)}, "wait"),  # starting
    ({"canary_deployment": _dep(0), "now": T700}, "rollback"),  # never available
    ({"canary_deployment": _dep(0, stuck=True)}, "rollback"),  # past its progress deadline
    ({"canary_hash": None, "canary_started_at": None, "canary_deployment": None}, "start"),
    ({"canary_hash": "older"}, "start"),  # the plan moved on during a canary: start over
    ({"canary_deployment": None}, "start"),  # someone deleted it
    ({"rejected_hash": "new"}, "rejected"),
    ({"new_hash": "old"}, "plain"),  # nothing to roll out
    ({"canary_replicas": 0}, "plain"),
    ({"replicas": 1}, "plain"),  # a canary would be the whole pool
    ({"running_hash": None}, "plain"),  # first rollout: nothing to compare with
])
def test_decide(change: dict[str, Any], action: str) -> None:
    assert decide(**{**BASE, **change}).action == action


def _verdict(verdict: str, reason: str = "R") -> CanaryAnalysis:
    figures = RevisionFigures(requests=500, ttft_within_slo=0.9)
    return CanaryAnalysis(verdict=verdict, reason=reason, message=f"{reason} evidence",  # type: ignore[arg-type]
                          stable=figures, canary=figures)


T_PAST_DEADLINE = "2026-01-01T00:10:11Z"  # 611 s: past analysis (10 s) + deadline (600 s)


@pytest.mark.parametrize(("change", "action", "said"), [
    ({"live": True}, "analyse", "judging it on live metrics"),
    ({"live": True, "now": T5}, "wait", "analysis 5s of 10s"),
    ({"live": True, "analysis": _verdict("promote", "CanaryMeetsSLO")}, "promote",
     "CanaryMeetsSLO evidence"),
    ({"live": True, "analysis": _verdict("rollback", "TTFTAttainmentWorse")}, "rollback",
     "worse for users (TTFTAttainmentWorse)"),
    ({"live": True, "analysis": _verdict("inconclusive", "InsufficientSample")}, "wait",
     "no verdict yet"),
    ({"live": True, "analysis": _verdict("inconclusive"), "now": T_PAST_DEADLINE}, "promote",
     "onInconclusive=promote"),
    ({"live": True, "analysis": _verdict("inconclusive"), "now": T_PAST_DEADLINE,
      "on_inconclusive": "rollback"}, "rollback", "onInconclusive=rollback"),
    ({}, "promote", "no live metrics"),
    # A canary that is not available is rolled back whatever its metrics say.
    ({"live": True, "canary_deployment": _dep(0, stuck=True),
      "analysis": _verdict("promote")}, "rollback", "no progress"),
])
def test_decide_on_live_metrics(change: dict[str, Any], action: str, said: str) -> None:
    decision = decide(**{**BASE, **change})
    assert decision.action == action
    assert said in decision.message


def test_canary_deployment_has_its_own_name_replicas_and_selector() -> None:
    objects = render_pool(RenderInput(
        name="bot", namespace="llm", pool="h100", pool_plan=make_pool_plan(),
        model_name="m", image="img", replicas=4, revision=2))
    canary = canary_objects(objects, name="bot-h100-canary", replicas=1)
    main = next(o for o in objects if o["kind"] == "Deployment")
    assert canary["metadata"]["name"] == "bot-h100-canary" and canary["spec"]["replicas"] == 1
    assert canary["spec"]["selector"]["matchLabels"][TRACK_LABEL] == "canary"
    assert canary["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] == "canary"
    # The pool's Service (selecting deployment + pool) reaches the canary's pods too.
    service = next(o for o in objects if o["kind"] == "Service")
    assert service["spec"]["selector"].items() <= canary["spec"]["template"]["metadata"][
        "labels"].items()
    assert canary["spec"]["template"]["spec"] == main["spec"]["template"]["spec"]
    assert TRACK_LABEL not in main["spec"]["template"]["metadata"]["labels"]  # not mutated
