"""The KV-quality gate: measured dtypes within / beyond the KL limit, unverified ones, and
requireMeasurement."""

from __future__ import annotations

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.kv_quality import (
    EXCEEDS_KL,
    UNVERIFIED,
    UNVERIFIED_REQUIRED,
    KVDtypeMeasurement,
    KVQualityEvidence,
    KVQualityPolicy,
    allowed_dtypes,
    evidence_from_report,
    gate,
)
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import PlanPolicy
from kvtune.tuner.planner.presets import fixed_session_profile

EVIDENCE = KVQualityEvidence(source="calibration Job, revision abc", measurements=(
    KVDtypeMeasurement(dtype="fp8", kl_mean=0.0004, top1_agreement=0.991,
                       attention_error_max=0.03, attention_error_worst_layer=2),
    KVDtypeMeasurement(dtype="int4_per_token_head", kl_mean=0.052, top1_agreement=0.93,
                       attention_error_max=0.31, attention_error_worst_layer=0),
))
DTYPES = ["auto", "fp8", "fp8_e4m3", "int8_per_token_head", "int4_per_token_head"]


def test_measured_dtypes_within_and_beyond_the_limit() -> None:
    verdicts = gate(DTYPES, EVIDENCE, KVQualityPolicy())
    assert verdicts["fp8"].allowed and "measured KL 4.00e-04 nats" in verdicts["fp8"].detail
    assert "top-1 agreement 99.1%" in verdicts["fp8"].detail
    assert verdicts["fp8_e4m3"].allowed  # the same layout as fp8: its measurement counts
    assert not verdicts["int4_per_token_head"].allowed
    assert verdicts["int4_per_token_head"].code == EXCEEDS_KL
    assert "exceeds quality.maxKVQuantizationKL 0.01" in verdicts["int4_per_token_head"].detail
    assert verdicts["int8_per_token_head"].code == UNVERIFIED
    assert allowed_dtypes(DTYPES, EVIDENCE, KVQualityPolicy()) == [
        "auto", "fp8", "fp8_e4m3", "int8_per_token_head"]


def test_per_tensor_verdicts_say_which_scales_were_measured() -> None:
    uncalibrated = EVIDENCE.model_copy(update={"checkpoint_kv_scales": False})
    detail = gate(["fp8", "int4_per_token_head"], uncalibrated, KVQualityPolicy())
    assert "at k_scale = v_scale = 1.0 (no calibrated KV scales" in detail["fp8"].detail
    assert "k_scale" not in detail["int4_per_token_head"].detail  # dynamic scales
    calibrated = EVIDENCE.model_copy(update={"checkpoint_kv_scales": True})
    assert "with the checkpoint's calibrated k/v scales" in gate(
        ["fp8"], calibrated, KVQualityPolicy())["fp8"].detail


def test_a_looser_limit_lets_int4_through() -> None:
    assert "int4_per_token_head" in allowed_dtypes(
        DTYPES, EVIDENCE, KVQualityPolicy(max_kv_quantization_kl=0.1))


@pytest.mark.parametrize("evidence", [None, EVIDENCE.model_copy(update={
    "random_weights": True})])
def test_require_measurement_keeps_16_bit(evidence: KVQualityEvidence | None) -> None:
    policy = KVQualityPolicy(require_measurement=True)
    assert allowed_dtypes(DTYPES, evidence, policy) == ["auto"]
    verdict = gate(["fp8"], evidence, policy)["fp8"]
    assert verdict.code == UNVERIFIED_REQUIRED and "unverified" in verdict.detail
    # Without the requirement the same dtypes are allowed, marked unverified.
    assert all(g.code == UNVERIFIED for g in gate(["fp8", "int4_per_token_head"], evidence,
                                                   KVQualityPolicy()).values())


def test_evidence_from_a_report() -> None:
    report = {"weights": "checkpoint", "checkpoint": {"layers": 32, "layers_with_scales": 32},
              "measurements": [{"dtype": "fp8", "kl_mean": 1e-4, "top1_agreement": 0.995,
                                "attention_error_max": 0.02,
                                "attention_error_worst_layer": 7}]}
    evidence = evidence_from_report(report, source="x")
    assert evidence.checkpoint_kv_scales is True and not evidence.random_weights
    found = evidence.find("fp8_e4m3")
    assert found is not None and found.attention_error_worst_layer == 7


# --- the gate inside the planner ---------------------------------------------------------------

