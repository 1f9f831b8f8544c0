"""The workload a plan is made for, from the spec (declared) or from status (observed).

The declared workload is a preset refined by whatever quantiles the spec gives; a quantile the
spec leaves out comes from the preset, raised where needed so the chain never decreases.
"""

from __future__ import annotations

from typing import Any

from kvtune.operator.api import (
    CandidateProfileStatus,
    DeclaredTokens,
    ProfileScope,
    ProfileStatus,
    TokenQuantilesStatus,
    WorkloadSpec,
)
from kvtune.tuner.workload import SecondsQuantiles, TokenQuantiles, WorkloadProfile

_ORDER = ("p50", "p90", "p95", "p99", "max")


def merge_quantiles(base: TokenQuantiles, declared: DeclaredTokens | None) -> TokenQuantiles:
    """``base`` with the declared quantiles put in; the preset's own quantiles are raised or
    lowered to fit between the declared ones, so the chain never decreases."""
    values: dict[str, int | None] = base.model_dump()
    fixed = {k for k in _ORDER if declared is not None and getattr(declared, k) is not None}
    for key in fixed:
        values[key] = getattr(declared, key)
    floor = 0
    for key in _ORDER:
        value = values[key]
        if value is not None:
            values[key] = value if key in fixed else max(value, floor)
            floor = values[key] or 0
    ceiling: int | None = None
    for key in reversed(_ORDER):
        value = values[key]
        if value is not None:
            if key not in fixed and ceiling is not None:
                values[key] = min(value, ceiling)
            ceiling = values[key]
    return TokenQuantiles.model_validate(values)


def declared_profile(workload: WorkloadSpec) -> WorkloadProfile:
    from kvtune.tuner.planner.presets import preset_profile

    # The preset's context distribution is rescaled to the declared p95 (its own convention).
    hint = workload.context_tokens.p95 if workload.context_tokens is not None else None
    base = preset_profile(workload.profile, hint)
    update: dict[str, Any] = {
        "source": "declared",
        "kind": workload.profile,
        "context_tokens": merge_quantiles(base.context_tokens, workload.context_tokens),
        "output_tokens": merge_quantiles(base.output_tokens, workload.output_tokens),
    }
    if workload.shared_prefix_tokens is not None:
        update["shared_prefix_tokens"] = workload.shared_prefix_tokens
    if workload.multi_turn is not None:
        update["multi_turn"] = workload.multi_turn
    if workload.request_rate_per_second is not None:
        update["request_rate_per_second"] = workload.request_rate_per_second
    return WorkloadProfile.model_validate({**base.model_dump(), **update})


def _quantiles_status(q: TokenQuantiles) -> TokenQuantilesStatus:
    return TokenQuantilesStatus(p50=q.p50, p90=q.p90, p95=q.p95, p99=q.p99, max=q.max)


def profile_status(profile: WorkloadProfile, *, window: str | None = None,
                   observed_at: str | None = None,
                   scope: ProfileScope | None = None) -> ProfileStatus:
    """``profile`` as status, whole: ``profile_from_status`` gives back an equal profile (the
    planning-inputs digest of the plan in force is computed on it again)."""
    return ProfileStatus(
        source=profile.source,
        scope=scope,
        kind=profile.kind,
        window=window,
        requests=profile.requests,
        context_tokens=_quantiles_status(profile.context_tokens),
        output_tokens=_quantiles_status(profile.output_tokens),
        shared_prefix_tokens=profile.shared_prefix_tokens,
        prefix_hit_rate=profile.prefix_hit_rate,
        request_rate_per_second=profile.request_rate_per_second,
        observed_at=observed_at,
        arrival_cv=profile.arrival_cv,
        window_seconds=profile.window_seconds,
        notes=list(profile.notes),
        **reuse_status_fields(profile),
    )


_REUSE_FIELDS = ("prefix_reuse_gap_seconds", "prefix_reuse_distance_tokens",
                 "session_gap_seconds", "kv_block_idle_before_evict_seconds")


def reuse_status_fields(profile: WorkloadProfile) -> dict[str, Any]:
    """The profile's reuse quantiles as status fields (absent when not observed)."""
    out: dict[str, Any] = {}
    for name in _REUSE_FIELDS:
        value = getattr(profile, name)
        if value is not None:
            out[name] = value.model_dump()
    return out


def reuse_from_status(status: ProfileStatus | CandidateProfileStatus) -> dict[str, Any]:
    """The reuse quantiles kept in status, as ``WorkloadProfile`` fields."""
    out: dict[str, Any] = {}
    for name in _REUSE_FIELDS:
        value = getattr(status, name)
        if value is None:
            out[name] = None
        elif name == "prefix_reuse_distance_tokens":
            out[name] = TokenQuantiles.model_validate(value.model_dump())
        else:
            out[name] = SecondsQuantiles.model_validate(value.model_dump())
    return out


def profile_from_status(status: ProfileStatus | None, base: WorkloadProfile) -> WorkloadProfile:
    """The observed profile kept in status (so a spec edit does not forget what Prometheus
    showed), or ``base`` when status holds no complete observed profile.

    The profile comes back exactly as it was planned on, with two exceptions that metrics
    cannot tell: its kind and whether requests continue a conversation are ``base``'s (the
    declared workload's; the retune timer observes with them too). A status an older kvtune
    wrote lacks the window and the notes: ``base``'s are not put in their place (a preset's
    notes on observed traffic would be a different profile)."""
    if status is None or status.source != "prometheus" or status.context_tokens is None \
            or status.output_tokens is None:
        return base
    return WorkloadProfile(
        source="prometheus", kind=base.kind, multi_turn=base.multi_turn,
        context_tokens=TokenQuantiles.model_validate(status.context_tokens.model_dump()),
        output_tokens=TokenQuantiles.model_validate(status.output_tokens.model_dump()),
        shared_prefix_tokens=status.shared_prefix_tokens
        if status.shared_prefix_tokens is not None else base.shared_prefix_tokens,
        prefix_hit_rate=status.prefix_hit_rate,
        request_rate_per_second=status.request_rate_per_second,
        arrival_cv=status.arrival_cv, requests=status.requests,
        window_seconds=status.window_seconds, notes=tuple(status.notes or ()),
        **reuse_from_status(status),
    )
