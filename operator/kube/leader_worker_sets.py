"""A multi-node pool's LeaderWorkerSet on the API server: read it, and read its rollout's
progress from its status as the LWS v0.9.0 controller writes it (docs/multi-node.md).

The controller (``pkg/controllers/leaderworkerset_controller.go: updateConditions`` in
``sigs.k8s.io/lws@v0.9.0``) sets ``status.observedGeneration``, ``readyReplicas`` (groups whose
leader and worker StatefulSet are ready), ``updatedReplicas`` (groups on the current template
revision), ``replicas`` (groups created) and one of three True conditions: ``Available``
(``AllGroupsReady``: every group ready and updated), ``Progressing`` (``GroupsProgressing``) or
``UpdateInProgress`` (``GroupsUpdating``: a template change is being rolled group by group).
It has no progress deadline, so a rollout that cannot go on is found from the pods
(``operator/rollout/observe.py: pod_problem``).

Where the LWS CRD is not installed, the API server answers 404 for its path: a read is then
None (nothing to find), and the apply is refused naming the fix (``apply.apply_object``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvtune.operator.api.names import LABEL_DEPLOYMENT, LABEL_POOL
from kvtune.operator.kube import apply as kapply
from kvtune.operator.render import leader_worker_set as lws

KIND = lws.KIND


def read(kube: kapply.Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The LWS as the server holds it; None when there is none, no LWS CRD (404), or the
    operator may not read LWSs (403: it cannot have made one then; its apply says so)."""
    try:
        return kube.request("GET", kapply.path(KIND, namespace, name))
    except ApiException as exc:
        if exc.status in (403, 404):
            return None
        raise


def delete_ours(kube: kapply.Kube, namespace: str, name: str,
                owner: Mapping[str, Any]) -> bool:
    """Delete kvtune's LWS of ``owner`` (a pool that went back to one node per replica);
    False when there is none. Someone else's is left alone (``NameCollision``)."""
    existing = read(kube, namespace, name)
    if existing is None:
        return False
    whose = kapply.foreign_owner(existing, owner)
    if whose is not None:
        raise kapply.NameCollision(f"{KIND} {namespace}/{name} was not deleted: kvtune did "
                                   f"not create it for InferenceDeployment "
                                   f"{owner['metadata']['name']} ({whose})")
    try:
        kube.request("DELETE", kapply.path(KIND, namespace, name), body={
            "propagationPolicy": "Background",
            "preconditions": {"uid": existing["metadata"]["uid"]}})
    except ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def _condition_true(status: Mapping[str, Any], type_: str, generation: int) -> bool:
    """Whether the controller holds ``type_`` True for this generation of the spec."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == type_:
            return condition.get("status") == "True" and \
                int(condition.get("observedGeneration", generation)) >= generation
    return False


def rollout_done(group_set: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether every group runs the current template and is ready, and what is left (the
    counterpart of ``apply.rollout_done`` for a Deployment)."""
    meta, spec = group_set.get("metadata") or {}, group_set.get("spec") or {}
    status = group_set.get("status") or {}
    generation = int(meta.get("generation", 0))
    want = int(spec.get("replicas", 1))
    name = meta.get("name", "?")
    if int(status.get("observedGeneration", 0)) < generation:
        return False, f"the {KIND} controller has not seen {name}'s new template yet"
    updated = int(status.get("updatedReplicas", 0))
    ready = int(status.get("readyReplicas", 0))
    total = int(status.get("replicas", 0))
    if updated < want or _condition_true(status, "UpdateInProgress", generation):
        return False, f"{min(updated, want)}/{want} groups updated ({KIND} {name})"
    if total > want:
        return False, f"{total - want} old groups pending termination ({KIND} {name})"
    if ready < want or not _condition_true(status, "Available", generation):
        return False, f"{min(ready, want)}/{want} groups ready ({KIND} {name})"
    return True, f"{want}/{want} groups updated and ready ({KIND} {name})"


def pod_selector(group_set: Mapping[str, Any]) -> str | None:
    """The label selector of the LWS's pods (leaders and workers): its pool's labels, which
    both templates carry; None when they are missing."""
    labels = (group_set.get("metadata") or {}).get("labels") or {}
    if LABEL_DEPLOYMENT not in labels or LABEL_POOL not in labels:
        return None
    return f"{LABEL_DEPLOYMENT}={labels[LABEL_DEPLOYMENT]},{LABEL_POOL}={labels[LABEL_POOL]}"
