"""The simulator as the planner's scorer, and `kvtune simulate` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.simulator.compare import configurations, parse_overrides
from kvtune.tuner.simulator.engine import simulated_plan, vllm_default_plan
from kvtune.tuner.simulator.scoring import SimulatorScorer


def _request() -> PlanRequest:
    return PlanRequest(
        model=get_model("meta-llama/Llama-3.1-8B-Instruct"), gpu=get_gpu_class("H100"),
        profile=preset_profile("chat"),
        policy=PlanPolicy(slo=SLO(ttft_p95_seconds=2.0, tpot_p95_seconds=0.08)),
    )


@pytest.mark.slow
def test_plan_pool_with_the_simulator_scorer_records_what_each_candidate_scored() -> None:
    request = _request()
    scorer = SimulatorScorer(num_requests=300, seed=1, request_rate_per_second=4.0)
    pool = plan_pool(request, scorer=scorer)
    block = next(r for r in pool.reasons if r.knob == "block-size")
    assert len(block.candidates) > 1
    assert all("simulated" in c.detail for c in block.candidates)
    assert pool.expected.prefix_hit_rate is not None
    # Deterministic: the same seed scores the same.
    again = plan_pool(request, scorer=SimulatorScorer(num_requests=300, seed=1,
                                                       request_rate_per_second=4.0))
    assert again.plan == pool.plan


def test_scores_follow_the_candidates_order_and_see_the_slo_effect_of_batch_limits() -> None:
    request = _request()
    base = vllm_default_plan(request).model_copy(update={"max_model_len": 16384})
    small = base.model_copy(update={"max_num_seqs": 2})
    scores = SimulatorScorer(num_requests=200, seed=0, request_rate_per_second=4.0)(
        request, [base, small])
    assert [s.plan for s in scores] == [base, small]
    assert scores[1].peak_concurrent_sequences <= 2
    assert scores[1].ttft_p95_seconds > scores[0].ttft_p95_seconds


def test_default_plan_is_vllm_033s() -> None:
    plan = vllm_default_plan(_request())
    assert (plan.block_size, plan.kv_cache_dtype, plan.gpu_memory_utilization) == (16, "auto", 0.92)
    assert (plan.max_num_seqs, plan.max_num_batched_tokens) == (1024, 8192)  # 80 GB class
    assert plan.max_model_len == 131072 and plan.enable_prefix_caching


def test_configurations_share_memory_and_differ_in_one_knob() -> None:
    request = _request()
    c = {s.name: s for s in configurations(request, ["defaults", "contiguous", "no-prefix-cache",
                                                      "custom"], {"block_size": 32})}
    assert c["contiguous"].engine.allocation == "contiguous"
    assert not c["no-prefix-cache"].engine.enable_prefix_caching
    assert c["custom"].engine.block_size == 32
    # contiguous and no-prefix-cache are the defaults plan otherwise (planned not asked).
    assert c["contiguous"].engine.num_gpu_blocks == c["defaults"].engine.num_gpu_blocks
    with pytest.raises(InvalidInput, match="--compare"):
        configurations(request, ["fastest"])


def test_parse_overrides_types_and_errors() -> None:
    assert parse_overrides(["block-size=32", "enable_prefix_caching=off"]) == {
        "block_size": 32, "enable_prefix_caching": False}
    with pytest.raises(InvalidInput, match="block_size takes a int"):
        parse_overrides(["block_size=big"])
    with pytest.raises(InvalidInput, match="expected K=V"):
        parse_overrides(["swap_space=4"])


def test_a_plan_that_does_not_fit_is_reported_not_simulated() -> None:
    request = _request()
    plan = vllm_default_plan(request).model_copy(update={"gpu_memory_utilization": 0.3})
    sim = simulated_plan(request, plan, "tight")
    assert not sim.starts and "max-model-len" in sim.start_error


@pytest.mark.slow
def test_cli_json_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "sim.png"
    result = CliRunner().invoke(cli, [
        "simulate", "--trace", str(AZURE), "--model", "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu", "H100", "--limit", "400", "--speed", "4", "--no-search",
        "--compare", "defaults,planned,contiguous,no-prefix-cache",
        "--config", "block_size=64", "-o", "json", "--plot", str(out),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    names = [c["name"] for c in doc["configurations"]]
    assert names == ["defaults", "planned", "contiguous", "no-prefix-cache", "custom"]
    for c in doc["configurations"]:
        for key in ("peak_concurrent_sequences", "throughput_requests_per_second",
                    "ttft_p95_seconds", "tpot_p95_seconds", "prefix_hit_rate", "preemptions"):
            assert key in c, (c["name"], key)
    assert out.stat().st_size > 10_000


def test_cli_table_and_bad_input() -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, [
        "simulate", "--trace", str(AZURE), "--model", "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu", "H100", "--limit", "200", "--compare", "defaults", "--score-sample", "0"])
    assert ok.exit_code == 0, ok.output
    assert "TTFT p95" in ok.output and "defaults" in ok.output
    bad = runner.invoke(cli, [
        "simulate", "--trace", str(AZURE), "--model", "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu", "H100", "--config", "nonsense=1"])
    assert bad.exit_code != 0 and "expected K=V" in bad.output
    # --score-sample N sized the former scorer: now one line saying what replaced it.
    old = runner.invoke(cli, [
        "simulate", "--trace", str(AZURE), "--model", "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu", "H100", "--score-sample", "150"])
    assert old.exit_code == 2 and "--no-search" in old.output and "Traceback" not in old.output


def test_step_costs_follow_the_model_gpu_and_tensor_parallel() -> None:
    base = _request()
    c1 = simulated_plan(base, vllm_default_plan(base), "tp1").cost
    tp2 = base.model_copy(update={"tensor_parallel": 2})
    c2 = simulated_plan(tp2, vllm_default_plan(tp2), "tp2").cost
    assert c2.weights_bytes == pytest.approx(c1.weights_bytes / 2, rel=1e-6)
    assert c2.kv_bytes_per_token == c1.kv_bytes_per_token // 2  # 8 KV heads over 2 GPUs
    # The all-reduces are GPU time on the critical path, not per-step overhead.
    assert c2.efficiency.step_overhead_seconds == c1.efficiency.step_overhead_seconds
    assert c1.kernels is not None and c1.kernels.all_reduces_per_step == 0
    assert c2.kernels is not None and c2.kernels.all_reduces_per_step == 2 * 32
    mla = PlanRequest(model=get_model("deepseek-ai/DeepSeek-V2-Lite"), gpu=get_gpu_class("H200"),
                      profile=preset_profile("chat"))
    plan = vllm_default_plan(mla)
    assert plan.block_size == 64
    cost = simulated_plan(mla, plan, "mla").cost
    assert cost.attention_flops_per_token_pair > 0 and cost.kv_bytes_per_token > 0
    # Halving the KV dtype width doubles the blocks of the same memory.
    fp8 = simulated_plan(base, vllm_default_plan(base).model_copy(
        update={"kv_cache_dtype": "fp8"}), "fp8")
    auto = simulated_plan(base, vllm_default_plan(base), "auto")
    assert fp8.engine.num_gpu_blocks == pytest.approx(2 * auto.engine.num_gpu_blocks, rel=0.01)


def test_simulated_kv_cache_is_the_planned_one() -> None:
    request = _request()
    pool = plan_pool(request)
    sim = simulated_plan(request, pool.plan, "planned")
    assert sim.starts
    assert sim.engine.num_gpu_blocks == pool.expected.num_gpu_blocks
    assert sim.cost.kv_bytes_per_token == pool.expected.kv_bytes_per_token
    assert sim.cost.weights_bytes == pool.expected.weights_bytes_per_gpu
