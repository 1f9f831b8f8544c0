"""The closed loop end to end without a cluster: the replay exporter plays a deliberately
different "true" engine (steps 1.3x the simulator's, 15 % fewer KV blocks than kvtune's
memory model gives) through a real Prometheus; each tick reads the window as the operator
does (operator/prometheus/calibration_series.py), puts the planner's predictions beside it
(operator/retune/calibration_loop.observation), fits the model calibration and re-plans, and
the replay runs the new plan. The plan converges: within a few ticks prediction and
observation agree within the margin and CalibrationDrift clears.

    .venv/bin/python -m pytest tests/operator/retune/test_op_calibration_loop.py -s -q

prints each tick's figures (docs/calibration-loop.md quotes them)."""

from __future__ import annotations

import time

import pytest

from kvtune.e2e.prometheus import PrometheusServer
from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.operator.api import PrometheusSpec
from kvtune.operator.prometheus import calibration_series, profiling, selectors
from kvtune.operator.retune import calibration_loop
from kvtune.replay.exporter import Replay, ReplayServer, changes_from_vllm_args
from kvtune.replay.instance import InstanceConfig
from kvtune.replay.sim import Hardware
from kvtune.tuner import model_calibration as mc
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.calibration_predict import calibration_key
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile

NS, NAME, POOL = "loop", "cal", "h100"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TRUE_STEP, TRUE_KV = 1.3, 0.85
WINDOW_SECONDS = 20
MARGIN = mc.DEFAULT_DRIFT_MARGIN
TICKS = 4


def _request(cal: mc.ModelCalibration | None) -> PlanRequest:
    return PlanRequest(model=get_model(MODEL), gpu=get_gpu_class("H100"),
                       profile=preset_profile("chat"),
                       policy=PlanPolicy(slo=SLO(tpot_p95_seconds=0.05)), calibration=cal)


def _window(prometheus: PrometheusServer, since: float) -> calibration_series.CalibrationWindow:
    """One full window of the running plan's series (none of the plan before it)."""
    series = selectors.pool_selector(PrometheusSpec(url=prometheus.url, pool_selector="labels"),
                                     namespace=NS, deployment=NAME, pool=POOL)
    assert series is not None
    time.sleep(max(0.0, since + WINDOW_SECONDS + 2 - time.time()))
    return calibration_series.read_window(prometheus.url, series, WINDOW_SECONDS,
                                          access=profiling.access_from_env())


def _run(replay: Replay, plan: PoolPlan) -> float:
    replay.reconfigure(changes_from_vllm_args(list(plan.plan.vllm_args())))
    return time.time()


@pytest.mark.prometheus
def test_the_plan_converges_on_a_true_engine_that_differs(
        prometheus: PrometheusServer) -> None:
    hw = Hardware(model=MODEL, gpu="H100", step_time_scale=TRUE_STEP, kv_blocks_scale=TRUE_KV)
    replay = Replay(InstanceConfig(model_name=MODEL), AZURE, speed=5.0, shuffle_seed=3,
                    engine="simulator", hardware=hw)
    server = ReplayServer(replay, port=0)
    server.start()
    try:
        prometheus.set_target_groups([([server.target], {
            "namespace": NS, "pod": f"{NAME}-{POOL}-6f7d9c8b5-x2x7q",
            "kvtune_io_deployment": NAME, "kvtune_io_pool": POOL})])
        cal = mc.ModelCalibration(key=calibration_key(_request(None)))
        plan = plan_pool(_request(None))
        since = _run(replay, plan)
        drifts: list[list[str]] = []
        for tick in range(TICKS):
            window = _window(prometheus, since)
            obs = calibration_loop.observation(_request(cal), plan.plan, window)
            found = mc.drift(obs, MARGIN)
            drifts.append([f.figure for f in found])
            print(f"tick {tick}: max-num-seqs {plan.plan.max_num_seqs}, "
                  f"observed/predicted {mc.ratios(obs)}, drift {drifts[-1]}; "
                  f"kv scale {cal.kv_tokens_scale:.3f}, decode eff "
                  f"{cal.decode_efficiency:.3f}, prefill eff {cal.prefill_efficiency:.3f}")
            if tick > 0 and not found:
                break
            cal = mc.fit(cal, obs, dead_band=MARGIN / 2)
            new = plan_pool(_request(cal))
            if new.plan != plan.plan:
                plan, since = new, _run(replay, new)
            else:
                plan, since = new, time.time() - WINDOW_SECONDS  # the same plan keeps running
    finally:
        server.stop()
    # Before the loop kvtune's memory model is 15 % off and its decode step far from the
    # true engine's: CalibrationDrift.
    assert "kv_blocks" in drifts[0] and "decode_seconds" in drifts[0]
    # Then prediction and observation agree within the margin: the condition clears.
    assert drifts[-1] == [] and len(drifts) <= TICKS
    assert cal.kv_tokens_scale == pytest.approx(TRUE_KV, rel=0.03)
    assert cal.decode_efficiency < 1 / TRUE_STEP  # at least the engine's own slowdown
