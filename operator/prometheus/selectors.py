"""Which Prometheus series belong to an InferenceDeployment, and to each of its pools. Pure.

The deployment-wide series are vLLM's own ``model_name`` label (what every vLLM exports,
whatever the scrape config). A pool's series need a label the scrape put there
(``spec.tuning.prometheus.poolSelector``):

- ``pod`` (default): Kubernetes service discovery's ``namespace`` and ``pod`` target labels
  (the usual relabeling of ``__meta_kubernetes_namespace`` / ``__meta_kubernetes_pod_name``).
  The pool's pods are its Deployment's, ``<deployment>-<pool>-<replicaset hash>-<pod hash>``
  (and the canary's, ``<deployment>-<pool>-canary-…``); the regex asks for exactly two
  dash-free parts after the name, so pool ``h200`` never takes the pods of pool ``h200-long``
  (``<deployment>-h200-long-<rs>-<pod>`` has three).
- ``labels``: pod labels copied onto the series, e.g. by ``labelmap`` of
  ``__meta_kubernetes_pod_label_(.+)``: ``kvtune.io/deployment`` and ``kvtune.io/pool``
  become ``kvtune_io_deployment`` and ``kvtune_io_pool``.
- ``none``: no per-pool series; every pool is planned on the deployment-wide profile.

Label names are overridable in the spec (``namespaceLabel``, ``podLabel``,
``deploymentLabel``, ``poolLabel``) for scrape configs that name them otherwise.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvtune.operator.api import PrometheusSpec
from kvtune.operator.api.names import object_name

# Characters RE2 (Prometheus' regex engine) treats as special.
_RE2_SPECIAL = set("\\.+*?()|[]{}^$")
# A Deployment's pods: <deployment>-<pod-template-hash>-<5 random characters>.
_POD_SUFFIX = "-[a-z0-9]+-[a-z0-9]+"


class SeriesSelector(BaseModel):
    """Label matchers: ``equal`` as ``label="value"``, ``regex`` as ``label=~"re"``
    (Prometheus anchors the regex at both ends)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    equal: dict[str, str] = Field(default_factory=dict)
    regex: dict[str, str] = Field(default_factory=dict)

    def promql(self) -> str:
        def esc(v: str) -> str:
            return v.replace("\\", "\\\\").replace('"', '\\"')

        matchers = [(k, "=", v) for k, v in self.equal.items()]
        matchers += [(k, "=~", v) for k, v in self.regex.items()]
        return "{" + ",".join(f'{k}{op}"{esc(v)}"' for k, op, v in sorted(matchers)) + "}"

    def without(self, label: str) -> SeriesSelector:
        return SeriesSelector(equal={k: v for k, v in self.equal.items() if k != label},
                              regex={k: v for k, v in self.regex.items() if k != label})


def re2_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in _RE2_SPECIAL else c for c in text)


def deployment_selector(model_name: str) -> SeriesSelector:
    """All series of the served model (vLLM's ``model_name`` label)."""
    return SeriesSelector(equal={"model_name": model_name})


def pool_selector(prom: PrometheusSpec, *, namespace: str, deployment: str,
                  pool: str) -> SeriesSelector | None:
    """The series of one pool's pods, or None with ``poolSelector: none``."""
    if prom.pool_selector == "none":
        return None
    if prom.pool_selector == "labels":
        return SeriesSelector(equal={prom.namespace_label: namespace,
                                     prom.deployment_label: deployment,
                                     prom.pool_label: pool})
    name = re2_escape(object_name(deployment, pool))
    return SeriesSelector(equal={prom.namespace_label: namespace},
                          regex={prom.pod_label: f"{name}(-canary)?{_POD_SUFFIX}"})


# The canary's pods carry kvtune.io/track=canary (canary.TRACK_LABEL); the stable ones do not.
_TRACK_LABEL_PROMETHEUS = "kvtune_io_track"


def track_selectors(prom: PrometheusSpec, *, namespace: str, deployment: str,
                    pool: str) -> tuple[SeriesSelector, SeriesSelector] | None:
    """(stable, canary): the series of a pool's stable pods and of its canary's, to judge the
    canary on live metrics; None with ``poolSelector: none`` (nothing tells them apart)."""
    if prom.pool_selector == "none":
        return None
    if prom.pool_selector == "labels":
        base = {prom.namespace_label: namespace, prom.deployment_label: deployment,
                prom.pool_label: pool}
        # =~"" matches a series without the label: the stable pods carry no track label.
        return (SeriesSelector(equal=base, regex={_TRACK_LABEL_PROMETHEUS: "(stable)?"}),
                SeriesSelector(equal={**base, _TRACK_LABEL_PROMETHEUS: "canary"}))
    name = re2_escape(object_name(deployment, pool))
    ns = {prom.namespace_label: namespace}
    return (SeriesSelector(equal=ns, regex={prom.pod_label: f"{name}{_POD_SUFFIX}"}),
            SeriesSelector(equal=ns, regex={prom.pod_label: f"{name}-canary{_POD_SUFFIX}"}))
