"""The spec's monitoring: the Prometheus-operator scrape objects and rules.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from kvtune.operator.api.durations import DURATION_PATTERN
from kvtune.operator.api.schema_base import _Model, _rules
from kvtune.operator.api.spec_bounds import (
    LabelValue,
    check_durations,
    check_labels,
    duration_rules,
    label_rules,
)

_LABELS_DESCRIPTION = ("Extra labels, e.g. the `release` label your Prometheus selects on "
                       "(kube-prometheus-stack: release=<its release name>).")


class ScrapeSpec(_Model):
    """How the Prometheus operator scrapes the pools' vLLM pods (it ignores the
    prometheus.io annotations a stock Prometheus reads)."""

    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.monitoring.scrape", "interval"),
        *label_rules("spec.monitoring.scrape", "labels", reserved=True)))

    enabled: bool = Field(default=True, description=(
        "Render a PodMonitor (or ServiceMonitor) per pool; applied where the cluster serves "
        "monitoring.coreos.com, deleted when switched off."))
    kind: Literal["PodMonitor", "ServiceMonitor"] = Field(
        default="PodMonitor",
        description="PodMonitor selects the pool's pods; ServiceMonitor its Service.")
    interval: str | None = Field(default=None, pattern=DURATION_PATTERN, max_length=32,
                                 description="Scrape interval; empty: Prometheus's own.")
    labels: dict[str, LabelValue] | None = Field(default=None, max_length=16,
                                                 description=_LABELS_DESCRIPTION)

    @model_validator(mode="after")
    def _bounded(self) -> ScrapeSpec:
        check_durations(self, "spec.monitoring.scrape", "interval")
        check_labels(self.labels, "spec.monitoring.scrape.labels", reserved=True)
        return self


class PrometheusRuleSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        *label_rules("spec.monitoring.prometheusRule", "labels", reserved=True)))

    enabled: bool = Field(default=True, description=(
        "Render this deployment's KV-cache and SLO alerts as a PrometheusRule (the one source "
        "of kvtune's alert rules); deleted when switched off."))
    labels: dict[str, LabelValue] | None = Field(
        default=None, max_length=16,
        description="Extra labels for the Prometheus ruleSelector (kube-prometheus-stack: "
                    "release=<its release name>).")

    @model_validator(mode="after")
    def _bounded(self) -> PrometheusRuleSpec:
        check_labels(self.labels, "spec.monitoring.prometheusRule.labels", reserved=True)
        return self


class MonitoringSpec(_Model):
    scrape: ScrapeSpec = ScrapeSpec()
    prometheus_rule: PrometheusRuleSpec = PrometheusRuleSpec()
