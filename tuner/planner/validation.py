"""Inputs and pins that can never work, refused before any decision is made.

Each check raises ``InvalidInput`` naming the field, the value and what vLLM would accept:
tensor parallel must divide the attention heads; a pinned KV dtype, attention backend or
block size must be one some backend of the pinned vLLM runs on this GPU; max-model-len (the
pin or the policy's floor) must not exceed the model's ``max_position_embeddings``.
FP8 weights on a GPU without native FP8 only warn (vLLM serves them, slower).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.models import ModelArchitecture

if TYPE_CHECKING:
    from kvtune.tuner.facts.capabilities import AttentionFamily, RuntimeCapabilities
    from kvtune.tuner.facts.weights import WeightsLoad
    from kvtune.tuner.planner.backend_choice import BackendChooser
    from kvtune.tuner.planner.request import PlanRequest


def tensor_parallel_ok(model: ModelArchitecture, tp: int) -> bool:
    """Whether vLLM 0.33 shards this model over ``tp`` GPUs: the attention heads must divide
    evenly (ModelConfig.verify_with_parallel_config), and outside MLA the KV heads too, or be
    replicated a whole number of times when fewer than the ranks (QKVParallelLinear:
    ``divide(kv_heads, tp)`` or ``divide(tp, kv_heads)``, an assertion at load)."""
    if model.num_attention_heads % tp:
        return False
    if model.is_mla:
        return True
    kv = model.num_kv_heads
    return (kv % tp == 0) if tp < kv else (tp % kv == 0)


def validate(
    req: PlanRequest, runtime: RuntimeCapabilities, backends: BackendChooser,
    attention: AttentionFamily, weights: WeightsLoad,
) -> list[str]:
    """Raises ``InvalidInput`` for what can never work; returns the warnings. Takes the run's
    parts, not the ``PlanRun`` that calls it (that was an import cycle)."""
    gpu = req.gpu
    warnings: list[str] = []
    _check_parallelism(req)
    bits = weights.bits
    if bits == 8 and not gpu.supports_fp8 and weights.weights_dtype == "fp8":
        warnings.append(
            f"{gpu.name} has no native FP8: vLLM serves FP8 weights there with "
            "weight-only Marlin kernels (slower prefill)"
        )
    _check_pins(req, runtime, backends, attention, weights, warnings)
    check_scheduler_pins(req, runtime.vllm_version)
    _check_lengths(req)
    return warnings


def _check_parallelism(req: PlanRequest) -> None:
    """Tensor, decode-context and expert parallelism the model can be split by."""
    model, tp = req.model, req.tensor_parallel
    if not tensor_parallel_ok(model, tp):
        what = (f"{model.num_attention_heads} attention heads"
                + ("" if model.is_mla else f" and {model.num_kv_heads} KV heads"))
        raise InvalidInput(
            "tensor_parallel", tp,
            f"{model.hf_id} has {what}; tensor parallel must divide them (or, for KV "
            "heads fewer than the ranks, be a multiple of them): vLLM refuses otherwise. "
            "Try " + (", ".join(str(t) for t in (1, 2, 4, 8) if tensor_parallel_ok(model, t))
                      or "a checkpoint with other head counts"),
        )
    dcp = req.decode_context_parallel
    if dcp > 1 and (not model.is_mla or tp % dcp):
        raise InvalidInput(
            "decode_context_parallel", dcp,
            f"kvtune plans decode context parallel for MLA models only, over a TP it divides "
            f"(vLLM: tp % dcp == 0); {model.hf_id} "
            + (f"at TP {tp}: pick a DCP dividing {tp}" if model.is_mla else
               "does not use MLA: drop --dcp"))
    _check_pipeline(req)
    if req.expert_parallel and model.moe is None:
        raise InvalidInput(
            "expert_parallel", True,
            f"{model.hf_id} is dense (no experts to split); drop expert parallel (--ep) or "
            "plan a mixture-of-experts model")


def _check_pipeline(req: PlanRequest) -> None:
    """Pipeline parallel: at most one stage per layer, and (kvtune's limit) a model whose
    layers all hold the same KV, so a stage's share of the cache is its share of the layers."""
    pp, model = req.pipeline_parallel, req.model
    if pp == 1:
        return
    if pp > model.num_hidden_layers:
        raise InvalidInput("pipeline_parallel", pp,
                           f"{model.hf_id} has {model.num_hidden_layers} layers; pick a "
                           "--pp of at most that many stages")
    if len(model.layer_groups) > 1 or model.attention_layers != model.num_hidden_layers:
        raise InvalidInput("pipeline_parallel", pp,
                           f"kvtune plans pipeline parallel for models with one attention "
                           f"kind; {model.hf_id} mixes layer kinds: drop --pp (use --tp/--dp)")


def _check_pins(req: PlanRequest, runtime: RuntimeCapabilities, backends: BackendChooser,
                attention: AttentionFamily, weights: WeightsLoad, warnings: list[str]) -> None:
    """The pinned KV-cache dtype, attention backend and block size this vLLM serves on this
    GPU (a warning appended where auto means the checkpoint's KV scheme)."""
    model, gpu, pins = req.model, req.gpu, req.policy.pins
    cc = gpu.compute_capability
    if pins.kv_cache_dtype is not None:
        if pins.kv_cache_dtype not in runtime.kv_cache_dtype_names:
            raise InvalidInput(
                "pins.kv_cache_dtype", pins.kv_cache_dtype,
                f"vLLM {runtime.vllm_version} accepts "
                f"{', '.join(runtime.kv_cache_dtype_names)}",
            )
        declared = model.auto_kv_cache_dtype
        if pins.kv_cache_dtype == "auto" and declared is not None:
            # vLLM 0.33 honours the checkpoint's KV scheme at auto (sized so); 16-bit KV
            # must be named.
            warnings.append(
                f"kv-cache-dtype auto on {model.hf_id} is {declared}: the checkpoint declares "
                f"that KV-cache scheme; pin {weights.served_dtype} for 16-bit KV")
        dtype = runtime.dtype(pins.kv_cache_dtype)
        reason = backends.dtype_unusable(dtype)
        if reason is not None:
            raise InvalidInput("pins.kv_cache_dtype", pins.kv_cache_dtype, reason)
    if pins.attention_backend is not None:
        backend = runtime.backend(pins.attention_backend)
        if backend.attention != attention or not backend.runs_on(cc):
            raise InvalidInput(
                "pins.attention_backend", pins.attention_backend,
                f"does not serve {attention} attention on compute capability "
                f"{cc[0]}.{cc[1]} ({gpu.name}); allowed: "
                + ", ".join(
                    b.name for b in runtime.backends
                    if b.attention == attention and b.runs_on(cc)
                ),
            )
    if pins.block_size is not None:
        allowed = backends.allowed_block_sizes(pins.kv_cache_dtype or "auto")
        if not backends.block_size_ok(pins.kv_cache_dtype or "auto", pins.block_size):
            raise InvalidInput(
                "pins.block_size", pins.block_size,
                f"no {attention}-attention backend of vLLM "
                f"{runtime.vllm_version} on {gpu.name} accepts it for "
                f"kv_cache_dtype={pins.kv_cache_dtype or 'auto'}; allowed: "
                f"{allowed}",
            )


def _check_lengths(req: PlanRequest) -> None:
    """Length floors and pins within the model's context."""
    model, pins = req.model, req.policy.pins
    floor = req.policy.min_max_model_len_tokens
    if floor is not None and floor > model.max_position_embeddings:
        raise InvalidInput(
            "policy.min_max_model_len_tokens", floor,
            f"above {model.hf_id}'s max_position_embeddings="
            f"{model.max_position_embeddings}; lower it",
        )
    if pins.max_model_len is not None and pins.max_model_len > model.max_position_embeddings:
        raise InvalidInput(
            "pins.max_model_len", pins.max_model_len,
            f"above {model.hf_id}'s max_position_embeddings="
            f"{model.max_position_embeddings}; vLLM refuses it without "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        )


# The most host memory per GPU a KV offload may ask for: 4x the largest GPU servers' share
# (DGX B200/B300: 2-4 TB for 8 GPUs, GH200/GB200: 480 GB LPDDR per Grace for 1-2 GPUs), so
# only a typo (TiB for GiB, an extra zero) is refused; the node's free memory is the real limit.
MAX_OFFLOAD_GIB_PER_GPU = 2048.0


def check_scheduler_pins(req: PlanRequest, vllm_version: str) -> None:
    """Pins vLLM refuses at start, or that no node could back:

    - ``max_num_batched_tokens < max_num_seqs``: vLLM 0.33's ``SchedulerConfig.
      verify_max_model_len`` raises ("must be greater than or equal to max_num_seqs"). (Its
      other rule, batched tokens >= max-model-len, holds only without chunked prefill, which
      vLLM turns on for every decoder model kvtune plans.) With max-num-seqs not pinned the
      planner keeps it at or below the batched tokens.
    - ``kv_offloading_size_gib`` beyond ``MAX_OFFLOAD_GIB_PER_GPU`` per TP rank: vLLM pins
      that much host memory at start and the pod would never be scheduled.
    """
    pins, tp = req.policy.pins, req.tensor_parallel
    batched, seqs = pins.max_num_batched_tokens, pins.max_num_seqs
    if batched is not None and seqs is not None and batched < seqs:
        raise InvalidInput(
            "pins.max_num_batched_tokens", batched,
            f"below the pinned max_num_seqs={seqs}: vLLM {vllm_version} refuses to start "
            f"(max_num_batched_tokens must be >= max_num_seqs); pin at least {seqs}, or "
            "lower max-num-seqs")
    size = pins.kv_offloading_size_gib
    if size is not None and size > MAX_OFFLOAD_GIB_PER_GPU * tp:
        raise InvalidInput(
            "pins.kv_offloading_size_gib", size,
            f"{size / tp:g} GiB of host memory per GPU at TP {tp}: more than any GPU node "
            f"has (kvtune's limit: {MAX_OFFLOAD_GIB_PER_GPU:g} GiB per GPU); size it from "
            "the node's free memory, in GiB across the TP ranks")
