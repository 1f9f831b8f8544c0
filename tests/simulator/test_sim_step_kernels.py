"""The step-time model on measured kernels (``tuner/facts/data/step_kernels.json``).

``aiconfigurator_points.json`` holds reference TTFT/TPOT of static points: NVIDIA's measured
vLLM kernels (aiconfigurator-core 0.12.0, Apache-2.0) summed per step at each model's exact
shapes by ``bench/step_model_vs_aiconfigurator.py --write``; kvtune must agree within 10 %.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.step_kernels import (
    FALLBACK_ALL_REDUCE_SECONDS,
    all_reduce_table,
    gpu_kernels,
    interp_pow2,
    source,
)
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.simulator.engine import step_cost_for
from kvtune.tuner.simulator.timing import StepCostModel

POINTS = json.loads((Path(__file__).parent / "aiconfigurator_points.json").read_text())
L8B = "meta-llama/Llama-3.1-8B-Instruct"


def _cost(model: str, gpu: str, tp: int = 1, weights: str = "auto") -> StepCostModel:
    return step_cost_for(PlanRequest(model=get_model(model), gpu=get_gpu_class(gpu),
                                     profile=preset_profile("chat"), tensor_parallel=tp,
                                     weights_dtype=weights), "auto")


def _label(p: dict[str, Any]) -> str:
    return f"{p['model'].split('/')[1]}-{p['weights']}-{p['gpu']}-TP{p['tp']}-b{p['batch']}-" \
        f"in{p['isl']}"


@pytest.mark.parametrize("point", POINTS["points"], ids=_label)
def test_ttft_and_tpot_agree_with_the_measured_database(point: dict[str, Any]) -> None:
    cost = _cost(point["model"], point["gpu"], point["tp"], point["weights"])
    overhead = cost.efficiency.step_overhead_seconds
    b, isl, osl = point["batch"], point["isl"], point["osl"]
    ttft = cost.step_seconds(b * isl, b * isl, b * isl * (isl + 1) / 2.0, num_seqs=b) - overhead
    tpot = cost.decode_run_seconds(b, b * (isl + 1), osl) / osl - overhead
    assert ttft / point["ttft_seconds"] == pytest.approx(1.0, abs=0.10)
    assert tpot / point["tpot_seconds"] == pytest.approx(1.0, abs=0.10)


def test_the_reference_points_name_their_source_and_cover_the_classes() -> None:
    assert "aiconfigurator-core 0.12.0" in POINTS["source"] and "Apache-2.0" in POINTS["source"]
    assert {p["gpu"] for p in POINTS["points"]} >= {"H100", "H200", "B200", "A100-80GB", "L40S"}
    assert {p["tp"] for p in POINTS["points"]} == {1, 2, 4}
    assert "aiconfigurator-core 0.12.0" in source() and "Apache-2.0" in source()


def test_tensor_parallel_all_reduces_are_on_the_critical_path() -> None:
    # Two all-reduces per layer of tokens x hidden x 2 bytes: the TP2 step is the TP1
    # step's sharded work plus them, and async scheduling does not hide them.
    cost = _cost(L8B, "H200", tp=2)
    k = cost.kernels
    assert k is not None and k.all_reduces_per_step == 64
    tokens = 4096
    one = interp_pow2(all_reduce_table("H200", 2), tokens * 4096 * 2, 7)
    assert one == pytest.approx(0.000280, rel=0.05)  # 32 MiB on two H200s, measured
    without = StepCostModel(**{f: getattr(cost, f) for f in (
        "weights_bytes", "kv_bytes_per_token", "hbm_bytes_per_second",
        "matrix_flops_per_second", "flops_per_token", "attention_flops_per_token_pair",
        "efficiency")}, kernels=_no_comm(k))
    args = (tokens, tokens, tokens * (tokens + 1) / 2.0)
    diff = cost.step_seconds(*args, overlapped=True, num_seqs=1) - without.step_seconds(
        *args, overlapped=True, num_seqs=1)
    assert diff == pytest.approx(64 * one)


def _no_comm(k: Any) -> Any:
    import dataclasses

    return dataclasses.replace(k, all_reduces_per_step=0)


def test_a_class_without_measured_kernels_falls_back_to_the_roofline() -> None:
    assert gpu_kernels("L4") is None and gpu_kernels("H200") is not None
    assert set(all_reduce_table("L4", 2)) == {FALLBACK_ALL_REDUCE_SECONDS}
    cost = _cost(L8B, "L4")
    assert cost.kernels is not None and cost.kernels.attention_fixed_seconds == 0.0
    # Decode of one sequence reads the weights at efficiency.json's fraction of 300 GB/s:
    # all but the input embedding table (a lookup, not a GEMM).
    gpu = cost.step_seconds(1, 1, 1.0, num_seqs=1) - cost.efficiency.step_overhead_seconds
    read = cost.weights_bytes - 128_256 * 4096 * 2
    assert gpu == pytest.approx(read / (300e9 * 0.75), rel=0.01)


def test_interp_pow2_is_linear_between_points_and_proportional_beyond() -> None:
    table = (1.0, 2.0, 6.0)  # at 1, 2, 4
    assert interp_pow2(table, 1) == 1.0 and interp_pow2(table, 0.5) == 1.0
    assert interp_pow2(table, 3) == 4.0
    assert interp_pow2(table, 8) == 12.0
    assert interp_pow2(table, 8, proportional_beyond=False) == 6.0
    assert interp_pow2(table, 2**9, first_exponent=7) == 6.0


def test_prefill_is_compute_bound_and_grows_with_the_chunk() -> None:
    cost = _cost(L8B, "H100")
    t = [cost.step_seconds(n, n, n * (n + 1) / 2.0, num_seqs=1) for n in (512, 2048, 8192)]
    assert t[0] < t[1] < t[2]
    # Past the weights-read regime, 4x the tokens costs about 4x (within the measured rates).
    assert 3.5 < (t[2] - 0.004) / (t[1] - 0.004) < 5.0


KERNEL_COST = _cost(L8B, "H200", tp=2)


@pytest.mark.parametrize("overlapped", [False, True], ids=["sync", "async"])
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 512), st.integers(1, 2_000_000), st.integers(0, 200))
def test_decode_run_closed_form_equals_the_sum_of_its_steps_on_measured_kernels(
    overlapped: bool, num_seqs: int, context_tokens: int, k: int
) -> None:
    context_tokens = max(context_tokens, num_seqs)
    steps = sum(KERNEL_COST.step_seconds(num_seqs, context_tokens + j * num_seqs,
                                         float(context_tokens + j * num_seqs), overlapped,
                                         num_seqs)
                for j in range(k))
    assert math.isclose(KERNEL_COST.decode_run_seconds(num_seqs, context_tokens, k, overlapped),
                        steps, rel_tol=1e-9, abs_tol=1e-12)
