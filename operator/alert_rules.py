"""Apply the Prometheus-operator objects of an InferenceDeployment (``operator/monitors.py``
renders them: the PrometheusRule of its alerts, a PodMonitor or ServiceMonitor per pool) when
the cluster runs the Prometheus operator. The edge half: server-side apply, owned by the
InferenceDeployment (garbage-collected with it), repeated only when the objects change; an
object switched off in ``spec.monitoring`` is deleted.

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

from kvtune.operator import apply as kapply
from kvtune.operator import monitors

GROUP, VERSION = monitors.GROUP, monitors.VERSION
PLURAL = monitors.PLURALS["PrometheusRule"]
FIELD_MANAGER = "kvtune"


def rendered_objects(body: Mapping[str, Any]
                     ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(objects to apply, (kind, name) to delete) for this deployment's spec.monitoring."""
    return monitors.monitoring_objects(body, kapply.owner_reference(body))


def digest(objects: Any) -> str:
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()[:16]


def apply_object(kube: kapply.Kube, obj: dict[str, Any]) -> bool:
    """Server-side apply; False when the cluster does not serve this kind (nothing to do)."""
    meta = obj["metadata"]
    try:
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], monitors.PLURALS[obj["kind"]], meta["name"], obj,
            field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml",
        )
    except ApiException as exc:
        # Server-side apply creates missing objects: a 404 means the API is not served.
        if exc.status == 404:
            return False
        raise kapply.ApplyError(
            f"{obj['kind']} {meta['namespace']}/{meta['name']} was refused by the API "
            f"server: {exc.status} {exc.reason}") from exc
    return True


def delete_object(kube: kapply.Kube, namespace: str, kind: str, name: str) -> bool:
    """Delete kvtune's object of this kind and name (only one kvtune manages); False when
    there was none."""
    plural = monitors.PLURALS[kind]
    try:
        current = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural,
                                                           name)
        assert isinstance(current, dict), type(current)
        labels = (current.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") != "kvtune":
            return False
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise kapply.ApplyError(
            f"cannot delete {kind} {namespace}/{name}: {exc.status} {exc.reason}") from exc
    return True


def apply_rule(kube: kapply.Kube, rule: dict[str, Any]) -> bool:
    """Server-side apply of a PrometheusRule (kept for callers that render one rule)."""
    return apply_object(kube, rule)
