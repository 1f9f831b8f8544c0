"""What the platform team asks of a plan: SLOs, the quality floor, and pinned knobs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The pins' upper bounds live in the knob table; re-exported for the CLI's other options.
from kvtune.tuner.knobs import MAX_PIN_OFFLOAD_GIB as MAX_PIN_OFFLOAD_GIB
from kvtune.tuner.knobs import MAX_PIN_SEQUENCES as MAX_PIN_SEQUENCES
from kvtune.tuner.knobs import MAX_PIN_TOKENS as MAX_PIN_TOKENS
from kvtune.tuner.kv_quality import KVQualityPolicy
from kvtune.tuner.planner.pin_fields import PinsFields

# KV precision floors, from widest to narrowest. A dtype's precision class is its bits per
# element: 16 (bf16/fp16/auto on a 16-bit model), 8 (fp8*, int8_per_token_head), 4 (nvfp4,
# int4_per_token_head, ...). "fp8" as a floor means "8 bits or wider".
KVPrecision = Literal["bf16", "fp8", "int8", "fp4", "int4"]


class SLO(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_p95_seconds: float | None = Field(default=None, gt=0.0)
    tpot_p95_seconds: float | None = Field(default=None, gt=0.0)


class Pins(PinsFields):
    """Knobs a human wants fixed. ``None`` means "let kvtune choose". Names and units follow
    vLLM's flags (``kv_offloading_size_gib`` is GiB across TP ranks, as vLLM takes it).
    Lower bounds are vLLM 0.33's own (``CacheConfig``, ``SchedulerConfig``: ``gt=0``,
    ``ge=1``); what vLLM refuses of a combination of pins is ``validation.py``'s. The fields
    and their bounds are the knob table's (``tuner/knobs.py``, generated into
    ``pin_fields.py``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


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
