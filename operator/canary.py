"""Canary rollout of a new plan: a few replicas run it beside the old plan before all do.

When a pool's plan changes and ``spec.rollout.canaryReplicas`` is set (and below the pool's
replicas), kvtune does not touch the running Deployment. It starts ``<name>-<pool>-canary``
with the new plan and ``canaryReplicas`` replicas (the pool's Service sends it its share of
traffic), waits ``spec.rollout.analysis`` with the canary available, then promotes (the main
Deployment takes the plan, the canary goes) or, when the canary's pods are not available in
time (they OOM at start, the runtime refuses the plan, they cannot be scheduled), rolls back:
the canary goes, the plan is marked rejected and the pool stays on the old plan.

The analysis here is availability over time; an analysis on live metrics (TTFT/TPOT against
the SLO) can replace ``decide``'s health input without changing the flow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kvtune.operator.apply import rollout_done, rollout_stuck

Action = Literal["plain", "start", "wait", "promote", "rollback", "rejected"]


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
) -> Decision:
    """What to do with one pool's rollout. Pure: the caller reads the objects and acts."""
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
    if elapsed >= analysis_seconds:
        return Decision("promote", f"the canary was available through the {analysis_seconds:.0f}s"
                                   f" analysis")
    return Decision("wait", f"canary available; analysis {elapsed:.0f}s of "
                            f"{analysis_seconds:.0f}s")


def canary_objects(objects: list[dict[str, Any]], *, name: str, replicas: int) -> dict[str, Any]:
    """The canary Deployment from a pool's rendered objects: the same pods with the new plan,
    its own name, ``canaryReplicas`` replicas and a selector of its own (track=canary)."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
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
