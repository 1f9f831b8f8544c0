"""Canary rollout of a new plan: a few replicas run it beside the old plan before all do.

When a pool's plan changes and ``spec.rollout.canaryReplicas`` is set (and below the pool's
replicas), kvtune does not touch the running Deployment. It starts ``<name>-<pool>-canary``
with the new plan and ``canaryReplicas`` replicas (the pool's Service sends it its share of
traffic), waits ``spec.rollout.analysis`` with the canary available, then promotes (the main
Deployment takes the plan, the canary goes) or, when the canary's pods are not available in
time (they OOM at start, the runtime refuses the plan, they cannot be scheduled), rolls back:
the canary goes, the plan is marked rejected and the pool stays on the old plan.

Availability is necessary, not sufficient: a new KV plan can be worse for users while every
pod is healthy. With live metrics (``spec.tuning.prometheus`` and a pool selector that tells
the canary's series from the stable ones), once the canary has been available for the
analysis window ``decide`` asks for an analysis (``analyse``) and then judges the canary on
what users feel (``canary_analysis.py``: TTFT/TPOT attainment against the SLO, preemptions,
queue, both revisions side by side, after a minimum sample). Without live metrics the canary
is promoted on availability, and status says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kvtune.operator.kube.apply import rollout_done, rollout_stuck
from kvtune.operator.render.objects import model_server
from kvtune.operator.rollout.canary_analysis import CanaryAnalysis

Action = Literal["plain", "start", "wait", "analyse", "promote", "rollback", "rejected"]


@dataclass(frozen=True)
class Decision:
    action: Action
    message: str


def seconds_between(start: str, now: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(now, fmt) - datetime.strptime(start, fmt)).total_seconds()


def decide(
    *,
    canary_replicas: int,
    replicas: int,
    running_hash: str | None,
    new_hash: str,
    canary_hash: str | None,
    canary_started_at: str | None,
    rejected_hash: str | None,
    canary_deployment: Mapping[str, Any] | None,
    now: str,
    analysis_seconds: float,
    deadline_seconds: float,
    live: bool = False,
    analysis: CanaryAnalysis | None = None,
    on_inconclusive: Literal["promote", "rollback"] = "promote",
) -> Decision:
    """What to do with one pool's rollout. Pure: the caller reads the objects and acts.

    ``live``: the canary can be judged on live metrics; ``decide`` then answers ``analyse``
    once the canary has been available through the window, and the caller calls it again with
    the ``analysis``."""
    if canary_replicas <= 0 or replicas <= canary_replicas or running_hash is None:
        return Decision("plain", "no canary: rolling update")
    if new_hash == running_hash:
        return Decision("plain", "the running plan is current")
    if new_hash == rejected_hash:
        return Decision("rejected", "this plan failed its canary before")
    if canary_hash != new_hash or canary_started_at is None or canary_deployment is None:
        return Decision("start", f"canary of {canary_replicas} replica(s) starts")
    elapsed = max(0.0, seconds_between(canary_started_at, now))
    stuck = rollout_stuck(canary_deployment)
    if stuck is not None:
        return Decision("rollback", f"the canary made no progress: {stuck}")
    done, progress = rollout_done(canary_deployment)
    if not done:
        if elapsed > analysis_seconds + deadline_seconds:
            return Decision("rollback", f"the canary is not available after {elapsed:.0f}s "
                                        f"({progress})")
        return Decision("wait", f"canary starting: {progress}")
    if elapsed < analysis_seconds:
        return Decision("wait", f"canary available; analysis {elapsed:.0f}s of "
                                f"{analysis_seconds:.0f}s")
    available = f"the canary was available through the {analysis_seconds:.0f}s analysis"
    if not live:
        return Decision("promote", f"{available} (no live metrics to judge it on: "
                                   f"spec.tuning.prometheus with poolSelector pod or labels)")
    if analysis is None:
        return Decision("analyse", f"{available}; judging it on live metrics")
    if analysis.verdict == "promote":
        return Decision("promote", f"{available} and is not worse for users: "
                                   f"{analysis.message}")
    if analysis.verdict == "rollback":
        return Decision("rollback", f"the canary is worse for users ({analysis.reason}): "
                                    f"{analysis.message}")
    if elapsed <= analysis_seconds + deadline_seconds:
        return Decision("wait", f"canary available, no verdict yet: {analysis.message}")
    return Decision(on_inconclusive, f"no verdict after {elapsed:.0f}s "
                                     f"(spec.rollout.onInconclusive={on_inconclusive}): "
                                     f"{analysis.message}")


def canary_objects(objects: list[dict[str, Any]], *, name: str, replicas: int) -> dict[str, Any]:
    """The canary Deployment from a pool's rendered objects: the same pods with the new plan,
    its own name, ``canaryReplicas`` replicas and a selector of its own (track=canary)."""
    deployment = model_server(objects)
    canary = {**deployment, "metadata": {**deployment["metadata"], "name": name}}
    labels = {**deployment["metadata"]["labels"], TRACK_LABEL: "canary"}
    canary["metadata"]["labels"] = labels
    spec = dict(deployment["spec"])
    spec["replicas"] = replicas
    spec["selector"] = {"matchLabels": {**spec["selector"]["matchLabels"],
                                        TRACK_LABEL: "canary"}}
    template = dict(spec["template"])
    template["metadata"] = {**template["metadata"],
                            "labels": {**template["metadata"]["labels"], TRACK_LABEL: "canary"}}
    spec["template"] = template
    canary["spec"] = spec
    return canary


TRACK_LABEL = "kvtune.io/track"
