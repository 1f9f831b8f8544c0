"""kvtune's KV capacity per parallel layout against vLLM 0.33's own KV-cache configuration
code, run on CPU, for DeepSeek-V3 (MLA) on 8 x H200 and 16 x H100 (docs/layouts.md).

Per layout, vLLM is given what one engine (one DP rank) gives it at start:

- each layer's spec from ``MLAAttention.get_kv_cache_spec`` itself (called on a stand-in
  layer holding what DeepSeek-V3's attention passes it: fp8 KV, a 512 + 64 latent);
- one spec dict and the KV budget kvtune figures per GPU for each of the engine's TP workers,
  under a ``ParallelConfig`` of the layout's TP, DP and EP;
- ``get_global_kv_cache_groups`` then ``get_kv_cache_configs``, as the engine core calls them
  (the KV layout resolved for FlashMLA, the backend kvtune plans for fp8 MLA on Hopper).

Checked: vLLM's num_blocks per worker is kvtune's num_gpu_blocks; vLLM's ``kv_tp_replicas``
(TP ranks holding the same KV) is kvtune's ``kv_copies``; one engine's tokens are vLLM's
blocks x its scheduler block (``resolve_dcp_kv_block_size``: block_size x DCP); and the
replica's tokens kvtune reports are DP engines x that (each DP rank is its own engine).
Decode context parallel is checked at TP8+DCP8 (vLLM's kv_tp_replicas says 1 whenever DCP is
on; with DCP < TP the copies are TP/DCP, which vLLM does not report).

Pipeline parallel (TP4+PP2 and TP2+PP4 on 8 x H200, TP8+PP2 on 16 x H100): each stage's TP
workers get the specs of their own layers only, split by vLLM's ``get_pp_indices``, and the
KV budget kvtune figures for that stage (its own weights); vLLM gives every worker the
smallest count (``get_kv_cache_configs``), which must be kvtune's num_gpu_blocks.
"""

from __future__ import annotations

import json
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.layouts import kv_copies, replica_kv_tokens
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.layout_choice import choose_layout
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.presets import preset_profile

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DSV3_ID = "deepseek-ai/DeepSeek-V3"


def _raw_config() -> dict[str, Any]:
    path = resources.files("kvtune.tuner.facts").joinpath(
        "data", "models", "deepseek-ai--DeepSeek-V3.json")
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))["config"]
    return config


def _kv_budget_bytes(request: PlanRequest, pool: PoolPlan) -> list[int]:
    """kvtune's KV budget per GPU for the pool's plan (what vLLM's profiling leaves), one per
    pipeline stage."""
    p = pool.plan
    return [m.kv_budget_bytes for m in PlanRun(request).stage_memories(
        p.kv_cache_dtype, p.block_size, p.max_num_seqs, p.max_num_batched_tokens,
        p.gpu_memory_utilization)]


def _vllm_engine_configs(layout: ParallelLayout, pool: PoolPlan, budget: list[int]
                         ) -> list[Any]:
    """vLLM's KV-cache configs of one engine's TP workers (module docstring)."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

    cfg, p = _raw_config(), pool.plan
    vllm_config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        cache_config=CacheConfig(block_size=p.block_size),
        parallel_config=ParallelConfig(
            tensor_parallel_size=layout.tensor_parallel,
            data_parallel_size=layout.data_parallel,
            enable_expert_parallel=layout.expert_parallel,
            decode_context_parallel_size=layout.decode_context_parallel,
            pipeline_parallel_size=layout.pipeline_parallel),
        scheduler_config=SchedulerConfig(
            max_num_seqs=p.max_num_seqs, max_num_batched_tokens=p.max_num_batched_tokens,
            max_model_len=p.max_model_len, enable_chunked_prefill=True,
            is_encoder_decoder=False))
    import torch

    # Only what the KV planning reads of the model config (DeepseekV3ForCausalLM does not
    # group its own KV cache: that is DeepSeek V4's SupportsKVCacheGrouping).
    vllm_config.model_config = SimpleNamespace(  # type: ignore[assignment]
        original_max_model_len=p.max_model_len, max_model_len=p.max_model_len,
        supports_kv_cache_grouping=False, dtype=torch.bfloat16)
    stand_in = SimpleNamespace(
        kv_cache_dtype=p.kv_cache_dtype, head_size=cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"],
        sliding_window=None, topk_buffer_width=None, indexer=None,
        non_causal_multi_token_decode=False)
    spec = MLAAttention.get_kv_cache_spec(stand_in, vllm_config)  # type: ignore[arg-type]
    from vllm.distributed.utils import get_pp_indices

    layers, pp = cfg["num_hidden_layers"], layout.pipeline_parallel
    # Each PP stage's workers hold the specs of its own layers (as its model runner builds).
    stages = [{f"model.layers.{i}.self_attn.attn": spec
               for i in range(*get_pp_indices(layers, rank, pp))} for rank in range(pp)]
    names = [x.name for x in get_supported_kv_cache_layouts([FlashMLABackend])]
    resolve_kv_cache_layout(vllm_config, [names], [spec])
    workers = [stage for stage in stages for _ in range(layout.tensor_parallel)]
    budgets = [b for b in budget for _ in range(layout.tensor_parallel)]
    assert len(budget) == pp
    groups = get_global_kv_cache_groups(vllm_config, workers)
    return list(get_kv_cache_configs(vllm_config, workers, budgets, groups))


@pytest.fixture(scope="module")
def planned() -> dict[str, tuple[PlanRequest, PoolPlan]]:
    """DeepSeek-V3's layouts of 8 H200 and of 16 H100 as kvtune plans them."""
    model = get_model(DSV3_ID)
    out: dict[str, tuple[PlanRequest, PoolPlan]] = {}
    for gpu, gpus in (("H200", 8), ("H100", 16)):
        request = PlanRequest(model=model, gpu=get_gpu_class(gpu), profile=preset_profile("chat"))
        chosen = choose_layout(request, gpus, plan_pool)
        for option in chosen.layouts_considered:
            layout = option.layout
            if layout.data_parallel not in (1, 2, gpus):
                continue  # TP8, TP4xDP2, DP8 (and their 16-GPU kin) cover the cases
            req = request.model_copy(update={
                "tensor_parallel": layout.tensor_parallel,
                "data_parallel": layout.data_parallel,
                "expert_parallel": layout.expert_parallel})
            out[f"{gpu} {layout.label}"] = (req, plan_pool(req))
            assert option.kv_cache_tokens_per_engine == out[f"{gpu} {layout.label}"][
                1].expected.kv_cache_tokens
    # Decode context parallel, pinned: each latent on one rank of eight.
    request = PlanRequest(model=model, gpu=get_gpu_class("H200"), tensor_parallel=8,
                          decode_context_parallel=8, profile=preset_profile("chat"))
    out["H200 TP8+DCP8"] = (request, plan_pool(request))
    # Pipeline parallel, pinned: each stage its own layers.
    for gpu, tp, pp in (("H200", 4, 2), ("H200", 2, 4), ("H100", 8, 2)):
        request = PlanRequest(model=model, gpu=get_gpu_class(gpu), tensor_parallel=tp,
                              pipeline_parallel=pp, profile=preset_profile("chat"))
        out[f"{gpu} {request.layout.label}"] = (request, plan_pool(request))
    return out


