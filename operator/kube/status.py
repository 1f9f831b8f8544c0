"""The one writer of an InferenceDeployment's status: one transaction, ``update``.

Every part of the operator that reports something (the reconcile seam, the rollout
follower, the retune timer, the routing and runtime reports) hands ``update`` a mutation of
the typed ``InferenceDeploymentStatus``; nothing else patches the status subresource.
``update`` reads the object, applies the mutation to its status, and sends a JSON merge
patch carrying the object's resourceVersion (optimistic concurrency); when another writer
stored the object in between (409 Conflict) it reads again and applies the mutation to the
newer status, a bounded number of times. So no writer writes an older copy of another's
part back: the retune timer's clocks and conditions survive a reconcile that read status
before them, and the reverse (issue 24). The in-process object lock (``locks.py``) only
spares conflicts; correctness does not depend on it (a second operator replica holds
another).

The reconcile computes a whole status from the one it read; ``rebase`` turns that into a
mutation: its changes, applied to whatever status is stored when it writes.

The patch nulls what disappeared, so a field that is not in the typed model cannot survive
one write and vanish at the next: every field of status is typed (the CRD keeps no untyped
corner). Conditions are set with ``conditions.set_condition`` on the typed list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kvtune.operator.api import (
    DeploymentProfileStatus,
    InferenceDeploymentStatus,
    ObservedReuseStatus,
    ObservedSLOStatus,
    ObservedStatus,
    ProfileStatus,
    RetuneStatus,
    conditions,
)
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import status_merge

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
    # Per pool: the share of prompt tokens each KV tier supplied beside the prediction.
    observed_reuse: Mapping[str, ObservedReuseStatus] | None = None

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


class StatusConflict(RuntimeError):
    """Other writers stored the object ``MAX_ATTEMPTS`` times in a row while one mutation
    was being written; the caller's retry policy takes over (the next reconcile or tick)."""


# A status transaction's work: the status to store, given the stored one and the object it
# was read from (its metadata.generation, its spec); None: nothing to write.
Mutation = Callable[[InferenceDeploymentStatus, Mapping[str, Any]],
                    InferenceDeploymentStatus | None]

# Conflicts retried before giving up: each is another writer's write in between, and
# kvtune has six (reconcile, rollout follower, retune timer, routing, runtime, monitoring).
MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class Updated:
    """What a transaction did: whether it stored a status, and the status stored now
    (None: the object is gone)."""

    written: bool
    status: InferenceDeploymentStatus | None


def update(kube: kapply.Kube, namespace: str, name: str, mutate: Mutation, *,
           body: Mapping[str, Any] | None = None) -> Updated:
    """Read the object, apply ``mutate`` to its typed status, and store the result with a
    patch that carries the object's resourceVersion; on 409 Conflict read again and apply
    ``mutate`` to the newer status (at most ``MAX_ATTEMPTS`` times, then ``StatusConflict``).
    Nothing is written when the mutation changes nothing.

    ``body``: the caller's copy of the object (just read, or the watch's latest), used for
    the first attempt instead of a read: a copy that turns out old costs one conflict."""
    obj = body if body is not None else kapply.read_inference_deployment(kube, namespace, name)
    for _ in range(MAX_ATTEMPTS):
        if obj is None:
            return Updated(False, None)
        current = read(obj)
        new = mutate(current, obj)
        if new is None or dump(new) == dump(current):
            return Updated(False, current)
        patch = merge_patch(dict(obj.get("status") or {}), dump(new))
        outcome = kapply.patch_status(kube, namespace, name, patch,
                                      resource_version=obj["metadata"]["resourceVersion"])
        if outcome == "written":
            return Updated(True, new)
        if outcome == "gone":
            return Updated(False, None)
        obj = kapply.read_inference_deployment(kube, namespace, name)
    raise StatusConflict(f"status of InferenceDeployment {namespace}/{name}: {MAX_ATTEMPTS} "
                         f"conflicting writes in a row (409); not written, retried later")


def rebase(base: InferenceDeploymentStatus, ours: InferenceDeploymentStatus) -> Mutation:
    """The mutation that makes ``ours`` (computed from ``base``) of the stored status: the
    changes from ``base`` to ``ours``, applied to it (``status_merge.merge``). On the status
    ``base`` was read as, it gives ``ours`` exactly."""
    base_json, ours_json = dump(base), dump(ours)

    def mutate(current: InferenceDeploymentStatus,
               _obj: Mapping[str, Any]) -> InferenceDeploymentStatus:
        merged = status_merge.merge(base_json, ours_json, dump(current))
        try:
            return InferenceDeploymentStatus.model_validate(merged)
        except ValidationError:  # parts that do not fit together: ours whole, as before
            return ours

    return mutate


def changed(body: Mapping[str, Any], status: InferenceDeploymentStatus) -> bool:
    return dump(status) != dump(read(body))


def write_profile_report(kube: kapply.Kube, namespace: str, name: str, *,
                         stale: tuple[bool, str, str],
                         report: ProfileReport | None = None) -> bool:
    """The retune timer's part, merged into the freshest status: ProfileStale
    (``stale``: status, reason, message) and, after a profiling that worked, the window's
    figures and the decisions in ``status.profile`` (the reconcile seam owns the rest, and
    may just have written it). Returns whether it was written."""

    def mutate(current: InferenceDeploymentStatus,
               obj: Mapping[str, Any]) -> InferenceDeploymentStatus:
        generation = obj["metadata"].get("generation")
        conds = conditions.set_condition(current.conditions, conditions.PROFILE_STALE,
                                         *stale, generation=generation)
        profile = current.profile or DeploymentProfileStatus(source="declared")
        pools = current.pools
        if report is not None:
            profile = profile.model_copy(update=report.fields())
            seen = report.observed_slo or {}
            pools = [p.model_copy(update={"observed_slo": seen[p.name]})
                     if p.name in seen else p for p in pools]
            reuse = report.observed_reuse or {}
            pools = [p.model_copy(update={"observed_reuse": reuse[p.name]})
                     if p.name in reuse else p for p in pools]
            if report.slo_condition is not None:
                conds = conditions.set_condition(conds, conditions.SLO_BELOW_PREDICTION,
                                                 *report.slo_condition, generation=generation)
        return current.model_copy(update={"conditions": conds, "profile": profile,
                                          "pools": pools})

    return update(kube, namespace, name, mutate).written


def write_condition(kube: kapply.Kube, namespace: str, name: str, type_: str, status: str,
                    reason: str, message: str, *, only_if_present: bool = False) -> bool:
    """One condition set on the freshest status (the retune timer's monitoring report).
    ``only_if_present``: leave an absent condition absent (a report of "all is well" that
    nobody asked for). Returns whether the condition's status, reason or message changed and
    was stored, so a caller posts one Event per change, not one per retry."""

    def mutate(current: InferenceDeploymentStatus,
               obj: Mapping[str, Any]) -> InferenceDeploymentStatus | None:
        before = conditions.get_condition(current.conditions, type_)
        if before is None and only_if_present:
            return None
        if before is not None and (before.status, before.reason, before.message) == (
                status, reason, message):
            return None
        conds = conditions.set_condition(current.conditions, type_, status, reason, message,
                                         generation=obj["metadata"].get("generation"))
        return current.model_copy(update={"conditions": conds})

    return update(kube, namespace, name, mutate).written


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
