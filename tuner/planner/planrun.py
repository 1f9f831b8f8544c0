"""One planning run's facts: the request's derived facts and the memory arithmetic every
decision asks (bytes per choice, sessions that fit, vLLM's pre-flight).

A ``PlanRun`` is built once per ``plan_pool`` call and passed, read-only, to the decision
steps (what they decide travels in ``draft.Draft``); building it validates the request
(``validation``), so an impossible pin fails before any decision is made.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.tuner.facts.capabilities import AttentionFamily, RuntimeCapabilities, get_runtime
from kvtune.tuner.facts.kvmemory import block_bytes, request_kv_bytes
from kvtune.tuner.facts.layouts import PipelineStage, pipeline_stages
from kvtune.tuner.facts.weights import WeightsLoad, weights_bytes_per_gpu, weights_load
from kvtune.tuner.planner import budget, validation
from kvtune.tuner.planner.backend_choice import BackendChooser
from kvtune.tuner.planner.request import PlanRequest, session_tokens
from kvtune.tuner.units import GiB

# vLLM's scheduler cap on running sequences by default (decide_max_num_seqs caps its choice
# here; memory is figured for at most this many before the choice). It lives here, below the
# decisions, so the run imports no decision module (that was an import cycle).
MAX_NUM_SEQS_CEILING = 1024

@dataclass(frozen=True, slots=True)
class Memory:
    """The memory arithmetic of one (dtype, block size, max-num-seqs) choice."""

    non_kv: budget.NonKVBytes
    kv_budget_bytes: int
    page_bytes: int
    num_gpu_blocks: int

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_gpu_blocks * self.page_bytes


class PlanRun:
    """One planning run. Holds the request's derived facts and what the decisions found."""

    def __init__(self, request: PlanRequest) -> None:
        self.req = request
        self.model = request.model
        self.gpu = request.gpu
        self.tp = request.tensor_parallel
        self.pins = request.policy.pins
        self.runtime: RuntimeCapabilities = get_runtime(request.vllm_version)
        self.attention: AttentionFamily = "mla" if self.model.is_mla else "standard"
        self.cc = self.gpu.compute_capability
        # How vLLM loads the weights (and the flags it needs); refuses what it cannot do.
        self.weights: WeightsLoad = weights_load(self.model, request.weights_dtype)
        # The dtype vLLM serves at (float32 checkpoints at bfloat16): KV "auto" is this.
        self.model_dtype = self.weights.served_dtype
        self.backends = BackendChooser(
            self.runtime, self.attention, self.cc, self.pins.attention_backend,
            self.gpu.name, self.model_dtype, sinks=self.model.attention_sinks)
        # What validation warns of: the first warnings of the plan.
        self.validation_warnings: tuple[str, ...] = tuple(validation.validate(
            request, self.runtime, self.backends, self.attention, self.weights))
        self.layout = request.layout
        # Pipeline parallel: each stage's layers and weights; the figures per GPU are the
        # heaviest stage's (with one stage: the whole model at TP x DP).
        self.stages: tuple[PipelineStage, ...] = pipeline_stages(
            self.model, request.weights_dtype, self.layout)
        self.weights_bytes = (weights_bytes_per_gpu(
            self.model, request.weights_dtype, self.tp, data_parallel=self.layout.data_parallel
        ) if len(self.stages) == 1 else max(s.weights_bytes for s in self.stages))
        # The most layers on one stage: a GPU's share of each token's KV (all of them at PP 1).
        self.stage_layers = max(s.layers for s in self.stages)
        self.p95_session = session_tokens(request.profile, "p95")
        # vLLM's profiling run sizes the sampler for max-num-seqs sequences: until that is
        # chosen, memory is figured for the pin or the runtime default.
        _, default_seqs = self.runtime.defaults_for_memory(
            self.gpu.cuda_total_bytes, self.gpu.name)
        self.seqs_for_memory = self.pins.max_num_seqs or min(default_seqs, MAX_NUM_SEQS_CEILING)
        self.p50_session = session_tokens(request.profile, "p50")
        # The closed loop's correction terms (1.0 without a calibration).
        cal = request.calibration
        self.decode_time_scale = 1.0 if cal is None else cal.decode_time_scale
        self.prefill_time_scale = 1.0 if cal is None else cal.prefill_time_scale

    @staticmethod
    def gib(n: float) -> str:
        """Bytes as the messages quote them."""
        return f"{n / GiB:.2f} GiB"

    # --- memory -----------------------------------------------------------------------------

    def memory(
        self, dtype: str, block_size: int, max_num_seqs: int, batched_tokens: int,
        utilization: float,
    ) -> Memory:
        """One engine's KV memory per GPU. Under pipeline parallel: every stage's blocks from
        its own memory, the engine at the fewest (vLLM's ``get_kv_cache_configs``), counted in
        pages of the stage with the most layers (``request_bytes`` counts the same)."""
        if len(self.stages) == 1:
            return self.stage_memory(dtype, block_size, max_num_seqs, batched_tokens,
                                     utilization, self.weights_bytes, self.stage_layers)
        per_stage = self.stage_memories(dtype, block_size, max_num_seqs, batched_tokens,
                                        utilization)
        least = min(per_stage, key=lambda m: m.num_gpu_blocks)
        page = max(per_stage, key=lambda m: m.page_bytes).page_bytes
        return Memory(least.non_kv, least.kv_budget_bytes, page, least.num_gpu_blocks)

    def stage_memories(
        self, dtype: str, block_size: int, max_num_seqs: int, batched_tokens: int,
        utilization: float,
    ) -> list[Memory]:
        """Each PP stage's KV memory per GPU from its own weights and layers."""
        return [self.stage_memory(dtype, block_size, max_num_seqs, batched_tokens,
                                  utilization, s.weights_bytes, s.layers) for s in self.stages]

    def stage_memory(
        self, dtype: str, block_size: int, max_num_seqs: int, batched_tokens: int,
        utilization: float, weights_bytes: int, layers: int,
    ) -> Memory:
        non_kv = budget.non_kv_bytes(
            self.model, weights_bytes, self.tp, batched_tokens, max_num_seqs,
            vllm_version=self.req.vllm_version, gpu=self.gpu, model_dtype=self.model_dtype,
            communicating_ranks=self.layout.stage_gpus,
        )
        if self.pins.kv_cache_memory_bytes is not None:
            kv_budget = self.pins.kv_cache_memory_bytes
        else:
            kv_budget = budget.kv_budget_bytes(self.gpu, utilization, non_kv)
        page = self._layer_share(block_bytes(
            self.model, dtype, self.tp, block_size, model_dtype=self.model_dtype
        ), layers)
        if self.req.calibration is not None and self.pins.kv_cache_memory_bytes is None:
            # What vLLM really had for the KV cache, as the loop observed it (a pinned size
            # is exact: vLLM allocates that many bytes).
            kv_budget = int(kv_budget * self.req.calibration.kv_tokens_scale)
        blocks = max(0, kv_budget) // page
        return Memory(non_kv, kv_budget, page, blocks)

    def request_bytes(
        self, dtype: str, block_size: int, tokens: int, batched_tokens: int, max_model_len: int
    ) -> int:
        """KV bytes one request of ``tokens`` takes on each GPU. Under decode context parallel
        each rank holds 1/DCP of the tokens (vLLM's max_memory_usage_bytes: cdiv(len, dcp))."""
        dcp = self.layout.decode_context_parallel
        return self._layer_share(request_kv_bytes(
            self.model, dtype, self.tp, block_size, -(-tokens // dcp), batched_tokens,
            -(-max_model_len // dcp), model_dtype=self.model_dtype,
        ), self.stage_layers)

    def _layer_share(self, all_layers_bytes: int, layers: int) -> int:
        """A stage's part of bytes spread evenly over every layer (PP is planned for models
        with one attention kind, ``validation``: each layer holds the same KV)."""
        if layers == self.model.num_hidden_layers:
            return all_layers_bytes
        return all_layers_bytes * layers // self.model.num_hidden_layers

    def sessions(
        self, mem: Memory, dtype: str, block_size: int, tokens: int, batched_tokens: int,
        max_model_len: int,
    ) -> int:
        """Sequences of ``tokens`` that fit at once (one block is vLLM's null block)."""
        per_request = self.request_bytes(
            dtype, block_size, min(tokens, max_model_len), batched_tokens, max_model_len
        )
        usable = (mem.num_gpu_blocks - 1) * mem.page_bytes
        return max(0, usable // per_request)

    def preflight_ok(
        self, mem: Memory, dtype: str, block_size: int, batched_tokens: int, max_model_len: int
    ) -> bool:
        """vLLM refuses to start unless one ``max_model_len`` request fits in the KV cache."""
        need = self.request_bytes(dtype, block_size, max_model_len, batched_tokens, max_model_len)
        return mem.num_gpu_blocks >= 2 and need <= (mem.num_gpu_blocks - 1) * mem.page_bytes

    def largest_fitting_len(
        self, mem: Memory, dtype: str, block_size: int, batched_tokens: int, ceiling: int
    ) -> int:
        """The largest max-model-len (a multiple of the block size) one request of which fits."""
        lo, hi = 0, ceiling
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.preflight_ok(mem, dtype, block_size, batched_tokens, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo
