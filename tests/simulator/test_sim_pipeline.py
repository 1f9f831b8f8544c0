"""Pipeline parallel in the simulator (``sched_pipeline.py``, ``pipeline_costs.py``): the
micro-batches' latency and throughput, the KV capacity and stage costs of a planned PP engine,
and the capacity search with ``--pp``. vLLM's own scheduler agrees micro-batch by micro-batch:
tests/oracle/test_oracle_pipeline.py."""

from __future__ import annotations

import math

import pytest
from simhelpers import request

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner import decode
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.search import SearchSettings
from kvtune.tuner.simulator.engine import simulated_plan, step_cost_for
from kvtune.tuner.simulator.goodput_search import plan_by_goodput
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.sched_pipeline import PipelineScheduler
from kvtune.tuner.simulator.scheduler import EngineConfig, Scheduler, simulate
from kvtune.tuner.simulator.timing import Efficiency, StepCostModel
from kvtune.tuner.simulator.workload import SimRequest

STAGE = 0.01  # seconds of one stage's step, whatever it runs
L70 = get_model("meta-llama/Llama-3.3-70B-Instruct")
H100 = get_gpu_class("H100")


def _weights_bound(seconds: float) -> StepCostModel:
    """Every step reads weights for exactly ``seconds`` (no KV, no FLOPs, no overhead)."""
    return StepCostModel(
        weights_bytes=int(seconds * 1e6), kv_bytes_per_token=0, hbm_bytes_per_second=1e6,
        matrix_flops_per_second=1.0, flops_per_token=0.0, attention_flops_per_token_pair=0.0,
        efficiency=Efficiency(1.0, 1.0, 0.0))


def _config(pp: int, send: float = 0.0) -> EngineConfig:
    return EngineConfig(num_gpu_blocks=1000, block_size=16, max_num_seqs=64,
                        max_num_batched_tokens=2048, max_model_len=4096,
                        async_scheduling=True, pipeline_parallel=pp,
                        pipeline_send_seconds_per_token=send)


def _tpot(res: SimResult, i: int) -> float:
    return (res.finish_seconds[i] - res.first_token_seconds[i]) / (res.output_tokens[i] - 1)


def test_a_lone_request_waits_for_every_stage_and_send() -> None:
    send = 0.001
    reqs = [request(0, 0.0, 10, 5)]
    pp2 = simulate(reqs, _config(2, send), _weights_bound(STAGE))
    pp1 = simulate(reqs, _config(1), _weights_bound(STAGE))
    # The prompt's 10 tokens cross both stages and one send; each later token too, alone.
    assert math.isclose(pp2.first_token_seconds[0], 2 * STAGE + 10 * send)
    assert math.isclose(_tpot(pp2, 0), 2 * STAGE + send)
    assert math.isclose(pp1.first_token_seconds[0], STAGE)
    assert math.isclose(_tpot(pp1, 0), STAGE)


def _two_staggered(output_tokens: int) -> list[SimRequest]:
    # The second arrives after the first micro-batch is scheduled: it rides in the other.
    return [request(0, 0.0, 10, output_tokens), request(1, 0.001, 10, output_tokens)]


def test_two_micro_batches_fill_the_pipeline() -> None:
    """One micro-batch per stage time: two requests in the two micro-batches decode at a lone
    request's TPOT (2 stages), so the engine makes twice its tokens per second; that is what
    a PP 1 engine whose step reads both stages' weights makes (sends free)."""
    reqs = _two_staggered(60)
    pp2 = simulate(reqs, _config(2), _weights_bound(STAGE))
    assert all(math.isclose(_tpot(pp2, i), 2 * STAGE, rel_tol=0.05) for i in (0, 1))
    # Stage 0 never idles once both run: the steady tokens come one per stage time.
    span = pp2.finish_seconds[1] - pp2.first_token_seconds[1]
    assert math.isclose(span / (2 * 59), STAGE, rel_tol=0.05)
    whole = simulate(reqs, _config(1), _weights_bound(2 * STAGE))
    assert all(math.isclose(_tpot(pp2, i), _tpot(whole, i), rel_tol=0.05) for i in (0, 1))
    # At the same per-stage weights PP 1 runs both in one step of one stage: half the TPOT.
    same_stage = simulate(reqs, _config(1), _weights_bound(STAGE))
    assert all(_tpot(pp2, i) > 1.9 * _tpot(same_stage, i) for i in (0, 1))


