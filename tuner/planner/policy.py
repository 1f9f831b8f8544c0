"""What the platform team asks of a plan: SLOs, the quality floor, and pinned knobs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.kv_quality import KVQualityPolicy

# KV precision floors, from widest to narrowest. A dtype's precision class is its bits per
# element: 16 (bf16/fp16/auto on a 16-bit model), 8 (fp8*, int8_per_token_head), 4 (nvfp4,
# int4_per_token_head, ...). "fp8" as a floor means "8 bits or wider".
KVPrecision = Literal["bf16", "fp8", "int8", "fp4", "int4"]


class SLO(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_p95_seconds: float | None = Field(default=None, gt=0.0)
    tpot_p95_seconds: float | None = Field(default=None, gt=0.0)


# Upper bounds on pins: beyond any model, GPU or node kvtune plans for, so a typo (an extra
# zero, a value in the wrong unit) fails at the boundary instead of sizing a plan, a
# simulation or a pod's memory from it. Tokens: 2**24, above the longest context of any
# catalog model (Llama 4 Scout's 10,485,760). Sequences: 100x vLLM's largest default.
# Offload: 64 TiB across the TP ranks, the CRD's bound (operator/api/ PinSpec).
MAX_PIN_TOKENS = 1 << 24
MAX_PIN_SEQUENCES = 100_000
MAX_PIN_OFFLOAD_GIB = 65536.0


class Pins(BaseModel):
    """Knobs a human wants fixed. ``None`` means "let kvtune choose". Names and units follow
    vLLM's flags (``kv_offloading_size_gib`` is GiB across TP ranks, as vLLM takes it).
    Lower bounds are vLLM 0.33's own (``CacheConfig``, ``SchedulerConfig``: ``gt=0``,
    ``ge=1``); what vLLM refuses of a combination of pins is ``validation.py``'s."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    block_size: int | None = Field(default=None, gt=0, le=MAX_PIN_TOKENS)
    kv_cache_dtype: str | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0)
    max_model_len: int | None = Field(default=None, gt=0, le=MAX_PIN_TOKENS)
    max_num_seqs: int | None = Field(default=None, gt=0, le=MAX_PIN_SEQUENCES)
    max_num_batched_tokens: int | None = Field(default=None, gt=0, le=MAX_PIN_TOKENS)
    enable_prefix_caching: bool | None = None
    kv_offloading_size_gib: float | None = Field(default=None, ge=0.0, le=MAX_PIN_OFFLOAD_GIB)
    attention_backend: str | None = None


class PlanPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slo: SLO = SLO()
    # Never quantize the KV cache below this precision.
    lowest_kv_precision: KVPrecision = "fp8"
    # The measured-evidence gate on narrower KV dtypes (tuner.kv_quality).
    kv_quality: KVQualityPolicy = KVQualityPolicy()
    pins: Pins = Pins()
    # Sequences that must fit at the profile's high-percentile context; None: derive from
    # the TPOT SLO and the GPU's bandwidth.
    target_concurrent_sequences: int | None = Field(default=None, gt=0)
    # The spec guarantees clients at least this context; max-model-len never goes below it.
    min_max_model_len_tokens: int | None = Field(default=None, gt=0)
    # CPU memory per GPU that may hold offloaded KV blocks (0: no offload).
    cpu_offload_budget_bytes: int = Field(default=0, ge=0)
