"""The goodput search takes its KV dtypes through the KV-quality gate (issue 15): what the
gate rules out is never searched, and a dtype it chose carries the evidence in its reason."""

from __future__ import annotations

import pytest
from test_sim_goodput_search import QUICK, _request

from kvtune.tuner.kv_quality import KVDtypeMeasurement, KVQualityEvidence, KVQualityPolicy
from kvtune.tuner.simulator.goodput_search import plan_by_goodput

HEAVY = ("meta-llama/Llama-3.1-8B-Instruct", "H100", "rag", 12.0, 2.0, 0.05)


def _gated(policy: KVQualityPolicy, evidence: KVQualityEvidence | None = None) -> object:
    request = _request(*HEAVY)
    request = request.model_copy(update={
        "policy": request.policy.model_copy(update={"kv_quality": policy}),
        "kv_quality_evidence": evidence})
    return plan_by_goodput(request, settings=QUICK)


@pytest.mark.slow
def test_require_measurement_keeps_the_search_on_16_bit() -> None:
    free = plan_by_goodput(_request(*HEAVY), settings=QUICK)
    assert free.plan.kv_cache_dtype != "auto"  # the load wants a narrower KV cache
    held = _gated(KVQualityPolicy(require_measurement=True))
    assert held.plan.kv_cache_dtype == "auto"  # type: ignore[attr-defined]
    searched = held.search  # type: ignore[attr-defined]
    assert searched is not None
    assert not any("--kv-cache-dtype=fp8" in a.vllm_args for a in searched.alternatives)


def test_a_measured_dtype_is_quoted() -> None:
    evidence = KVQualityEvidence(source="test report", measurements=(
        KVDtypeMeasurement(dtype="fp8", kl_mean=0.002, top1_agreement=0.99),))
    pool = _gated(KVQualityPolicy(), evidence)
    reason = next(r for r in pool.reasons if r.knob == "kv-cache-dtype")  # type: ignore[attr-defined]
    assert pool.plan.kv_cache_dtype == "fp8"  # type: ignore[attr-defined]
    assert "quality: measured KL 2.00e-03 nats" in reason.message
