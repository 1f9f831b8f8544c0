"""From kvtune's facts (model, GPU class, plan) to the simulator's plain numbers.

The simulator core takes numbers (``EngineConfig``, ``StepCostModel``); this module derives
them the way the planner does, so a simulated plan and a planned plan agree on the KV-cache
size: ``planning.preflight`` gives the KV bytes vLLM would allocate, ``kvmemory`` the page
size, ``weights`` the bytes per GPU.

Not modeled: sliding-window and chunked-attention layers recycling blocks (every layer is
treated as full attention, so hybrid models get fewer simulated blocks than vLLM gives
them), MoE reading only the routed experts in small decode batches (all weights are read
every step), speculative decoding. KV offload to CPU (``--kv-offloading-size``) is the
CPU tier of ``offload.py``; on a declared GPU class with no host-link fact it is not
simulated.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts import kv_tiers
from kvtune.tuner.facts.capabilities import get_runtime
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token, kv_cache_tokens, page_size_bytes
from kvtune.tuner.facts.weights import weight_bits, weights_bytes_per_gpu, weights_load
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.plan_tier import KVTier
from kvtune.tuner.planner import planning
from kvtune.tuner.simulator import pipeline_costs
from kvtune.tuner.simulator.kernel_costs import kernel_times
from kvtune.tuner.simulator.scheduler import Allocation, EngineConfig
from kvtune.tuner.simulator.timing import StepCostModel, efficiency_for

# vLLM's CPU offload region aligns each chunk to the host page (``mmap.PAGESIZE``, 4 KiB on
# x86-64 Linux; ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``).
_HOST_PAGE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class SimulatedPlan:
    """One configuration ready to replay: the plan, the engine numbers, the step costs, and
    whether vLLM would start with it (one max-model-len request must fit)."""

    name: str
    plan: KVPlan
    engine: EngineConfig
    cost: StepCostModel
    starts: bool
    start_error: str = ""


def step_cost_for(request: planning.PlanRequest, kv_cache_dtype: str) -> StepCostModel:
    """One engine step's costs per GPU; under pipeline parallel one stage's
    (``pipeline_costs``)."""
    model, gpu, tp = request.model, request.gpu, request.tensor_parallel
    bits = weight_bits(model, request.weights_dtype)
    # FP8 checkpoints run FP8 GEMMs where the GPU has them; everything else at BF16 rate.
    flops_rate = float(gpu.dense_bf16_flops_per_second)
    if bits <= 8 and gpu.dense_fp8_flops_per_second:
        flops_rate = float(gpu.dense_fp8_flops_per_second)
    heads_per_gpu = max(1, model.num_attention_heads // tp)
    if model.mla is not None:
        qk = model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim
        pair_flops = 2.0 * model.num_hidden_layers * heads_per_gpu * (qk + model.mla.v_head_dim)
    else:
        pair_flops = 4.0 * model.num_hidden_layers * heads_per_gpu * model.head_dim
    eff = efficiency_for(gpu.name)
    whole = StepCostModel(
        weights_bytes=weights_bytes_per_gpu(model, request.weights_dtype, tp,
                                            data_parallel=request.data_parallel),
        # Per GPU: a DCP rank holds (and reads) 1/DCP of the tokens.
        kv_bytes_per_token=-(-kv_bytes_per_token(
            model, kv_cache_dtype, tp,
            model_dtype=weights_load(model, request.weights_dtype).served_dtype,
        ) // request.decode_context_parallel),
        hbm_bytes_per_second=float(gpu.hbm_bandwidth_bytes_per_second),
        matrix_flops_per_second=flops_rate,
        flops_per_token=2.0 * model.active_parameter_count / tp,
        attention_flops_per_token_pair=pair_flops,
        efficiency=eff,
        kernels=kernel_times(request, flops_rate, eff),
    )
    return whole if request.pipeline_parallel == 1 else pipeline_costs.stage_cost(request, whole)


def simulated_plan(
    request: planning.PlanRequest, plan: KVPlan, name: str, allocation: Allocation = "paged",
    tier: KVTier | None = None,
) -> SimulatedPlan:
    """The engine numbers of ``plan`` on the request's model and GPU, with ``tier`` (an
    LMCache tier, ``tuner/plan_tier.py``) in place of the native CPU tier when given."""
    ok, need_bytes, available_bytes = planning.preflight(request, plan)
    served = weights_load(request.model, request.weights_dtype).served_dtype
    page = page_size_bytes(request.model, plan.kv_cache_dtype, request.tensor_parallel,
                           plan.block_size, model_dtype=served)
    pp = request.pipeline_parallel
    if pp > 1:
        # A block on a GPU holds its stage's layers; ``preflight`` gives the fewest blocks of
        # any stage (vLLM's ``get_kv_cache_configs``) in pages of the stage with the most.
        page = page * pipeline_costs.stage_layers(request) // request.model.num_hidden_layers
    num_gpu_blocks = available_bytes // page + 1  # + vLLM's null block
    if request.model.mamba is not None:
        # A hybrid Mamba model: the simulator runs its attention as one full-attention pool;
        # the Mamba states of max-num-seqs sequences are set aside first (kv_cache_tokens).
        num_gpu_blocks = kv_cache_tokens(
            request.model, plan.kv_cache_dtype, request.tensor_parallel, plan.block_size,
            available_bytes, plan.max_num_seqs, model_dtype=served) // plan.block_size + 1
    error = "" if ok else (
        f"vLLM would not start: one max-model-len ({plan.max_model_len}) request needs "
        f"{need_bytes / 2**30:.2f} GiB of KV cache but {available_bytes / 2**30:.2f} GiB is "
        "available; lower max-model-len or raise gpu-memory-utilization"
    )
    if num_gpu_blocks < 2:
        raise InvalidInput(
            "plan", name, f"leaves no KV-cache memory ({available_bytes} bytes); {error}")
    kv_tokens = (num_gpu_blocks - 1) * plan.block_size
    if allocation == "contiguous" and plan.max_model_len > kv_tokens:
        raise InvalidInput(
            "max_model_len", plan.max_model_len,
            f"contiguous allocation needs one {plan.max_model_len}-token reservation but the "
            f"KV cache holds {kv_tokens} tokens",
        )
    cpu_blocks, seconds_per_block = (offload_tier(request, plan, page) if tier is None
                                     else lmcache_tier(request, tier, page))
    if pp > 1:
        # The pipeline replay has no CPU tier (``sched_pipeline``): a plan's offload is
        # scored without its hits, a floor.
        cpu_blocks, seconds_per_block = 0, 0.0
    # Under decode context parallel the scheduler's block holds block_size tokens per DCP rank.
    engine = EngineConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=plan.block_size * request.decode_context_parallel,
        max_num_seqs=plan.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens,
        max_model_len=plan.max_model_len,
        enable_prefix_caching=plan.enable_prefix_caching and allocation == "paged",
        allocation=allocation,
        # vLLM 0.33 schedules asynchronously by default (no KV flag turns it off).
        async_scheduling=True,
        cpu_offload_blocks=cpu_blocks if allocation == "paged" else 0,
        offload_load_seconds_per_block=seconds_per_block,
        pipeline_parallel=pp,
        pipeline_send_seconds_per_token=(pipeline_costs.send_seconds_per_token(request)
                                         if pp > 1 else 0.0),
    )
    return SimulatedPlan(
        name=name, plan=plan, engine=engine,
        cost=step_cost_for(request, plan.kv_cache_dtype), starts=ok, start_error=error,
    )


def offload_tier(request: planning.PlanRequest, plan: KVPlan, page_bytes: int
                 ) -> tuple[int, float]:
    """The CPU tier of ``--kv-offloading-size`` (``offload.py``): how many chunks it holds
    and the seconds one chunk takes to load; (0, 0.0) when offload is off or the GPU class
    has no host-link fact. As vLLM's ``CPUOffloadingSpec``: the size is GiB across TP ranks,
    a chunk is one block on every rank (one copy for MLA under TP, ``replicated_layout``),
    rounded up to the host page size; each rank loads its own share over its own link."""
    size = plan.kv_offloading_size_gib
    link = request.gpu.host_link_bytes_per_second
    if not size or not link:
        return 0, 0.0
    tp = request.tensor_parallel
    copies = 1 if request.model.is_mla and tp > 1 else tp
    chunk = -(-page_bytes * copies // _HOST_PAGE_BYTES) * _HOST_PAGE_BYTES
    return int(size * 2**30) // chunk, page_bytes / link


def lmcache_tier(request: planning.PlanRequest, tier: KVTier, page_bytes: int
                 ) -> tuple[int, float]:
    """An LMCache tier as the simulator's one tier beyond the GPU: how many blocks its medium
    holds (``size_gib`` across ranks; one copy for MLA under TP, as the native tier) and the
    seconds one block takes to load over its link (``facts/kv_tiers.py``: PCIe for CPU, the
    drive then PCIe for disk, the node's NIC share then PCIe for remote); (0, 0.0) on a GPU
    class with no host-link fact. Simplified: the disk and remote tiers' CPU buffer is not a
    faster level (every hit loads at the slower medium's rate, so their gain is a floor), and
    LMCache's 256-token chunks are treated as the engine's blocks."""
    tp = request.tensor_parallel
    link = kv_tiers.tier_link(kv_tiers.check_kind(tier.kind),
                              request.gpu.host_link_bytes_per_second,
                              request.gpu.host_link_source, tp)
    if link is None:
        return 0, 0.0
    copies = 1 if request.model.is_mla and tp > 1 else tp
    return (int(tier.size_gib * 2**30) // (page_bytes * copies),
            link.seconds_per_block(page_bytes, copies))


def vllm_default_plan(request: planning.PlanRequest) -> KVPlan:
    """What ``vllm serve MODEL`` runs with no KV flags in vLLM 0.33 on this GPU
    (``vllm/config/cache.py``, ``vllm/engine/arg_utils.py`` via ``capabilities``): block 16
    (64 for MLA, whose FlashMLA backend takes only 64), dtype auto, utilization 0.92,
    max-model-len from the model, the server defaults for batched tokens and sequences by GPU
    memory, prefix caching on."""
    runtime = get_runtime(request.vllm_version)
    tokens, seqs = runtime.defaults_for_memory(request.gpu.cuda_total_bytes, request.gpu.name)
    model = request.model
    # The weights flags the requested weights dtype needs (--quantization for fp8 weights):
    # the simulation loads the weights that way, so the printed command must say so too.
    weights = weights_load(model, request.weights_dtype)
    return KVPlan(
        block_size=64 if model.is_mla else runtime.default_block_size,
        kv_cache_dtype="auto",
        gpu_memory_utilization=runtime.default_gpu_memory_utilization,
        max_model_len=model.max_position_embeddings,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        enable_prefix_caching=True,
        dtype=weights.dtype_flag,
        quantization=weights.quantization_flag,
        allow_deprecated_quantization=weights.allow_deprecated_quantization,
    )