def test_sends_add_to_every_token_of_a_pp_engine() -> None:
    # (Long outputs: the prompts' sends delay the first tokens' cycles once.)
    reqs = _two_staggered(200)
    free = simulate(reqs, _config(2), _weights_bound(STAGE))
    sent = simulate(reqs, _config(2, send=0.002), _weights_bound(STAGE))
    for i in (0, 1):
        assert math.isclose(_tpot(sent, i), _tpot(free, i) + 0.002, rel_tol=0.02)


def test_a_burst_admitted_together_rides_in_one_micro_batch() -> None:
    """vLLM's cadence is per request: requests admitted in one schedule stay one
    micro-batch, so PP's other slot stays empty and a token takes both stages."""
    reqs = [request(i, 0.0, 10, 20) for i in range(4)]
    sizes: list[int] = []
    sim = PipelineScheduler(reqs, _config(2), _weights_bound(STAGE),
                            on_step=lambda s: sizes.append(len(s.last_scheduled)))
    res = sim.run()
    assert set(sizes) == {4}
    assert all(math.isclose(_tpot(res, i), 2 * STAGE) for i in range(4))


def test_refusals() -> None:
    with pytest.raises(InvalidInput, match="pipeline_parallel"):
        Scheduler([request(0, 0.0, 10, 2)], _config(2), _weights_bound(STAGE))
    sync = EngineConfig(num_gpu_blocks=100, block_size=16, max_num_seqs=8,
                        max_num_batched_tokens=256, max_model_len=512, pipeline_parallel=2)
    with pytest.raises(InvalidInput, match="async_scheduling"):
        PipelineScheduler([request(0, 0.0, 10, 2)], sync, _weights_bound(STAGE))
    with pytest.raises(InvalidInput, match="CPU tier"):
        EngineConfig(num_gpu_blocks=100, block_size=16, max_num_seqs=8,
                     max_num_batched_tokens=256, max_model_len=512, pipeline_parallel=2,
                     cpu_offload_blocks=10)


def _l70(tp: int, pp: int, rate: float | None = None) -> PlanRequest:
    profile = preset_profile("chat")
    if rate is not None:
        profile = profile.model_copy(update={"request_rate_per_second": rate})
    return PlanRequest(model=L70, gpu=H100, tensor_parallel=tp, pipeline_parallel=pp,
                       profile=profile)


def test_a_pp_engine_holds_the_planners_blocks_and_one_stages_costs() -> None:
    tp4, pp2 = _l70(4, 1), _l70(4, 2)
    plan = plan_pool(pp2).plan
    sim = simulated_plan(pp2, plan, "pp2")
    mem = PlanRun(pp2).memory(plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs,
                              plan.max_num_batched_tokens, plan.gpu_memory_utilization)
    # The fewest blocks of any stage (vLLM's get_kv_cache_configs), as the planner has them.
    # (vLLM's count, with its null block, as at PP 1.)
    assert sim.engine.num_gpu_blocks == mem.num_gpu_blocks
    assert sim.engine.pipeline_parallel == 2
    assert sim.engine.pipeline_send_seconds_per_token == decode.pipeline_send_seconds(
        L70, H100, pp2.layout, 1)
    assert sim.engine.kv_cache_tokens > simulated_plan(tp4, plan, "tp4").engine.kv_cache_tokens
    whole, stage = step_cost_for(tp4, "auto"), step_cost_for(pp2, "auto")
    # 80 layers over 2 stages: a GPU holds 40 layers' KV, weights, GEMMs and all-reduces.
    assert stage.kv_bytes_per_token * 2 == whole.kv_bytes_per_token
    assert whole.kernels is not None and stage.kernels is not None
    assert stage.kernels.all_reduces_per_step * 2 == whole.kernels.all_reduces_per_step
    assert stage.weights_bytes < 0.6 * whole.weights_bytes
    assert stage.step_seconds(64, 64 * 2000, 64 * 2000.0) < 0.6 * whole.step_seconds(
        64, 64 * 2000, 64 * 2000.0)


def test_the_capacity_search_plans_a_pinned_pp_engine() -> None:
    """``--pp 2 --request-rate``: the search replays the micro-batches (it refused before);
    PP's latency shows in its TPOT, above TP8's on the same 8 GPUs."""
    quick = SearchSettings(rungs=(30, 60), batched_tokens=(2048, 8192))
    pp2 = plan_by_goodput(_l70(4, 2, rate=4.0), settings=quick)
    tp8 = plan_by_goodput(_l70(8, 1, rate=4.0), settings=quick)
    assert pp2.search is not None and tp8.search is not None
    assert pp2.search.capacity_requests_per_second > 0
    assert pp2.search.tpot_p95_seconds > tp8.search.tpot_p95_seconds
    assert "--pipeline-parallel-size=2" in pp2.vllm_args()
