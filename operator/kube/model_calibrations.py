"""The closed loop's store: the cluster's model calibrations in one ConfigMap the operator
owns, ``kvtune-model-calibration`` in its own namespace, key ``calibrations.json``
(``tuner/model_calibration.py``; docs/calibration-loop.md).

Not the KV-quality calibration's report ConfigMaps (``kvtune-kvq-<hash>``,
``operator/calibration/``): those hold a quality measurement per model revision; this one
holds the correction terms of the planner's memory and step-time models per model x GPU
class x vLLM version x layout, for the whole cluster.

Every write is a read-modify-write under the read's ``resourceVersion`` (a PUT the API server
refuses with 409 when another writer came first; the update is then redone on the new
object), so two operator replicas or two InferenceDeployments of one model never lose each
other's evidence. A ConfigMap that is not there yet is created (a 409 there: another created
it first, read it again).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from kvtune.operator.kube import apply as kapply
from kvtune.tuner import model_calibration as mc

LOG = logging.getLogger("kvtune.operator")
CONFIG_MAP = "kvtune-model-calibration"
# Attempts of one update against concurrent writers before giving up (the next tick retries).
MAX_ATTEMPTS = 5


def namespace() -> str:
    """Where the ConfigMap lives: the operator's own namespace (``POD_NAMESPACE``, set by
    the chart), ``KVTUNE_CALIBRATION_NAMESPACE`` overriding it; ``default`` outside a pod."""
    return (os.environ.get("KVTUNE_CALIBRATION_NAMESPACE") or os.environ.get("POD_NAMESPACE")
            or "default")


def _parse(cm: dict[str, Any]) -> mc.CalibrationSet:
    """The set a ConfigMap holds; an unreadable one counts as empty (the loop starts over
    rather than stopping: every factor is re-fitted within a few ticks)."""
    try:
        return mc.set_from_document(cm)
    except (ValueError, ValidationError):
        return mc.CalibrationSet()


def read(kube: kapply.Kube, ns: str | None = None
         ) -> tuple[mc.CalibrationSet, dict[str, Any] | None]:
    """(the set, the ConfigMap as read: None when absent)."""
    try:
        cm = kube.request("GET", kapply.path("ConfigMap", ns or namespace(), CONFIG_MAP))
    except ApiException as exc:
        if exc.status == 404:
            return mc.CalibrationSet(), None
        raise
    return _parse(cm), cm


def _body(calibrations: mc.CalibrationSet, ns: str, resource_version: str | None
          ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": CONFIG_MAP, "namespace": ns,
                            "labels": {"app.kubernetes.io/managed-by": "kvtune"}}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {mc.CONFIG_MAP_KEY: calibrations.model_dump_json(indent=1)}}


def update(kube: kapply.Kube,
           mutate: Callable[[mc.CalibrationSet], mc.CalibrationSet | None],
           ns: str | None = None) -> mc.CalibrationSet | None:
    """Apply ``mutate`` to the stored set and write the result (None from ``mutate``: no
    change, nothing written). Returns what was written, None when nothing was; raises
    ``ApiException`` when every attempt met another writer."""
    ns = ns or namespace()
    for attempt in range(MAX_ATTEMPTS):
        current, cm = read(kube, ns)
        new = mutate(current)
        if new is None or new == current:
            return None
        try:
            if cm is None:
                kube.request("POST", kapply.path("ConfigMap", ns), body=_body(new, ns, None))
            else:
                version = str((cm.get("metadata") or {}).get("resourceVersion") or "")
                kube.request("PUT", kapply.path("ConfigMap", ns, CONFIG_MAP),
                             body=_body(new, ns, version))
        except ApiException as exc:
            if exc.status == 409 and attempt + 1 < MAX_ATTEMPTS:
                continue  # another writer came first: redo on what it wrote
            raise
        return new
    return None  # not reached: the last attempt returns or raises


def read_or_none(kube: kapply.Kube, ns: str | None = None) -> mc.CalibrationSet | None:
    """The set for planning; None (plan uncalibrated) when the operator may not read it
    (403: a chart without the model-calibration Role) or the API server fails: the loop is a
    correction, never a reason not to plan."""
    try:
        found, _ = read(kube, ns)
    except ApiException as exc:
        LOG.warning("model calibrations unreadable (%s %s): planning without them",
                    exc.status, exc.reason)
        return None
    return found if found.calibrations else None
