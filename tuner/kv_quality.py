"""The KV-quantization quality gate: which KV dtypes the measured evidence allows.

Pure: the measurement (``kvtune quality`` or the operator's calibration Job) comes in as
plain data, a verdict per dtype comes out. Every dtype choice (the planner's rules and its
capacity search) filters its candidates through ``gate`` before it weighs capacity.

- 16-bit KV ("auto", "bfloat16", "float16") is the reference: always allowed.
- A measured dtype is allowed when its mean next-token KL divergence against 16-bit KV is
  at most ``max_kl``; its verdict quotes the figure either way.
- An unmeasured dtype (or one measured only on random weights) is "unverified": allowed
  with that said, unless ``require_measurement``, which keeps it out until a measurement
  exists.

Why 0.01 nats by default: llama.cpp's and vLLM users' published KL figures put 8-bit KV
(q8_0, calibrated fp8) around 1e-4 to 1e-3 nats and naive 4-bit KV at 1e-2 and above, where
top-1 agreement drops below ~97%; 0.01 lets the former through and stops the latter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from kvtune.tuner.facts.models import CheckpointQuantization

DEFAULT_MAX_KV_QUANTIZATION_KL = 0.01  # nats, mean over calibration positions
SIXTEEN_BIT = frozenset({"auto", "bfloat16", "float16"})
# Dtypes stored alike: a measurement of one speaks for the other.
SAME_LAYOUT = {"fp8_e4m3": "fp8", "fp8": "fp8_e4m3"}

ALLOWED_MEASURED = "MeasuredWithinKL"
EXCEEDS_KL = "ExceedsKVQuantizationKL"
UNVERIFIED = "UnverifiedKVQuality"
UNVERIFIED_REQUIRED = "MeasurementRequired"
REFERENCE = "SixteenBitReference"


class KVDtypeMeasurement(BaseModel):
    """One dtype's figures from a KV-quality report."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: str
    kl_mean: float = Field(ge=0.0)
    top1_agreement: float = Field(ge=0.0, le=1.0)
    attention_error_max: float = Field(default=0.0, ge=0.0)
    attention_error_worst_layer: int = 0


class KVQualityEvidence(BaseModel):
    """A KV-quality report as the planner sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str  # where it came from, quoted in reasons: "calibration Job …, revision …"
    random_weights: bool = False  # measured on a random init: proves mechanics only
    checkpoint_kv_scales: bool | None = None  # calibrated k/v scales in the checkpoint
    measurements: tuple[KVDtypeMeasurement, ...] = ()

    def find(self, dtype: str) -> KVDtypeMeasurement | None:
        for name in (dtype, SAME_LAYOUT.get(dtype)):
            hit = next((m for m in self.measurements if m.dtype == name), None)
            if hit is not None:
                return hit
        return None


class KVQualityPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_kv_quantization_kl: float = Field(default=DEFAULT_MAX_KV_QUANTIZATION_KL, gt=0.0)
    require_measurement: bool = False
    # Why a measurement is required, quoted in the verdict (the operator: its calibration Job).
    required_by: str = "quality.requireMeasurement"


class DtypeGate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: str
    allowed: bool
    code: Literal["MeasuredWithinKL", "ExceedsKVQuantizationKL", "UnverifiedKVQuality",
                  "MeasurementRequired", "SixteenBitReference"]
    detail: str


def gate_one(dtype: str, evidence: KVQualityEvidence | None, policy: KVQualityPolicy,
             checkpoint_scheme: str | None = None) -> DtypeGate:
    """``checkpoint_scheme``: the KV-cache scheme the checkpoint's config declares for this
    dtype, in words (``CheckpointQuantization.kv_cache_scheme``): its exports carry calibrated
    k/v scales, which vLLM uses for the dtype. Evidence from the checkpoint, quoted; it allows
    nothing a measurement would not (an unmeasured dtype stays unverified)."""
    if dtype in SIXTEEN_BIT:
        return DtypeGate(dtype=dtype, allowed=True, code=REFERENCE,
                         detail="16-bit KV is the reference")
    limit = policy.max_kv_quantization_kl
    scales = _scales_note(dtype, evidence, checkpoint_scheme)
    measured = evidence.find(dtype) if evidence is not None else None
    if measured is not None and evidence is not None and not evidence.random_weights:
        figures = (f"measured KL {measured.kl_mean:.2e} nats vs 16-bit KV{scales}, top-1 "
                   f"agreement {measured.top1_agreement:.1%}, worst layer "
                   f"{measured.attention_error_worst_layer} attention error "
                   f"{measured.attention_error_max:.1%} ({evidence.source})")
        if measured.kl_mean <= limit:
            return DtypeGate(dtype=dtype, allowed=True, code=ALLOWED_MEASURED,
                             detail=f"{figures}; within quality.maxKVQuantizationKL {limit:g}")
        return DtypeGate(dtype=dtype, allowed=False, code=EXCEEDS_KL,
                         detail=f"{figures}; exceeds quality.maxKVQuantizationKL {limit:g}")
    why = ("measured only on random weights (mechanics, not quality)"
           if measured is not None else "no KV-quality measurement for this model revision")
    if scales.startswith(_CALIBRATED):
        # The checkpoint's own evidence, said as such: calibrated scales keep fp8 from
        # dividing by 1.0, but only a measurement on this model verifies its quality.
        why = (f"by measurement ({why}); the checkpoint carries calibrated KV scales"
               f"{scales.removeprefix(_CALIBRATED)}")
    if policy.require_measurement:
        return DtypeGate(dtype=dtype, allowed=False, code=UNVERIFIED_REQUIRED,
                         detail=f"unverified: {why}; {policy.required_by} keeps it out "
                         "until a measurement exists")
    return DtypeGate(dtype=dtype, allowed=True, code=UNVERIFIED,
                     detail=f"unverified: {why}")


# Per-tensor dtypes: vLLM divides by a static k_scale/v_scale (the checkpoint's, else 1.0).
STATIC_SCALE_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4", "nvfp4_4over6"})
_CALIBRATED = " with the checkpoint's calibrated k/v scales"


def _scales_note(dtype: str, evidence: KVQualityEvidence | None,
                 checkpoint_scheme: str | None = None) -> str:
    """What makes per-tensor fp8 safe in vLLM 0.33.0 is calibrated scales in the checkpoint:
    it has no flag that computes them at start-up (``--calculate-kv-scales`` is gone), so
    without them it divides by 1.0 (kv_cache.py lines 125-129). The tensors a report counted
    win over the config's declaration (a declaration may promise scales a file lacks)."""
    if dtype not in STATIC_SCALE_DTYPES:
        return ""
    if evidence is None or evidence.checkpoint_kv_scales is None:
        if checkpoint_scheme is None:
            return ""
        return (f"{_CALIBRATED} (its config declares the KV scheme {checkpoint_scheme}; "
                "vLLM uses them instead of 1.0)")
    if evidence.checkpoint_kv_scales:
        return _CALIBRATED
    return (" at k_scale = v_scale = 1.0 (no calibrated KV scales in the checkpoint; vLLM "
            "0.33.0 computes none at start-up)")


