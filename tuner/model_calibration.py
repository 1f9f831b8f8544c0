"""The closed loop's correction terms: what one cluster observed of one model against what
kvtune predicted, as plain data the planner takes in (``PlanRequest.calibration``).

Not the KV-quality calibration (``kv_quality.py``, the quality Job): this one corrects the
planner's memory and step-time models from what vLLM itself reported (docs/calibration-loop.md).

One ``ModelCalibration`` per key: model x GPU class x vLLM version x layout (``TP2``,
``DP8+EP``). It holds three factors:

- ``kv_tokens_scale``: observed KV blocks (``vllm:cache_config_info``'s ``num_gpu_blocks``) over
  the blocks kvtune predicted; the planner multiplies the KV budget by it.
- ``prefill_efficiency`` and ``decode_efficiency``: predicted over observed prefill time per
  request (``vllm:request_prefill_time_seconds``) and inter-token latency
  (``vllm:inter_token_latency_seconds``); the planner divides its prefill and decode step
  times by them (0.77: steps take 1.3x what the model says).

``fit`` is a multiplicative update: the predictions were made with the current factors, so
the new factor is the old one times observed over predicted; each factor is bounded and moves
only on enough evidence. ``drift`` says which figures part from their prediction by more than
a margin. Pure: no I/O, no clock (the caller passes the time as a string).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

# The bounds of every factor: a model off by more than 2x is a bug to fix, not to calibrate.
FACTOR_MIN = 0.5
FACTOR_MAX = 2.0
# Evidence before a factor moves: one runtime's KV size (vLLM sizes it once, at start-up);
# prefill: requests finished in the window; decode: output tokens (inter-token gaps).
MIN_KV_REPORTS = 1
MIN_PREFILL_REQUESTS = 50
MIN_DECODE_TOKENS = 2000
# The default margin of CalibrationDrift (the chart's retune.calibrationDriftMargin).
DEFAULT_DRIFT_MARGIN = 0.1


class CalibrationKey(BaseModel):
    """What one calibration holds for: a model on a GPU class, a vLLM version, a layout."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    gpu_class: str
    vllm_version: str
    layout: str = "TP1"

    @property
    def text(self) -> str:
        """``meta-llama/Llama-3.1-8B-Instruct@H100/vllm-0.33.0/TP1``."""
        return f"{self.model}@{self.gpu_class}/vllm-{self.vllm_version}/{self.layout}"


class ModelCalibration(BaseModel):
    """The correction terms of one key, and the evidence they rest on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: CalibrationKey
    kv_tokens_scale: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    prefill_efficiency: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    decode_efficiency: float = Field(default=1.0, ge=FACTOR_MIN, le=FACTOR_MAX)
    # Evidence behind each factor, summed over every update (0: the factor is the default).
    kv_reports: int = Field(default=0, ge=0)
    prefill_requests: int = Field(default=0, ge=0)
    decode_tokens: int = Field(default=0, ge=0)
    updates: int = Field(default=0, ge=0)
    updated_at: str | None = None

    @property
    def prefill_time_scale(self) -> float:
        """What the planner multiplies its prefill time by."""
        return 1.0 / self.prefill_efficiency

    @property
    def decode_time_scale(self) -> float:
        """What the planner multiplies its decode step time by."""
        return 1.0 / self.decode_efficiency


class CalibrationObservation(BaseModel):
    """One window of one pool: each figure as predicted (with the calibration the plan was
    made with) and as observed, with its evidence. None: not observed this window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    predicted_kv_blocks: int | None = None
    observed_kv_blocks: int | None = None
    kv_reports: int = 0
    predicted_prefill_seconds: float | None = None
    observed_prefill_seconds: float | None = None
    prefill_requests: int = 0
    predicted_decode_seconds: float | None = None
    observed_decode_seconds: float | None = None
    decode_tokens: int = 0