def _plan(evidence: KVQualityEvidence | None, **quality: object) -> tuple[str, object]:
    request = PlanRequest(
        model=get_model("meta-llama/Llama-3.3-70B-Instruct"), gpu=get_gpu_class("H200"),
        weights_dtype="fp8", profile=fixed_session_profile(4096),
        policy=PlanPolicy(lowest_kv_precision="int4",
                          kv_quality=KVQualityPolicy(**quality)),  # type: ignore[arg-type]
        kv_quality_evidence=evidence)
    pool = plan_pool(request)
    reason = next(r for r in pool.reasons if r.knob == "kv-cache-dtype")
    return pool.plan.kv_cache_dtype, (reason, pool.warnings)


def test_the_article_plan_says_fp8_is_unverified_without_a_measurement() -> None:
    dtype, (reason, warnings) = _plan(None)
    assert dtype == "fp8"
    assert "quality: unverified: no KV-quality measurement" in reason.message
    assert any("kv-cache-dtype fp8 is unverified" in w for w in warnings)


def test_measured_fp8_within_the_limit_is_chosen_and_quoted() -> None:
    dtype, (reason, warnings) = _plan(EVIDENCE)
    assert dtype == "fp8"
    assert "quality: measured KL 4.00e-04 nats" in reason.message
    assert not any("unverified" in w for w in warnings)


def test_fp8_beyond_the_limit_falls_to_the_next_dtype_with_the_figure() -> None:
    bad_fp8 = EVIDENCE.model_copy(update={"measurements": (
        KVDtypeMeasurement(dtype="fp8", kl_mean=0.08, top1_agreement=0.9),
        KVDtypeMeasurement(dtype="fp8_per_token_head", kl_mean=0.002, top1_agreement=0.99),
    )})
    dtype, (reason, _) = _plan(bad_fp8)
    assert dtype == "fp8_per_token_head"
    fp8 = next(c for c in reason.candidates if c.value == "fp8")
    assert fp8.check == EXCEEDS_KL and "measured KL 8.00e-02" in fp8.detail
    assert "fp8 ruled out: measured KL 8.00e-02 nats" in reason.message


def test_require_measurement_keeps_16_bit_until_one_exists() -> None:
    dtype, (reason, _) = _plan(None, require_measurement=True)
    assert dtype == "auto"
    ruled_out = {c.value: c.check for c in reason.candidates if not c.ok}
    assert ruled_out["fp8"] == UNVERIFIED_REQUIRED
    assert ruled_out["int4_per_token_head"] == UNVERIFIED_REQUIRED
    assert "quality.requireMeasurement keeps it out" in reason.message


SCHEME = "compressed-tensors float8 tensor"


def test_a_declared_kv_scheme_is_quoted_as_checkpoint_evidence_not_as_a_measurement() -> None:
    from kvtune.tuner.kv_quality import gate_one

    fp8 = gate_one("fp8", None, KVQualityPolicy(), checkpoint_scheme=SCHEME)
    assert fp8.code == UNVERIFIED and fp8.allowed
    assert fp8.detail.startswith("unverified: by measurement (no KV-quality measurement")
    assert f"the checkpoint carries calibrated KV scales (its config declares the KV scheme " \
           f"{SCHEME}; vLLM uses them instead of 1.0)" in fp8.detail
    # It allows nothing a measurement would not: requireMeasurement still keeps fp8 out.
    held = gate_one("fp8", None, KVQualityPolicy(require_measurement=True),
                    checkpoint_scheme=SCHEME)
    assert not held.allowed and held.code == UNVERIFIED_REQUIRED
    assert "calibrated KV scales" in held.detail
    # A measurement quotes the scales it ran at.
    measured = gate_one("fp8", EVIDENCE, KVQualityPolicy(), checkpoint_scheme=SCHEME)
    assert "vs 16-bit KV with the checkpoint's calibrated k/v scales (its config declares" \
        in measured.detail
    # A report that counted the tensors wins over the declaration.
    counted = EVIDENCE.model_copy(update={"checkpoint_kv_scales": False})
    short = gate_one("fp8", counted, KVQualityPolicy(), checkpoint_scheme=SCHEME)
    assert "at k_scale = v_scale = 1.0" in short.detail and SCHEME not in short.detail
    # Per-token-head dtypes compute their own scales: the note does not apply.
    int8 = gate_one("int8_per_token_head", None, KVQualityPolicy(), checkpoint_scheme=SCHEME)
    assert int8.detail == "unverified: no KV-quality measurement for this model revision"
