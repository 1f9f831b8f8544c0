"""The closed loop, once per retune tick: what vLLM measured of each pool against what the
planner predicted for the plan it runs, fitted into the cluster's model calibration
(``operator/kube/model_calibrations.py``) and shown as the ``CalibrationDrift`` condition
and the ``kvtune_calibration_ratio`` gauge (docs/calibration-loop.md).

Per pool with a plan in force (not under tensorParallel auto) and its own series:
``calibration_series.read_window`` gives the window; ``observation`` (pure) puts the planner's
predictions beside it (``tuner/planner/calibration_predict.py``, with the calibration the plan
is made with); ``tuner.model_calibration.fit`` updates the key's factors in one
resourceVersion-checked write. A factor moves only on enough evidence and outside half the
margin, so a calibrated pool is left alone and noise never re-plans. When a factor moved, the
retune timer reconciles once: the plan is made again with it (its inputs' digest holds the
factors), and rolled out if a knob changed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client import Gauge

from kvtune.operator import api
from kvtune.operator.api import conditions as cond
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import model_calibrations
from kvtune.operator.kube import status as status_writer
from kvtune.operator.kube.locks import object_lock
from kvtune.operator.monitoring import metrics
from kvtune.operator.prometheus import calibration_series, profiling
from kvtune.operator.prometheus.prom_http import PrometheusAccess, PrometheusUnavailable
from kvtune.operator.prometheus.selectors import SeriesSelector
from kvtune.operator.rollout import plan as plan_stage
from kvtune.tuner import model_calibration as mc
from kvtune.tuner.errors import KVTuneError
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner import calibration_predict as cp
from kvtune.tuner.planner.request import PlanRequest

LOG = logging.getLogger("kvtune.operator")

CALIBRATION_DRIFT = "CalibrationDrift"
# CalibrationDrift's reasons: True, a figure parts from its prediction by more than the
# margin; False, every figure with evidence holds; Unknown, none has enough evidence yet.
PREDICTIONS_DRIFT = "PredictionsDrift"
PREDICTIONS_HOLD = "PredictionsHold"
AWAITING_EVIDENCE = "AwaitingEvidence"

CALIBRATION_RATIO = Gauge(
    "kvtune_calibration_ratio",
    "Observed over predicted, per pool and figure (kv_blocks, prefill_seconds, "
    "decode_seconds), for the plan in force; 1 is a model that holds.",
    ["namespace", "name", "pool", "figure"], registry=metrics.REGISTRY,
)


def drift_margin() -> float:
    """The chart's ``retune.calibrationDriftMargin`` (``KVTUNE_CALIBRATION_DRIFT_MARGIN``)."""
    raw = os.environ.get("KVTUNE_CALIBRATION_DRIFT_MARGIN")
    try:
        value = float(raw) if raw else mc.DEFAULT_DRIFT_MARGIN
    except ValueError:
        value = mc.DEFAULT_DRIFT_MARGIN
    return value if 0.0 < value < 1.0 else mc.DEFAULT_DRIFT_MARGIN


@dataclass(frozen=True)
class PoolLoop:
    pool: str
    key: mc.CalibrationKey
    observation: mc.CalibrationObservation
    findings: tuple[mc.DriftFinding, ...]


@dataclass(frozen=True)
class LoopResult:
    pools: tuple[PoolLoop, ...]
    written: mc.CalibrationSet | None  # what the tick wrote (None: no factor moved)


def observation(request: PlanRequest, plan: KVPlan,
                window: calibration_series.CalibrationWindow) -> mc.CalibrationObservation:
    """The window beside the planner's predictions for ``plan`` at its operating point."""
    blocks = cp.predicted_blocks(request, plan)
    steps = None
    if window.running_mean is not None and window.context_tokens_mean is not None:
        steps = cp.predicted_steps(request, plan, window.running_mean,
                                   window.context_tokens_mean,
                                   window.prefill_tokens_mean or window.context_tokens_mean)
    return mc.CalibrationObservation(
        predicted_kv_blocks=blocks,
        observed_kv_blocks=window.num_gpu_blocks if window.block_size == plan.block_size
        else None,
        kv_reports=1 if window.num_gpu_blocks is not None else 0,
        predicted_prefill_seconds=steps.prefill_seconds if steps else None,
        observed_prefill_seconds=window.prefill_seconds_mean,
        prefill_requests=window.prefill_requests,
        predicted_decode_seconds=steps.decode_seconds if steps else None,
        observed_decode_seconds=window.decode_seconds_mean,
        decode_tokens=window.decode_tokens,
    )


