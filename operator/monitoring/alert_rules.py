"""Apply the Prometheus-operator objects of an InferenceDeployment
(``operator/prometheus/monitors.py``
renders them: the PrometheusRule of its alerts, a PodMonitor or ServiceMonitor per pool) when
the cluster runs the Prometheus operator. The edge half: server-side apply, owned by the
InferenceDeployment (garbage-collected with it), repeated only when the objects change; an
object switched off in ``spec.monitoring`` is deleted. Like every child (``operator/kube/apply.py``)
an object of that name that kvtune did not create for this InferenceDeployment is never
taken over or deleted (``NameCollision``).

Without the ``monitoring.coreos.com`` API nothing is applied; ``kvtune alerts --format rules``
writes the same rules for a stock Prometheus, which scrapes the pods by their
``prometheus.io`` annotations.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvtune.operator.kube import apply as kapply
from kvtune.operator.prometheus import monitors

GROUP, VERSION = monitors.GROUP, monitors.VERSION
PLURAL = monitors.PLURALS["PrometheusRule"]
FIELD_MANAGER = "kvtune"


def rendered_objects(body: Mapping[str, Any]
                     ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(objects to apply, (kind, name) to delete) for this deployment's spec.monitoring."""
    return monitors.monitoring_objects(body, kapply.owner_reference(body))


def digest(objects: Any) -> str:
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()[:16]


def _read(kube: kapply.Kube, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    """The object, or None when there is none (or its kind is not served: a 404 either way)."""
    try:
        current = kube.request("GET", kapply.path(kind, namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise kapply.ApplyError(f"cannot read {kind} {namespace}/{name} to check who owns it: "
                                f"{exc.status} {exc.reason}") from exc
    assert isinstance(current, dict), type(current)
    return current


def apply_object(kube: kapply.Kube, obj: dict[str, Any], owner: Mapping[str, Any]) -> bool:
    """Server-side apply; False when the cluster does not serve this kind (nothing to do).
    ``NameCollision`` when an object of that name is not kvtune's for ``owner``."""
    meta = obj["metadata"]
    existing = _read(kube, meta["namespace"], obj["kind"], meta["name"])
    if existing is not None:
        whose = kapply.foreign_owner(existing, owner, meta.get("labels"))
        if whose is not None:
            raise kapply.NameCollision(
                f"{obj['kind']} {meta['namespace']}/{meta['name']} already exists and kvtune "
                f"did not create it for InferenceDeployment {owner['metadata']['name']} "
                f"({whose}); kvtune leaves it alone: rename it or the InferenceDeployment")
    try:
        kube.request("PATCH", kapply.path(obj["kind"], meta["namespace"], meta["name"]),
                     query={"fieldManager": FIELD_MANAGER, "force": True}, body=obj,
                     content_type=kapply.APPLY_CONTENT_TYPE)
    except ApiException as exc:
        # Server-side apply creates missing objects: a 404 means the API is not served.
        if exc.status == 404:
            return False
        raise kapply.ApplyError(
            f"{obj['kind']} {meta['namespace']}/{meta['name']} was refused by the API "
            f"server: {exc.status} {exc.reason}") from exc
    return True


def delete_object(kube: kapply.Kube, namespace: str, kind: str, name: str,
                  owner: Mapping[str, Any]) -> bool:
    """Delete kvtune's object of this kind and name for ``owner`` (its controller reference;
    a ``managed-by: kvtune`` label alone proves nothing); False when there was none or it is
    not kvtune's."""
    current = _read(kube, namespace, kind, name)
    if current is None or kapply.foreign_owner(current, owner) is not None:
        return False
    try:
        kube.request("DELETE", kapply.path(kind, namespace, name),
                     body={"preconditions": {"uid": current["metadata"]["uid"]}})
    except ApiException as exc:
        if exc.status in (404, 409):  # gone meanwhile, or replaced by another object
            return False
        raise kapply.ApplyError(
            f"cannot delete {kind} {namespace}/{name}: {exc.status} {exc.reason}") from exc
    return True


def apply_rule(kube: kapply.Kube, rule: dict[str, Any], owner: Mapping[str, Any]) -> bool:
    """Server-side apply of a PrometheusRule (kept for callers that render one rule)."""
    return apply_object(kube, rule, owner)
