"""The Prometheus-operator objects of one InferenceDeployment, rendered from its spec: a
PodMonitor (or ServiceMonitor) per pool, so that a kube-prometheus-stack Prometheus scrapes the
vLLM pods (the Prometheus operator ignores the ``prometheus.io`` annotations a stock Prometheus
reads), and the PrometheusRule of its alerts (``operator/prometheus/alerts.py``) with the labels its
``ruleSelector`` wants. Pure: body in, objects out. ``alert_rules.py`` applies them.

The scrape keeps the labels the profiler and the alerts select on: ``namespace`` and ``pod``
(the operator's target labels) and the pod labels ``kvtune.io/deployment`` and
``kvtune.io/pool`` copied as ``kvtune_io_deployment`` / ``kvtune_io_pool`` (``podTargetLabels``,
``spec.tuning.prometheus.poolSelector: labels``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api.names import LABEL_DEPLOYMENT, LABEL_METRICS, LABEL_POOL, object_name
from kvtune.operator.prometheus import alerts

GROUP, VERSION = "monitoring.coreos.com", "v1"
PLURALS = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors",
           "PrometheusRule": "prometheusrules"}
MANAGED_BY = {"app.kubernetes.io/managed-by": "kvtune"}
VLLM_PORT_NAME = "http"  # the pod's and the Service's port name (operator/render/templates)
# The chart's monitoring.labels (default {release: <Helm release>}: what a stock
# kube-prometheus-stack's serviceMonitorSelector/podMonitorSelector/ruleSelector match), as a
# JSON object, on every object rendered here.
LABELS_ENV = "KVTUNE_MONITORING_LABELS"


def chart_labels() -> dict[str, str]:
    """``KVTUNE_MONITORING_LABELS`` (the chart's ``monitoring.labels``); {} when unset."""
    text = os.environ.get(LABELS_ENV)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{LABELS_ENV}={text[:80]!r} is not a JSON object of strings; set "
                         f"the chart value monitoring.labels (e.g. {{release: prometheus}})")
    return value


def _spec(body: Mapping[str, Any]) -> InferenceDeploymentSpec:
    return InferenceDeploymentSpec.model_validate(body.get("spec") or {})


def _meta(name: str, namespace: str, labels: Mapping[str, str],
          owner: Mapping[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name[:253], "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return meta


def scrape_monitors(body: Mapping[str, Any], owner: Mapping[str, Any] | None = None
                    ) -> list[dict[str, Any]]:
    """One PodMonitor (or ServiceMonitor) per pool; empty when ``spec.monitoring.scrape`` is
    switched off."""
    spec = _spec(body)
    scrape = spec.monitoring.scrape
    if not scrape.enabled:
        return []
    meta_in = body["metadata"]
    name, namespace = meta_in["name"], meta_in["namespace"]
    endpoint: dict[str, Any] = {"port": VLLM_PORT_NAME, "path": "/metrics"}
    if scrape.interval:
        endpoint["interval"] = scrape.interval
    out = []
    for pool in spec.pools:
        selector = {LABEL_DEPLOYMENT: name, LABEL_POOL: pool.pool_name}
        # kvtune's own labels last: a tenant's (refused at admission since issue 25) never
        # overrides the labels kvtune and its admission policy select on.
        labels = {**chart_labels(), **(scrape.labels or {}), **MANAGED_BY, **selector}
        meta = _meta(object_name(name, pool.pool_name), namespace, labels, owner)
        copied = [LABEL_DEPLOYMENT, LABEL_POOL]
        if scrape.kind == "PodMonitor":
            monitor_spec: dict[str, Any] = {
                "selector": {"matchLabels": selector},
                "podMetricsEndpoints": [endpoint],
                "podTargetLabels": copied,
            }
        else:
            monitor_spec = {
                "selector": {"matchLabels": {**selector, LABEL_METRICS: "true"}},
                "endpoints": [endpoint],
                "podTargetLabels": copied,
            }
        out.append({"apiVersion": f"{GROUP}/{VERSION}", "kind": scrape.kind,
                    "metadata": meta, "spec": monitor_spec})
    return out


def prometheus_rule(body: Mapping[str, Any], owner: Mapping[str, Any] | None = None
                    ) -> dict[str, Any] | None:
    """The deployment's PrometheusRule with ``spec.monitoring.prometheusRule.labels``; None
    when switched off."""
    rule_spec = _spec(body).monitoring.prometheus_rule
    if not rule_spec.enabled:
        return None
    rule = alerts.prometheus_rule(alerts.inputs_from_body(body), owner)
    rule["metadata"]["labels"] = {**chart_labels(), **(rule_spec.labels or {}),
                                  **rule["metadata"]["labels"]}
    return rule


def monitoring_objects(body: Mapping[str, Any], owner: Mapping[str, Any] | None = None
                       ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(objects to apply, (kind, name) of kvtune's objects to delete because switched off)."""
    meta_in = body["metadata"]
    spec = _spec(body)
    wanted = scrape_monitors(body, owner)
    rule = prometheus_rule(body, owner)
    if rule is not None:
        wanted.append(rule)
    kept = {(o["kind"], o["metadata"]["name"]) for o in wanted}
    candidates = [(kind, object_name(meta_in["name"], p.pool_name))
                  for kind in ("PodMonitor", "ServiceMonitor") for p in spec.pools]
    candidates.append(("PrometheusRule", f"{meta_in['name']}-kvtune"[:253]))
    return wanted, [c for c in candidates if c not in kept]