CASES = ["H200 TP8", "H200 TP4xDP2+EP", "H200 DP8+EP", "H100 TP16", "H100 TP8xDP2+EP",
         "H100 DP16+EP", "H200 TP8+DCP8", "H200 TP4+PP2", "H200 TP2+PP4", "H100 TP8+PP2"]


@pytest.mark.parametrize("case", CASES)
def test_kv_capacity_per_layout_is_vllms(vllm: object, planned: dict[str, Any],
                                          case: str) -> None:
    request, pool = planned[case]
    layout = request.layout
    configs = _vllm_engine_configs(layout, pool, _kv_budget_bytes(request, pool))
    assert len(configs) == layout.tensor_parallel * layout.pipeline_parallel
    assert {c.num_blocks for c in configs} == {pool.expected.num_gpu_blocks}
    assert {c.kv_tp_replicas for c in configs} == {kv_copies(request.model, layout)}
    from vllm.v1.core.kv_cache_utils import resolve_dcp_kv_block_size

    # The scheduler's block: block_size tokens on each DCP rank.
    scheduler_block = resolve_dcp_kv_block_size(
        configs[0].kv_cache_groups[0].kv_cache_spec, layout.decode_context_parallel)
    assert scheduler_block == pool.plan.block_size * layout.decode_context_parallel
    engine_tokens = configs[0].num_blocks * scheduler_block
    # kvtune gives the tokens vLLM logs: int(num_blocks / blocks per request x max-model-len)
    # (get_kv_cache_capacity), a float product that can land a token below the blocks' own
    # count (24,285 x 64 = 1,554,240 logs 1,554,239 at max-model-len 11,264), once per DCP rank.
    assert 0 <= engine_tokens - pool.expected.kv_cache_tokens <= layout.decode_context_parallel
    assert replica_kv_tokens(layout, pool.expected.num_gpu_blocks, pool.plan.block_size) == (
        layout.data_parallel * engine_tokens)


def test_dp8_holds_more_than_five_times_tp8s_tokens_by_vllms_own_blocks(
        vllm: object, planned: dict[str, Any]) -> None:
    """The headline: on 8 x H200, TP8 copies each latent on 8 ranks; DP8+EP does not."""
    tokens = {}
    for case in ("H200 TP8", "H200 DP8+EP"):
        request, pool = planned[case]
        configs = _vllm_engine_configs(request.layout, pool, _kv_budget_bytes(request, pool))
        tokens[case] = request.layout.data_parallel * configs[0].num_blocks * pool.plan.block_size
    assert tokens["H200 DP8+EP"] > 5 * tokens["H200 TP8"]


@pytest.mark.parametrize(("layers", "pp"), [(61, 2), (61, 4), (61, 8), (80, 3), (94, 5),
                                            (36, 7), (5, 5)])
def test_pipeline_stage_layers_are_vllms_split(vllm: object, layers: int, pp: int) -> None:
    from vllm.distributed.utils import get_pp_indices

    from kvtune.tuner.facts.layouts import pipeline_stage_layers

    theirs = tuple(end - start for start, end in
                   (get_pp_indices(layers, rank, pp) for rank in range(pp)))
    assert pipeline_stage_layers(layers, pp) == theirs


def test_pipeline_engine_blocks_are_the_fewest_of_any_stage(
        vllm: object, planned: dict[str, Any]) -> None:
    """At TP2+PP4 (61 layers: 15, 15, 16, 15) the stages' own counts differ; vLLM keeps the
    smallest, and so does kvtune."""
    request, pool = planned["H200 TP2+PP4"]
    p = pool.plan
    stages = PlanRun(request).stage_memories(p.kv_cache_dtype, p.block_size, p.max_num_seqs,
                                             p.max_num_batched_tokens, p.gpu_memory_utilization)
    own = [m.num_gpu_blocks for m in stages]
    assert len(set(own)) > 1
    configs = _vllm_engine_configs(request.layout, pool, _kv_budget_bytes(request, pool))
    assert {c.num_blocks for c in configs} == {min(own)} == {pool.expected.num_gpu_blocks}
