"""The one writer of an InferenceDeployment's status.

Every part of the operator that reports something (the reconcile seam, the rollout
follower, the retune timer, the runtime reports) builds a typed
``InferenceDeploymentStatus`` from the stored one and hands it to ``write``; nothing else
patches the status subresource. ``write`` compares what would be stored with what is, and
sends a JSON merge patch that nulls what disappeared, so a field that is not in the typed
model cannot survive one write and vanish at the next: every field of status is typed
(the CRD keeps no untyped corner).

Conditions are set with ``conditions.set_condition`` on the typed list, never patched alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtune.operator import apply as kapply
from kvtune.operator import conditions
from kvtune.operator.api import InferenceDeploymentStatus
from pydantic import ValidationError


@dataclass(frozen=True)
class ProfileStaleCondition:
    stale: bool
    reason: str
    message: str


def read(body: Mapping[str, Any]) -> InferenceDeploymentStatus:
    """The stored status, typed; a status no longer readable (written by an older kvtune)
    starts over rather than failing the caller."""
    raw = dict(body.get("status") or {})
    try:
        return InferenceDeploymentStatus.model_validate(raw)
    except ValidationError:
        return InferenceDeploymentStatus()


def dump(status: InferenceDeploymentStatus) -> dict[str, Any]:
    """Status as written to the API (camelCase, no nulls): what "changed" compares."""
    data: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return data


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) turning ``old`` into ``new``: keys that disappeared are
    nulled at every depth (else the server keeps them); lists are replaced whole."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def changed(body: Mapping[str, Any], status: InferenceDeploymentStatus) -> bool:
    return dump(status) != dump(read(body))


def write(kube: kapply.Kube, body: Mapping[str, Any], status: InferenceDeploymentStatus, *,
          guarded: bool = False) -> bool:
    """Store ``status`` on the object ``body`` was read as, if it differs from what is stored.

    ``guarded``: the patch carries ``body``'s resourceVersion and applies only if nobody
    wrote the object since (a refresh computed from an older copy never overwrites a newer
    status). Returns whether the status was written."""
    new = dump(status)
    stored = dict(body.get("status") or {})
    if new == dump(read(body)):
        return False
    meta = body["metadata"]
    version: str | None = meta.get("resourceVersion") if guarded else None
    return kapply.patch_status(kube, meta["namespace"], meta["name"], merge_patch(stored, new),
                               resource_version=version)


def write_profile_report(kube: kapply.Kube, namespace: str, name: str, *,
                         stale: ProfileStaleCondition,
                         profile_extra: dict[str, Any]) -> None:
    """The retune timer's part, merged into the freshest status: ProfileStale and the
    figures and decisions it keeps in ``status.profile`` (the reconcile seam owns the rest,
    and may just have written it)."""
    fresh = kapply.read_inference_deployment(kube, namespace, name)
    if fresh is None:
        return
    current = read(fresh)
    conds = conditions.set_condition(current.conditions, conditions.PROFILE_STALE,
                                     stale.stale, stale.reason, stale.message,
                                     generation=fresh["metadata"].get("generation"))
    patch: dict[str, Any] = {
        "conditions": [c.model_dump(mode="json", by_alias=True, exclude_none=True)
                       for c in conds],
        "profile": profile_extra,
    }
    if current.profile is None:
        # status.profile needs its required "source" before extras can sit in it.
        patch["profile"] = {"source": "declared", **profile_extra}
    kapply.patch_status(kube, namespace, name, patch)