def condition(pools: tuple[PoolLoop, ...]) -> tuple[str, str, str]:
    """(status, reason, message) of CalibrationDrift over every pool."""
    drifting = [f"pool {p.pool} ({p.key.text}): " + "; ".join(f.message for f in p.findings)
                for p in pools if p.findings]
    if drifting:
        return "True", PREDICTIONS_DRIFT, " | ".join(drifting) + (
            "; kvtune re-fits the model calibration and re-plans (docs/calibration-loop.md)")
    held = [p for p in pools if mc.ratios(p.observation)]
    if not held:
        return "Unknown", AWAITING_EVIDENCE, (
            "no pool has enough evidence yet (a KV size from vllm:cache_config_info, "
            f"{mc.MIN_PREFILL_REQUESTS} prefills, {mc.MIN_DECODE_TOKENS} output tokens)")
    return "False", PREDICTIONS_HOLD, "predictions hold within the margin for " + ", ".join(
        f"{p.pool} ({', '.join(f'{k} {v:.2f}x' for k, v in mc.ratios(p.observation).items())})"
        for p in held)


def observe(kube: kapply.Kube, body: Mapping[str, Any], spec: api.InferenceDeploymentSpec,
            plans: Mapping[str, KVPlan],
            pool_series: Mapping[str, SeriesSelector | None], window_seconds: float,
            access: PrometheusAccess, stored: mc.CalibrationSet) -> tuple[PoolLoop, ...]:
    """Each calibrated pool's window and findings (Prometheus read; nothing written)."""
    assert spec.tuning.prometheus is not None
    model = plan_stage.resolve_model(spec, body["metadata"]["namespace"], kube)
    policy = plan_stage.policy_for(spec)
    profile = declared_profile(spec.workload)  # the predictions read the plan, not this
    margin = drift_margin()
    # Only a pool whose rollout is done: during a canary the series mix two plans' pods.
    applied = {p.name for p in status_writer.read(body).pools if p.phase == "Applied"}
    out = []
    for pool in spec.pools:
        plan, series = plans.get(pool.pool_name), pool_series.get(pool.pool_name)
        if plan is None or series is None or pool.tp_auto or pool.pool_name not in applied:
            continue
        request = cp.with_calibration(
            plan_stage.plan_request(spec, pool, model, profile, policy), stored)
        window = calibration_series.read_window(
            spec.tuning.prometheus.url, series, window_seconds, access=access)
        obs = observation(request, plan, window)
        out.append(PoolLoop(pool.pool_name, cp.calibration_key(request), obs,
                            tuple(mc.drift(obs, margin))))
    return tuple(out)


def _fitted(pools: tuple[PoolLoop, ...], now: str
            ) -> Callable[[mc.CalibrationSet], mc.CalibrationSet | None]:
    """The store's update: each pool's key fitted on its window (one write for all)."""
    dead_band = drift_margin() / 2

    def mutate(current: mc.CalibrationSet) -> mc.CalibrationSet | None:
        entries = list(current.calibrations)
        for p in pools:
            before = mc.find(entries, p.key) or mc.ModelCalibration(key=p.key)
            after = mc.fit(before, p.observation, now=now, dead_band=dead_band)
            # Only a factor that moved is written (one held at its bound is not): a write
            # re-plans, and evidence alone must not.
            if _factors(after) != _factors(before):
                entries = mc.replace(entries, after)
        new = mc.CalibrationSet(calibrations=tuple(entries))
        return None if new == current else new
    return mutate


def _factors(cal: mc.ModelCalibration) -> tuple[float, float, float]:
    return cal.kv_tokens_scale, cal.prefill_efficiency, cal.decode_efficiency


def run(kube: kapply.Kube, body: Mapping[str, Any], spec: api.InferenceDeploymentSpec,
        plans: Mapping[str, KVPlan],
        pool_series: Mapping[str, SeriesSelector | None], window_seconds: float,
        now: str) -> LoopResult | None:
    """One tick of the loop for one InferenceDeployment; None when it could not look
    (Prometheus or the API server failed, the model is unknown: the next tick tries again)."""
    meta = body["metadata"]
    try:
        stored, _ = model_calibrations.read(kube)
        pools = observe(kube, body, spec, plans, pool_series, window_seconds,
                        profiling.access_from_env(), stored)
        written = model_calibrations.update(kube, _fitted(pools, now)) if pools else None
    except (PrometheusUnavailable, ApiException, KVTuneError, LookupError) as exc:
        LOG.warning("%s/%s: the model calibration loop skipped this tick: %s",
                    meta["namespace"], meta["name"], str(exc)[:200])
        return None
    for p in pools:
        for figure, ratio in mc.ratios(p.observation).items():
            CALIBRATION_RATIO.labels(meta["namespace"], meta["name"], p.pool, figure).set(ratio)
    _write_condition(kube, body, pools, now)
    return LoopResult(pools=pools, written=written)


def _write_condition(kube: kapply.Kube, body: Mapping[str, Any], pools: tuple[PoolLoop, ...],
                     now: str) -> None:
    status_, reason, message = condition(pools)
    meta = body["metadata"]

    def mutate(previous: api.InferenceDeploymentStatus, _obj: Mapping[str, Any]
               ) -> api.InferenceDeploymentStatus | None:
        conditions = cond.set_condition(previous.conditions, CALIBRATION_DRIFT, status_,
                                        reason, message,
                                        generation=previous.observed_generation, now=now)
        return previous.model_copy(update={"conditions": conditions})

    with object_lock(meta["namespace"], meta["name"]):
        status_writer.update(kube, meta["namespace"], meta["name"], mutate)
