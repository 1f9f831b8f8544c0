"""The measurement report: what ``kvtune quality`` prints, the calibration Job writes and the
operator keeps in a ConfigMap and in status. Plain pydantic data, no torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvtune.quality.checkpoint import CheckpointKVScales

SCHEMA = "kvtune.io/kv-quality/v1"
# A layer whose attention output moves by more than this (relative, ‖Δ‖/‖o‖) is listed as
# flagged: a coarse pointer to where a dtype hurts. The gate itself is on the KL divergence.
ATTENTION_ERROR_FLAG = 0.10
RANDOM_INIT_NOTE = (
    "random weights initialised from config.json: this proves the measurement's mechanics, "
    "not this model's quality; measure the real checkpoint before trusting a narrower KV dtype")


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DtypeMeasurement(_Data):
    dtype: str
    bits: int
    scales: str  # where vLLM's scales come from for this dtype, in words
    kl_mean: float  # nats, next-token KL(16-bit ‖ quantized), mean over positions
    kl_p95: float
    kl_max: float
    top1_agreement: float  # share of positions with the same argmax as 16-bit KV
    attention_error_max: float  # worst layer's ‖Δo‖/‖o‖ (that layer's KV alone quantized)
    attention_error_worst_layer: int
    attention_error_per_layer: list[float] = Field(default_factory=list)
    flagged_layers: list[int] = Field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.dtype}: KL {self.kl_mean:.2e} nats (p95 {self.kl_p95:.2e}), top-1 "
                f"{self.top1_agreement:.1%}, worst layer {self.attention_error_worst_layer} "
                f"attention error {self.attention_error_max:.1%}")


class PromptSetSummary(_Data):
    name: str
    prompts: int
    tokens: int


class KVQualityReport(_Data):
    schema_: Literal["kvtune.io/kv-quality/v1"] = Field(default="kvtune.io/kv-quality/v1",
                                                        alias="schema")
    model: str
    revision: str | None = None
    weights: Literal["checkpoint", "random-init"]
    note: str = ""
    vllm_version: str = "0.33.0"  # whose cache layouts were reproduced
    device: str
    activation_dtype: str
    prompt_set: PromptSetSummary
    checkpoint: CheckpointKVScales
    measurements: list[DtypeMeasurement]
    seconds: float
    # Where the time went: the 16-bit passes (incl. the per-layer side computations), the
    # quantized passes, and the numpy KV round trips inside both.
    seconds_by_phase: dict[str, float] = Field(default_factory=dict)

    def measurement(self, dtype: str) -> DtypeMeasurement | None:
        return next((m for m in self.measurements if m.dtype == dtype), None)

    def compact(self) -> dict[str, Any]:
        """Without the per-layer lists: what fits a container's termination message (4 KiB)."""
        data = self.model_dump(mode="json", by_alias=True)
        for m in data["measurements"]:
            m.pop("attention_error_per_layer", None)
            m["flagged_layers"] = m["flagged_layers"][:8]
        return data
