"""The pod templates of a workload the operator applies, each held to the pod policy.

``pod_policy.check`` reads one pod template. What the operator applies is a workload that
carries one or two: a Deployment's or a Job's ``spec.template``, and a LeaderWorkerSet's
``spec.leaderWorkerTemplate.leaderTemplate`` and ``.workerTemplate`` (LWS v0.9.0,
``api/leaderworkerset/v1``: the leaderTemplate is optional, and without it the leader pod is
made from the workerTemplate). The chart's admission policies (``operator-pods``,
``operator-lws-leaders``, ``operator-lws-workers``) read the same paths at the API server.

The renderer checks the pod before it builds the workload, but an LWS's worker template is
a changed copy (``operator/render/leader_worker_set.py: worker_container``), so the policy is
checked again on the templates exactly as they will be applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtune.operator.render import leader_worker_set as lws
from kvtune.operator.render import pod_policy

LWS_TEMPLATES = "spec.leaderWorkerTemplate"


def pod_templates(obj: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(path, pod template) of every pod template ``obj`` carries, leader first; none for a
    kind that makes no pods (a Service, a PodDisruptionBudget)."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    if obj.get("kind") == lws.KIND:
        group = spec.get("leaderWorkerTemplate")
        group = group if isinstance(group, Mapping) else {}
        return [(f"{LWS_TEMPLATES}.{key}", group[key])
                for key in ("leaderTemplate", "workerTemplate")
                if isinstance(group.get(key), Mapping)]
    template = spec.get("template")
    if obj.get("kind") in ("Deployment", "Job") and isinstance(template, Mapping):
        return [("spec.template", template)]
    return []


def check(obj: Mapping[str, Any], level: pod_policy.Level | None = None) -> None:
    """Raise ``pod_policy.PolicyViolation`` naming the workload and the template when one of
    ``obj``'s pod templates breaks the policy."""
    name = f"{obj.get('kind')} {(obj.get('metadata') or {}).get('name')}"
    for where, template in pod_templates(obj):
        try:
            pod_policy.check(template, level)
        except pod_policy.PolicyViolation as exc:
            raise pod_policy.PolicyViolation(f"{name} {where}: {exc}") from exc