class DriftFinding(BaseModel):
    """One figure that parts from its prediction by more than the margin."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    figure: str  # "kv_blocks" | "prefill_seconds" | "decode_seconds"
    predicted: float
    observed: float

    @property
    def ratio(self) -> float:
        return self.observed / self.predicted

    @property
    def message(self) -> str:
        return (f"{self.figure}: observed {self.observed:.4g}, predicted {self.predicted:.4g} "
                f"({self.ratio:.2f}x)")


def _bounded(value: float) -> float:
    return min(FACTOR_MAX, max(FACTOR_MIN, value))


def _pairs(obs: CalibrationObservation) -> list[tuple[str, float | None, float | None, bool]]:
    """(figure, predicted, observed, enough evidence) of each figure."""
    return [
        ("kv_blocks", obs.predicted_kv_blocks, obs.observed_kv_blocks,
         obs.kv_reports >= MIN_KV_REPORTS),
        ("prefill_seconds", obs.predicted_prefill_seconds, obs.observed_prefill_seconds,
         obs.prefill_requests >= MIN_PREFILL_REQUESTS),
        ("decode_seconds", obs.predicted_decode_seconds, obs.observed_decode_seconds,
         obs.decode_tokens >= MIN_DECODE_TOKENS),
    ]


def _ratio(predicted: float | None, observed: float | None, enough: bool) -> float | None:
    """observed / predicted when both are known, positive and the evidence is enough."""
    if not enough or predicted is None or observed is None or predicted <= 0 or observed <= 0:
        return None
    return observed / predicted


def fit(previous: ModelCalibration, obs: CalibrationObservation,
        now: str | None = None, dead_band: float = 0.0) -> ModelCalibration:
    """``previous`` updated by one window (module doc). A figure without enough evidence,
    or within ``dead_band`` of its prediction (the operator: half the drift margin, so noise
    never re-plans), leaves its factor alone; with none to move, ``previous`` is returned."""
    kv, prefill, decode = (
        r if r is not None and abs(r - 1.0) > dead_band else None
        for r in (_ratio(p, o, e) for _, p, o, e in _pairs(obs)))
    if kv is None and prefill is None and decode is None:
        return previous
    update: dict[str, object] = {"updates": previous.updates + 1, "updated_at": now}
    if kv is not None:
        # More blocks than predicted: scale the KV budget up by the same share.
        update["kv_tokens_scale"] = _bounded(previous.kv_tokens_scale * kv)
        update["kv_reports"] = previous.kv_reports + obs.kv_reports
    if prefill is not None:
        # Slower than predicted (ratio > 1): a lower efficiency.
        update["prefill_efficiency"] = _bounded(previous.prefill_efficiency / prefill)
        update["prefill_requests"] = previous.prefill_requests + obs.prefill_requests
    if decode is not None:
        update["decode_efficiency"] = _bounded(previous.decode_efficiency / decode)
        update["decode_tokens"] = previous.decode_tokens + obs.decode_tokens
    return previous.model_copy(update=update)


def ratios(obs: CalibrationObservation) -> dict[str, float]:
    """Observed over predicted of each figure known on both sides with enough evidence."""
    return {figure: r for figure, p, o, e in _pairs(obs) if (r := _ratio(p, o, e)) is not None}


def drift(obs: CalibrationObservation, margin: float = DEFAULT_DRIFT_MARGIN
          ) -> list[DriftFinding]:
    """The figures with enough evidence whose observation parts from the prediction by more
    than ``margin`` (a share: 0.1 is 10 %)."""
    out = []
    for figure, predicted, observed, enough in _pairs(obs):
        ratio = _ratio(predicted, observed, enough)
        if ratio is not None and abs(ratio - 1.0) > margin:
            assert predicted is not None and observed is not None
            out.append(DriftFinding(figure=figure, predicted=predicted, observed=observed))
    return out


def find(calibrations: Sequence[ModelCalibration], key: CalibrationKey
         ) -> ModelCalibration | None:
    """The calibration of ``key`` among ``calibrations`` (None: none yet)."""
    return next((c for c in calibrations if c.key == key), None)


def replace(calibrations: Sequence[ModelCalibration], new: ModelCalibration
            ) -> list[ModelCalibration]:
    """``calibrations`` with ``new`` in place of the one of its key (or added), sorted."""
    rest = [c for c in calibrations if c.key != new.key]
    return sorted([*rest, new], key=lambda c: c.key.text)


class CalibrationSet(BaseModel):
    """What the ConfigMap and ``kvtune plan --calibration FILE`` hold: every key's terms."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    calibrations: tuple[ModelCalibration, ...] = ()


# The key of the operator's ConfigMap (``kvtune-model-calibration``) that holds the set as
# JSON; ``kvtune plan --calibration`` reads the same text, or the whole ConfigMap.
CONFIG_MAP_KEY = "calibrations.json"


def set_from_document(doc: object) -> CalibrationSet:
    """A ``CalibrationSet`` from a parsed file: the set itself, or a ConfigMap (``kubectl get
    configmap kvtune-model-calibration -o yaml``) whose data holds it. Raises ValueError."""
    if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
        text = doc["data"].get(CONFIG_MAP_KEY)
        if not isinstance(text, str):
            raise ValueError(f"the ConfigMap has no data key {CONFIG_MAP_KEY}")
        return CalibrationSet.model_validate_json(text)
    return CalibrationSet.model_validate(doc)
