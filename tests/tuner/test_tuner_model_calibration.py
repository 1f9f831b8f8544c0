"""The closed loop's fit (tuner/model_calibration.py) and the planner's use of it: bounds,
evidence, the multiplicative update, and convergence against a deliberately different "true"
engine (steps 1.3x slower, 15 % fewer KV blocks than kvtune predicts)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvtune.tuner import model_calibration as mc
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile

KEY = mc.CalibrationKey(model="meta-llama/Llama-3.1-8B-Instruct", gpu_class="H100",
                        vllm_version="0.33.0", layout="TP1")
TRUE_STEP = 1.3
TRUE_KV = 0.85


def _obs(**kw: object) -> mc.CalibrationObservation:
    base: dict[str, object] = dict(
        predicted_kv_blocks=1000, observed_kv_blocks=850, kv_reports=1,
        predicted_prefill_seconds=0.10, observed_prefill_seconds=0.13,
        prefill_requests=mc.MIN_PREFILL_REQUESTS,
        predicted_decode_seconds=0.020, observed_decode_seconds=0.026,
        decode_tokens=mc.MIN_DECODE_TOKENS)
    base.update(kw)
    return mc.CalibrationObservation.model_validate(base)


def test_fit_moves_each_factor_by_observed_over_predicted() -> None:
    cal = mc.fit(mc.ModelCalibration(key=KEY), _obs(), now="t1")
    assert cal.kv_tokens_scale == pytest.approx(0.85)
    assert cal.prefill_efficiency == pytest.approx(1 / 1.3)
    assert cal.decode_efficiency == pytest.approx(1 / 1.3)
    assert (cal.updates, cal.kv_reports, cal.updated_at) == (1, 1, "t1")
    assert cal.decode_time_scale == pytest.approx(1.3)


def test_fit_is_multiplicative_on_the_calibrated_prediction() -> None:
    # The prediction already carries the factor: observed == predicted leaves it where it is.
    start = mc.ModelCalibration(key=KEY, decode_efficiency=0.8, kv_tokens_scale=0.9)
    cal = mc.fit(start, _obs(observed_kv_blocks=1000, observed_decode_seconds=0.020,
                             prefill_requests=0))
    assert cal.decode_efficiency == pytest.approx(0.8)
    assert cal.kv_tokens_scale == pytest.approx(0.9)
    assert cal.prefill_efficiency == 1.0  # too few requests: untouched


@pytest.mark.parametrize(("field", "value"), [
    ("prefill_requests", mc.MIN_PREFILL_REQUESTS - 1),
    ("decode_tokens", mc.MIN_DECODE_TOKENS - 1),
    ("kv_reports", 0),
])
def test_too_little_evidence_leaves_the_factor_alone(field: str, value: int) -> None:
    cal = mc.fit(mc.ModelCalibration(key=KEY), _obs(**{field: value}))
    moved = {"prefill_requests": cal.prefill_efficiency, "decode_tokens": cal.decode_efficiency,
             "kv_reports": cal.kv_tokens_scale}[field]
    assert moved == 1.0
    assert cal.updates == 1  # the other two moved


def test_no_evidence_at_all_is_no_update() -> None:
    start = mc.ModelCalibration(key=KEY)
    assert mc.fit(start, mc.CalibrationObservation()) is start


def test_factors_are_bounded() -> None:
    cal = mc.fit(mc.ModelCalibration(key=KEY),
                 _obs(observed_decode_seconds=1.0, observed_kv_blocks=10_000))
    assert cal.decode_efficiency == mc.FACTOR_MIN
    assert cal.kv_tokens_scale == mc.FACTOR_MAX
    with pytest.raises(ValidationError, match="decode_efficiency"):
        mc.ModelCalibration(key=KEY, decode_efficiency=0.1)


def test_drift_names_the_figures_past_the_margin() -> None:
    found = mc.drift(_obs(observed_kv_blocks=950), margin=0.1)
    assert [f.figure for f in found] == ["prefill_seconds", "decode_seconds"]
    assert found[1].ratio == pytest.approx(1.3)
    assert found[1].message == "decode_seconds: observed 0.026, predicted 0.02 (1.30x)"
    assert mc.drift(_obs(decode_tokens=0, prefill_requests=0, observed_kv_blocks=950)) == []


def test_the_set_reads_from_a_configmap_or_itself() -> None:
    one = mc.CalibrationSet(calibrations=(mc.ModelCalibration(key=KEY),))
    cm = {"kind": "ConfigMap", "data": {mc.CONFIG_MAP_KEY: one.model_dump_json()}}
    assert mc.set_from_document(cm) == one
    assert mc.set_from_document(one.model_dump(mode="json")) == one
    with pytest.raises(ValueError, match=mc.CONFIG_MAP_KEY):
        mc.set_from_document({"data": {"other": "{}"}})


# --- the planner, against a "true" engine --------------------------------------------------


def _request(cal: mc.ModelCalibration | None) -> PlanRequest:
    return PlanRequest(model=get_model(KEY.model), gpu=get_gpu_class("H100"),
                       profile=preset_profile("chat"),
                       policy=PlanPolicy(slo=SLO(tpot_p95_seconds=0.03)), calibration=cal)


def _truth(plan: PoolPlan) -> tuple[int, float]:
    """What the "true" engine shows running ``plan``: 85 % of the blocks kvtune's own memory
    model gives that plan, and decode steps 1.3x its step model (both uncalibrated)."""
    raw = plan_pool(_request(None).model_copy(update={"policy": PlanPolicy(
        pins=plan.plan.model_dump(include={"max_num_seqs", "block_size", "kv_cache_dtype",
                                           "max_model_len", "max_num_batched_tokens"}))}))
    return (int(raw.expected.num_gpu_blocks * TRUE_KV),
            raw.expected.decode_step_seconds * TRUE_STEP)


def test_the_plan_converges_on_the_true_engine_within_three_ticks() -> None:
    cal = mc.ModelCalibration(key=KEY)
    history = []
    for _tick in range(3):
        plan = plan_pool(_request(cal))
        blocks, step = _truth(plan)
        obs = mc.CalibrationObservation(
            predicted_kv_blocks=plan.expected.num_gpu_blocks, observed_kv_blocks=blocks,
            kv_reports=1, predicted_decode_seconds=plan.expected.decode_step_seconds,
            observed_decode_seconds=step, decode_tokens=mc.MIN_DECODE_TOKENS)
        history.append(len(mc.drift(obs)))
        cal = mc.fit(cal, obs)
    assert history[0] == 2  # both figures part by more than 10 % before the loop
    assert history[-1] == 0
    assert cal.decode_efficiency == pytest.approx(1 / TRUE_STEP, rel=0.02)
    assert cal.kv_tokens_scale == pytest.approx(TRUE_KV, rel=0.02)
    # The calibrated plan runs fewer sequences: each step is slower under the same TPOT SLO.
    assert plan_pool(_request(cal)).plan.max_num_seqs < plan_pool(_request(None)).plan.max_num_seqs


def test_a_dead_band_leaves_a_figure_near_its_prediction_alone() -> None:
    start = mc.ModelCalibration(key=KEY)
    near = _obs(observed_kv_blocks=1040, observed_prefill_seconds=0.104,
                observed_decode_seconds=0.0208)
    assert mc.fit(start, near, dead_band=0.05) is start
    assert mc.fit(start, near).kv_tokens_scale == pytest.approx(1.04)