def checkpoint_scheme(quantization: CheckpointQuantization | None, dtype: str) -> str | None:
    """The KV-cache scheme a checkpoint declares for ``dtype`` (its calibrated k/v scales are
    what vLLM uses for it), in words, for ``gate_one``; None for any other dtype."""
    if quantization is None or quantization.kv_cache_dtype is None:
        return None
    declared = quantization.kv_cache_dtype
    same = dtype == declared or SAME_LAYOUT.get(dtype) == declared
    return quantization.kv_cache_scheme if same else None


def gate(dtypes: Iterable[str], evidence: KVQualityEvidence | None,
         policy: KVQualityPolicy) -> dict[str, DtypeGate]:
    """A verdict for each dtype, in the order given."""
    return {d: gate_one(d, evidence, policy) for d in dtypes}


def allowed_dtypes(dtypes: Iterable[str], evidence: KVQualityEvidence | None,
                   policy: KVQualityPolicy) -> list[str]:
    """The filter: the given dtypes that the evidence and the policy allow, order kept."""
    return [d for d, g in gate(dtypes, evidence, policy).items() if g.allowed]


def evidence_from_report(report: Mapping[str, object], source: str) -> KVQualityEvidence:
    """A KV-quality report's JSON (``kvtune.quality.report``, compact or full) as evidence.
    Kept here, dict in, so the planner needs nothing from the torch side."""
    raw = report.get("measurements")
    rows = raw if isinstance(raw, list) else []
    checkpoint = report.get("checkpoint")
    calibrated = None
    if isinstance(checkpoint, dict):
        layers, with_scales = checkpoint.get("layers"), checkpoint.get("layers_with_scales")
        if isinstance(layers, int) and isinstance(with_scales, int) and layers > 0:
            calibrated = with_scales >= layers
    return KVQualityEvidence(
        source=source, random_weights=report.get("weights") == "random-init",
        checkpoint_kv_scales=calibrated,
        measurements=tuple(KVDtypeMeasurement(
            dtype=str(r["dtype"]), kl_mean=float(r["kl_mean"]),
            top1_agreement=float(r["top1_agreement"]),
            attention_error_max=float(r.get("attention_error_max", 0.0)),
            attention_error_worst_layer=int(r.get("attention_error_worst_layer", 0)))
            for r in rows if isinstance(r, dict)))
