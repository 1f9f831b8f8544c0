"""Status conditions, as Argo CD and ``kubectl wait`` read them.

A condition's ``lastTransitionTime`` moves only when its ``status`` flips (a new reason or
message alone does not move it), so "Ready since" stays true. The reason constants below
are the documented vocabulary; each is CamelCase.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from kvtune.operator.api import Condition

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
# Set by the profiling module when the Prometheus profile is older than the window allows.
PROFILE_STALE = "ProfileStale"
# Set from the runtime entrypoint's reports (spec.runtime.entrypoint: kvtune): whether the
# pods run the plan as planned (operator/monitoring/runtime_reports.py).
RUNTIME_AS_PLANNED = "RuntimeAsPlanned"
# True when the capacity search predicts that no configuration meets the SLO at the observed
# rate (the message has the numbers); set only once a pool's plan comes from the search.
SLO_AT_RISK = "SLOAtRisk"
SLO_PREDICTED_MET = "SLOPredictedMet"  # SLOAtRisk=False
# SLOAtRisk=True, from a closed-form bound before any simulation: no configuration meets the
# SLO at any rate (the best attainable latency in the message; tuner/simulator/slo_bound.py).
SLO_UNREACHABLE = "SLOUnreachable"
# True when vLLM's own histograms show a pool attaining its SLO clearly less than the
# capacity search predicted (beyond noise, after a minimum sample; operator/retune/slo_observed.py).
SLO_BELOW_PREDICTION = "SLOBelowPrediction"
# Set by the retune timer's monitoring sync (retune_handlers.sync_alert_rules) only once a
# monitoring object's name was taken by an object kvtune did not create: False/NameCollision,
# then True/MonitoringApplied when nothing collides any more.
MONITORING_READY = "MonitoringReady"
# spec.routing.enabled: whether each pool's endpoint picker is available (its ServiceAccount
# exists) and the gateway accepted the HTTPRoute (operator/monitoring/routing_status.py).
ROUTING_READY = "RoutingReady"
# Set once a planned narrower KV dtype could not be measured here (calibration disabled, no
# image, Jobs forbidden): False/KVQualityUnmeasurable while the wider dtype stays, False/
# AcceptedUnverified with spec.quality.acceptUnverified; True again once nothing is unverified
# (operator/calibration/calibration_flow.py, issue 25).
KV_QUALITY_VERIFIED = "KVQualityVerified"
CONDITION_TYPES = (READY, PROGRESSING, DEGRADED, PROFILE_STALE, RUNTIME_AS_PLANNED,
                   SLO_AT_RISK, SLO_BELOW_PREDICTION, MONITORING_READY, ROUTING_READY,
                   KV_QUALITY_VERIFIED)

# Reasons.
ALL_POOLS_APPLIED = "AllPoolsApplied"  # Ready=True: every pool's runtime carries its plan
RECOMMENDED = "Recommended"  # mode=recommend: plans are in status, nothing applied
TUNING_OFF = "TuningOff"  # mode=off: the runtime is left alone
POOL_WITHOUT_NODES = "PoolWithoutNodes"  # a pool's GPU class has no nodes (retried)
ROLLING_OUT = "RollingOut"  # a Deployment has not yet all replicas updated and available
ROLLED_OUT = "RolledOut"
CANARY_FAILED = "CanaryFailed"  # a new plan's canary was not available in time: rolled back
ROLLOUT_STUCK = "RolloutStuck"  # new pods not ready by spec.rollout.progressDeadline
INVALID_SPEC = "InvalidSpec"  # a spec field that can never work (names field, value, fix)
NO_FEASIBLE_PLAN = "NoFeasiblePlan"  # the model does not fit a pool
# A prefill/decode pair whose plans vLLM's NixlConnector handshake would refuse (field, the two
# values, the fix; operator/rollout/role_plan.py): neither pool rolls out.
KV_TRANSFER_INCOMPATIBLE = "KVTransferIncompatible"
# A new plan for a pool whose replicas span nodes (spec.pools[].nodesPerReplica > 1) with
# spec.rollout.canaryReplicas set: kvtune runs no canary LeaderWorkerSet, so the plan is held
# (field and fix named) rather than rolled out with no canary.
MULTI_NODE_CANARY_UNSUPPORTED = "MultiNodeCanaryUnsupported"
UNKNOWN_MODEL = "UnknownModel"
INVALID_POD_TEMPLATE = "InvalidPodTemplate"  # the user's template renders no valid object
# The namespace's templates are rendering or used their CPU budget (render_fairness): retried.
TEMPLATE_RENDER_DEFERRED = "TemplateRenderDeferred"
APPLY_FAILED = "ApplyFailed"
# Degraded: the capacity search's budget (the chart's search values) ran out before it scored
# a single candidate; retried (operator/search/search_budget.py).
SEARCH_BUDGET_SPENT = "SearchBudgetSpent"
# Progressing: a pool's capacity search runs as a Job (the chart's search.mode); Degraded: that
# Job failed after its retries, or its answer did not fit (operator/search/search_jobs.py).
SEARCH_RUNNING = "SearchRunning"
SEARCH_JOB_FAILED = "SearchJobFailed"
# An object of a child's kind and name exists that kvtune did not create for this
# InferenceDeployment and pool: it is left alone (never adopted or overwritten).
NAME_COLLISION = "NameCollision"
MONITORING_APPLIED = "MonitoringApplied"  # MonitoringReady=True: no name collides (any more)
RECONCILE_FAILED = "ReconcileFailed"  # an unexpected error (the API server, a bug): retried
AS_EXPECTED = "AsExpected"  # Degraded=False
# RuntimeAsPlanned: every reporting pod runs the plan's memory fraction (within 5 points).
AS_PLANNED = "AsPlanned"
KV_QUALITY_UNMEASURABLE = "KVQualityUnmeasurable"  # KVQualityVerified=False: wider dtype kept
ACCEPTED_UNVERIFIED = "AcceptedUnverified"  # KVQualityVerified=False: rolled out unmeasured
KV_QUALITY_OK = "NothingUnverified"  # KVQualityVerified=True
AWAITING_REPORTS = "AwaitingRuntimeReports"  # Unknown: no pod of the current plan reported
GPU_MEMORY_LOWERED = "GpuMemoryLowered"  # the runtime lowered the fraction: less KV cache
RUNTIME_REFUSED = "RuntimeRefused"  # the runtime refused to start vLLM: the plan cannot fit
# RoutingReady reasons.
ROUTED = "Routed"  # True: pickers available; the gateway accepted the route (or there is none)
AWAITING_GATEWAY = "AwaitingGateway"  # Unknown: no gateway has reported on the route yet
ROUTE_NOT_ACCEPTED = "RouteNotAccepted"  # the gateway's Accepted=False, with its reason
ROUTE_REFS_UNRESOLVED = "RouteRefsUnresolved"  # the gateway's ResolvedRefs=False
ENDPOINT_PICKER_UNAVAILABLE = "EndpointPickerUnavailable"  # a pool's picker is not available
# The namespace has no ServiceAccount kvtune-endpoint-picker (the chart's runtime.namespaces).
ENDPOINT_PICKER_ACCESS_MISSING = "EndpointPickerAccessMissing"
ROUTING_UNREADABLE = "RoutingStatusUnreadable"  # Unknown: a read was refused (the message)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Iterable[Condition],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str | None = None,
) -> list[Condition]:
    """``conditions`` with ``type_`` set; its transition time kept unless the status flips.

    ``now`` is injectable so tests (and replays) are deterministic.
    """
    text = status if isinstance(status, str) else ("True" if status else "False")
    out: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        moved = cond.status != text
        out.append(Condition(
            type=type_, status=text, reason=reason, message=message,
            last_transition_time=(now or now_rfc3339()) if moved else cond.last_transition_time,
            observed_generation=generation,
        ))
    if not found:
        out.append(Condition(
            type=type_, status=text, reason=reason, message=message,
            last_transition_time=now or now_rfc3339(), observed_generation=generation,
        ))
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: (order.get(c.type, len(order)), c.type))


def get_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
