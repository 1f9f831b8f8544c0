"""Apply the PrometheusRule of an InferenceDeployment (``operator/alerts.py`` renders it) when
the cluster runs the Prometheus operator. The edge half: one server-side apply, owned by the
InferenceDeployment (garbage-collected with it), repeated only when the rules change.

Without the ``monitoring.coreos.com`` API the rules are not applied; ``kvtune alerts
--format rules`` writes the same rules for a stock Prometheus.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvtune.operator import alerts
from kvtune.operator import apply as kapply

GROUP, VERSION, PLURAL = "monitoring.coreos.com", "v1", "prometheusrules"
FIELD_MANAGER = "kvtune"


def rendered_rule(body: Mapping[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = alerts.prometheus_rule(alerts.inputs_from_body(body),
                                                  kapply.owner_reference(body))
    return rule


def rule_digest(rule: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(rule, sort_keys=True).encode()).hexdigest()[:16]


def apply_rule(kube: kapply.Kube, rule: dict[str, Any]) -> bool:
    """Server-side apply; False when the cluster has no PrometheusRule API (nothing to do)."""
    meta = rule["metadata"]
    try:
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], rule,
            field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml",
        )
    except ApiException as exc:
        # Server-side apply creates missing objects: a 404 means the API is not served.
        if exc.status == 404:
            return False
        raise kapply.ApplyError(
            f"PrometheusRule {meta['namespace']}/{meta['name']} was refused by the API "
            f"server: {exc.status} {exc.reason}") from exc
    return True
