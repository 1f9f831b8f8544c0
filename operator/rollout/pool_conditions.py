"""The conditions of an InferenceDeployment from its pools' outcomes. Pure: the conditions
before and the outcomes in, the conditions and the Events they call for out. The reconcile
seam (``operator/reconcile.py``) calls ``conditions_from_outcomes`` once per reconcile."""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.operator.api import Condition, InferenceDeploymentSpec, InferenceDeploymentStatus
from kvtune.operator.api import conditions as cond
from kvtune.operator.calibration import calibration_flow
from kvtune.operator.rollout.outcome import Event, PoolOutcome

NO_NODES_RETRY_SECONDS = 30.0


@dataclass(frozen=True)
class Stamp:
    """What every condition set by this reconcile carries: the spec's generation, the clock."""

    generation: int | None
    now: str | None

    def set(self, conditions: list[Condition], type_: str, ok: bool | str, reason: str,
            message: str) -> list[Condition]:
        return cond.set_condition(conditions, type_, ok, reason, message,
                                  generation=self.generation, now=self.now)


def conditions_from_outcomes(
    conditions: list[Condition], stamp: Stamp, *, spec: InferenceDeploymentSpec,
    previous: InferenceDeploymentStatus, outcomes: list[PoolOutcome],
    failures: list[tuple[str, str]], gate: calibration_flow.Gate,
) -> tuple[list[Condition], list[Event]]:
    """Degraded, Progressing, Ready, KVQualityVerified and SLOAtRisk from the pools'
    outcomes. Pure: the conditions before and the outcomes in, the conditions and the
    Events they call for out."""
    conditions = _rollout_conditions(conditions, stamp, spec.tuning.mode, outcomes, failures)
    # A narrower KV dtype nobody can measure here: said as a condition (the wider dtype stays
    # unless the spec accepts it unverified); cleared once nothing is unverified.
    if gate.unverified:
        conditions = stamp.set(conditions, cond.KV_QUALITY_VERIFIED, False,
                               cond.ACCEPTED_UNVERIFIED
                               if spec.quality is not None and spec.quality.accept_unverified
                               else cond.KV_QUALITY_UNMEASURABLE, gate.status().message)
    elif cond.get_condition(conditions, cond.KV_QUALITY_VERIFIED) is not None:
        conditions = stamp.set(conditions, cond.KV_QUALITY_VERIFIED, True, cond.KV_QUALITY_OK,
                               gate.status().message)
    return _slo_conditions(conditions, stamp, previous, outcomes)


def _rollout_conditions(conditions: list[Condition], stamp: Stamp, mode: str,
                        outcomes: list[PoolOutcome],
                        failures: list[tuple[str, str]]) -> list[Condition]:
    """Degraded, Progressing and Ready. Pure."""
    rolling = [f"{o.status.name}: {o.rolling}" for o in outcomes if o.rolling]
    waiting = [o.status.name for o in outcomes if o.no_nodes]
    # Pools whose capacity search runs as a Job (operator/search/search_jobs.py); those
    # without a plan yet are not ready.
    searching = [f"{o.status.name}: {o.searching}" for o in outcomes if o.searching]
    unplanned = [f"{o.status.name}: {o.searching}" for o in outcomes
                 if o.searching and o.status.plan is None]
    if failures:
        conditions = stamp.set(conditions, cond.DEGRADED, True, failures[0][0],
                               " | ".join(m for _, m in failures))
    else:
        conditions = stamp.set(conditions, cond.DEGRADED, False, cond.AS_EXPECTED, "")
    if searching:
        conditions = stamp.set(conditions, cond.PROGRESSING, True, cond.SEARCH_RUNNING,
                               "; ".join(searching + rolling))
    elif rolling:
        conditions = stamp.set(conditions, cond.PROGRESSING, True, cond.ROLLING_OUT,
                               "; ".join(rolling))
    else:
        conditions = stamp.set(
            conditions, cond.PROGRESSING, False,
            cond.ROLLED_OUT if mode == "auto" else cond.RECOMMENDED,
            "every pool runs its current plan" if mode == "auto"
            else "plans are in status; nothing is applied (tuning.mode=recommend)")
    if failures:
        return stamp.set(conditions, cond.READY, False, failures[0][0], failures[0][1])
    if waiting:
        return stamp.set(conditions, cond.READY, False, cond.POOL_WITHOUT_NODES,
                         f"no schedulable nodes of the GPU class for pool(s) "
                         f"{', '.join(waiting)}; retrying every {NO_NODES_RETRY_SECONDS:.0f}s")
    if unplanned:
        return stamp.set(conditions, cond.READY, False, cond.SEARCH_RUNNING,
                         "; ".join(unplanned))
    if rolling:
        return stamp.set(conditions, cond.READY, False, cond.ROLLING_OUT, "; ".join(rolling))
    if mode == "recommend":
        return stamp.set(conditions, cond.READY, True, cond.RECOMMENDED,
                         f"{len(outcomes)} pool plan(s) recommended in status; nothing applied")
    return stamp.set(conditions, cond.READY, True, cond.ALL_POOLS_APPLIED,
                     f"{len(outcomes)} pool(s) run their plan")


def _slo_conditions(conditions: list[Condition], stamp: Stamp,
                    previous: InferenceDeploymentStatus, outcomes: list[PoolOutcome]
                    ) -> tuple[list[Condition], list[Event]]:
    """The capacity search's prediction (pools planned on observed traffic): SLOAtRisk with
    the numbers, and an Event when it appears or its numbers change. Pure."""
    events = []
    at_risk = " | ".join(f"{o.status.name}: {o.status.slo_at_risk}" for o in outcomes
                         if o.status.slo_at_risk)
    if at_risk:
        was = cond.get_condition(previous.conditions, cond.SLO_AT_RISK)
        conditions = stamp.set(conditions, cond.SLO_AT_RISK, True, cond.SLO_UNREACHABLE if any(
            (o.status.slo_at_risk or "").startswith("SLO unreachable") for o in outcomes)
            else cond.SLO_AT_RISK, at_risk)
        if was is None or was.status != "True" or was.message != at_risk:
            events.append(Event("Warning", cond.SLO_AT_RISK, at_risk))
    elif any(o.status.expected is not None and o.status.expected.slo_attainment is not None
             for o in outcomes):
        conditions = stamp.set(
            conditions, cond.SLO_AT_RISK, False, cond.SLO_PREDICTED_MET,
            "the capacity search predicts every searched pool meets the SLO at the observed "
            "rate")
    return conditions, events
