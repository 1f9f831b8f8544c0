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

from pydantic import ValidationError

from kvtune.operator import apply as kapply
from kvtune.operator import conditions
from kvtune.operator.api import (
    DeploymentProfileStatus,
    InferenceDeploymentStatus,
    ObservedSLOStatus,
    ObservedStatus,
    ProfileStatus,
    RetuneStatus,
)

# The fields of status.profile the retune timer writes; the reconcile seam keeps them.
TIMER_FIELDS = ("observed", "trusted", "profile_message", "retune")


@dataclass(frozen=True)
class ProfileReport:
    """What a profiling that worked adds to ``status.profile``."""

    observed: ObservedStatus
    trusted: bool
    profile_message: str
    retune: RetuneStatus

    # Per pool: the SLO attainment its histograms showed beside the prediction, and the
    # SLOBelowPrediction condition (status, reason, message) when it is to be set.
    observed_slo: Mapping[str, ObservedSLOStatus] | None = None
    slo_condition: tuple[str, str, str] | None = None

    def fields(self) -> dict[str, Any]:
        return {"observed": self.observed, "trusted": self.trusted,
                "profile_message": self.profile_message, "retune": self.retune}


def read(body: Mapping[str, Any]) -> InferenceDeploymentStatus:
    """The stored status, typed; a status no longer readable (written by an older kvtune)
    starts over rather than failing the caller."""
    raw = dict(body.get("status") or {})
    try:
        return InferenceDeploymentStatus.model_validate(raw)
    except ValidationError:
        pass
    # Keep what the reconcile seam wrote when only the timer's part is unreadable.
    profile = {k: v for k, v in (raw.get("profile") or {}).items()
               if k not in ("observed", "trusted", "profileMessage", "retune")}
    try:
        return InferenceDeploymentStatus.model_validate({**raw, "profile": profile or None})
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
    written: bool = kapply.patch_status(kube, meta["namespace"], meta["name"],
                                        merge_patch(stored, new), resource_version=version)
    return written


def write_profile_report(kube: kapply.Kube, namespace: str, name: str, *,
                         stale: tuple[bool, str, str],
                         report: ProfileReport | None = None) -> bool:
    """The retune timer's part, merged into the freshest status: ProfileStale
    (``stale``: status, reason, message) and, after a profiling that worked, the window's
    figures and the decisions in ``status.profile`` (the reconcile seam owns the rest, and
    may just have written it)."""
    fresh = kapply.read_inference_deployment(kube, namespace, name)
    if fresh is None:
        return False
    current = read(fresh)
    stale_, reason, message = stale
    conds = conditions.set_condition(current.conditions, conditions.PROFILE_STALE, stale_,
                                     reason, message,
                                     generation=fresh["metadata"].get("generation"))
    profile = current.profile or DeploymentProfileStatus(source="declared")
    pools = current.pools
    if report is not None:
        profile = profile.model_copy(update=report.fields())
        seen = report.observed_slo or {}
        pools = [p.model_copy(update={"observed_slo": seen[p.name]}) if p.name in seen else p
                 for p in pools]
        if report.slo_condition is not None:
            conds = conditions.set_condition(conds, conditions.SLO_BELOW_PREDICTION,
                                             *report.slo_condition,
                                             generation=fresh["metadata"].get("generation"))
    return write(kube, fresh, current.model_copy(update={"conditions": conds,
                                                         "profile": profile, "pools": pools}))


def write_condition(kube: kapply.Kube, namespace: str, name: str, type_: str, status: str,
                    reason: str, message: str, *, only_if_present: bool = False) -> bool:
    """One condition set on the freshest status (the retune timer's monitoring report).
    ``only_if_present``: leave an absent condition absent (a report of "all is well" that
    nobody asked for). Returns whether the condition's status, reason or message changed and
    was stored, so a caller posts one Event per change, not one per retry."""
    fresh = kapply.read_inference_deployment(kube, namespace, name)
    if fresh is None:
        return False
    current = read(fresh)
    before = conditions.get_condition(current.conditions, type_)
    if before is None and only_if_present:
        return False
    if before is not None and (before.status, before.reason, before.message) == (
            status, reason, message):
        return False
    conds = conditions.set_condition(current.conditions, type_, status, reason, message,
                                     generation=fresh["metadata"].get("generation"))
    return write(kube, fresh, current.model_copy(update={"conditions": conds}), guarded=True)


def with_timer_part(profile: ProfileStatus,
                    previous: DeploymentProfileStatus | None) -> DeploymentProfileStatus:
    """``profile`` (what the reconcile seam planned on) as ``status.profile``, keeping the
    retune timer's part of the previous one: its clocks must outlive every reconcile."""
    timer = {} if previous is None else {k: getattr(previous, k) for k in TIMER_FIELDS}
    return DeploymentProfileStatus(**{**_fields(profile), **timer})


def without_timer_part(profile: ProfileStatus) -> ProfileStatus:
    """A profile as shown in ``pools[].profile`` (the timer's part is the deployment's)."""
    return ProfileStatus(**_fields(profile))


def _fields(profile: ProfileStatus) -> dict[str, Any]:
    return {k: getattr(profile, k) for k in ProfileStatus.model_fields}
