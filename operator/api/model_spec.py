"""The spec's model, runtime, workload, SLO and KV-quality parts.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from kvtune.operator.api.durations import DURATION_PATTERN, parse_duration
from kvtune.operator.api.schema_base import WeightsDtype, WorkloadPreset, _Model, _rules
from kvtune.operator.api.spec_bounds import check_durations, duration_rules
from kvtune.tuner.facts.vllm_memory import supported_versions
from kvtune.tuner.kv_quality import DEFAULT_MAX_KV_QUANTIZATION_KL
from kvtune.tuner.planner.policy import KVPrecision


class ConfigMapRef(_Model):
    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
    key: str = Field(default="config.json", min_length=1, max_length=253)


class ModelConfigSource(_Model):
    """Where a model's Hugging Face ``config.json`` is, for models not in kvtune's catalog."""

    config_map_ref: ConfigMapRef


# A model id as vLLM takes it (a Hugging Face id, or a name with its config.json): never a
# flag ("--trust-remote-code" as a model name would be rendered as one), no whitespace.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9_.][A-Za-z0-9_.:@+/-]*$"
# An image reference (registry/path:tag@digest), as the container runtime parses it.
IMAGE_PATTERN = (r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
                 r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$")


class ModelSpec(_Model):
    name: str = Field(
        min_length=1, max_length=256, pattern=MODEL_NAME_PATTERN,
        description="Served model: a catalog id (Hugging Face id) or any id when config is set. "
                    "Letters, digits and _.:@+/- only, not starting with '-'.",
    )
    config: ModelConfigSource | None = None
    weights_dtype: WeightsDtype = Field(
        default="auto",
        description="Dtype of the checkpoint's weights; auto: the model's own (config.json).",
    )
    revision: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._/-]+$",
        description="The checkpoint revision (a commit or tag) the runtime serves; KV-quality "
                    "measurements are kept per revision. Unset: 'unpinned'.",
    )


class PodTemplateRef(_Model):
    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
    key: str = Field(default="pod.yaml.j2", min_length=1, max_length=253)


class PodTemplateSource(_Model):
    config_map_ref: PodTemplateRef
    sha256: str | None = Field(
        default=None, pattern=r"^[a-f0-9]{64}$",
        description="The SHA-256 (hex) of the template's text. Required when "
                    "spec.runtime.secrets names a Secret: the ConfigMap's writers are not "
                    "checked at admission, so the spec's writer pins what runs beside the "
                    "Secrets; a template with another digest is not rendered (InvalidSpec).")


# A Secret's name (a DNS subdomain), as spec.runtime.secrets lists it.
SecretName = Annotated[str, StringConstraints(
    min_length=1, max_length=253, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")]


class RuntimeSpec(_Model):
    image: str = Field(default="vllm/vllm-openai:v0.33.0", min_length=1, max_length=512,
                       pattern=IMAGE_PATTERN,
                       description="The vLLM image: registry/repository[:tag][@sha256:digest].")
    # The versions kvtune's memory model is calibrated for (tuner/facts/data/vllm_memory.json);
    # the API server refuses others at admission.
    vllm_version: str = Field(
        default="0.33.0", json_schema_extra={"enum": list(supported_versions())},
        description="The vLLM version the image runs: its memory accounting and defaults.",
    )
    pod_template: PodTemplateSource | None = Field(
        default=None,
        description="A ConfigMap whose key holds a Jinja2 pod template replacing kvtune's own.",
    )
    secrets: list[SecretName] = Field(
        default_factory=list, max_length=16,
        description="Secrets (in this namespace) the pod template may reference: a volume, env "
                    "secretKeyRef, envFrom or imagePullSecrets. The API server checks at "
                    "admission that whoever writes the spec may read each (the chart's "
                    "tenant-secrets policy); the chart's podPolicy.allowedSecrets must also "
                    "allow it. Any other Secret reference is refused (InvalidSpec).",
    )
    entrypoint: Literal["vllm", "kvtune"] = Field(
        default="vllm",
        description="vllm: the container runs `vllm serve` (any vLLM image). kvtune: it runs "
                    "kvtune's runtime entrypoint (`python3 -m kvtune.runtime`, in kvtune's "
                    "runtime images), which checks the GPU against the plan, sizes the memory "
                    "fraction to what is free, reports to the pod, then execs `vllm serve`.",
    )

    @model_validator(mode="after")
    def _calibrated_version(self) -> RuntimeSpec:
        if self.vllm_version not in supported_versions():
            raise ValueError(
                f"spec.runtime.vllmVersion={self.vllm_version!r}: kvtune is calibrated for "
                f"vLLM {', '.join(supported_versions())}; set one of them"
            )
        return self


class DeclaredTokens(_Model):
    """Declared quantiles of a length distribution, in tokens; missing ones come from the preset."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("!has(self.p95) || self.p50 <= self.p95", "p50 must not exceed p95"),
            ("!has(self.p99) || self.p50 <= self.p99", "p50 must not exceed p99"),
            ("!has(self.p95) || !has(self.p99) || self.p95 <= self.p99",
             "p95 must not exceed p99"),
            ("!has(self.max) || !has(self.p99) || self.p99 <= self.max",
             "p99 must not exceed max"),
        )
    )

    p50: int = Field(ge=1, le=10_000_000)
    p90: int | None = Field(default=None, ge=1, le=10_000_000)
    p95: int | None = Field(default=None, ge=1, le=10_000_000)
    p99: int | None = Field(default=None, ge=1, le=10_000_000)
    max: int | None = Field(default=None, ge=1, le=10_000_000)

    @model_validator(mode="after")
    def _monotone(self) -> DeclaredTokens:
        chain = [(n, v) for n, v in (("p50", self.p50), ("p90", self.p90), ("p95", self.p95),
                                     ("p99", self.p99), ("max", self.max)) if v is not None]
        for (lo_name, lo), (hi_name, hi) in itertools.pairwise(chain):
            if lo > hi:
                raise ValueError(f"{lo_name}={lo} exceeds {hi_name}={hi}; quantiles must grow")
        return self


class WorkloadSpec(_Model):
    profile: WorkloadPreset = Field(
        default="chat", description="The preset the declared figures refine."
    )
    context_tokens: DeclaredTokens | None = None
    output_tokens: DeclaredTokens | None = None
    shared_prefix_tokens: int | None = Field(default=None, ge=0, le=10_000_000)
    multi_turn: bool | None = None
    concurrent_sequences: int | None = Field(
        default=None, ge=1, le=100_000,
        description="Sequences per replica that must fit at the high-percentile context.",
    )
    request_rate_per_second: float | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Requests per second the deployment expects, all pools together: with it "
        "kvtune plans by the capacity search (simulated capacity at SLO) before it has observed "
        "any traffic; an observed rate replaces it.",
    )


class SLOSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        ("!has(self.ttftP95) || duration(self.ttftP95) > duration('0s')",
         "slo.ttftP95 must be above 0s; give the p95 time to first token, e.g. 2s"),
        ("!has(self.tpotP95) || duration(self.tpotP95) > duration('0s')",
         "slo.tpotP95 must be above 0s; give the p95 time per output token, e.g. 80ms"),
        *duration_rules("spec.slo", "ttftP95", "tpotP95"),
    ))

    ttft_p95: str | None = Field(default=None, pattern=DURATION_PATTERN, max_length=32)
    tpot_p95: str | None = Field(default=None, pattern=DURATION_PATTERN, max_length=32)

    @model_validator(mode="after")
    def _positive(self) -> SLOSpec:
        for name, text in (("ttftP95", self.ttft_p95), ("tpotP95", self.tpot_p95)):
            if text is not None and parse_duration(text, field=f"spec.slo.{name}") <= 0:
                raise ValueError(f"spec.slo.{name}={text!r} must be above 0s; give the p95 "
                                 f"target, e.g. 2s or 80ms")
        check_durations(self, "spec.slo", "ttft_p95", "tpot_p95")
        return self

    def ttft_p95_seconds(self) -> float | None:
        return None if self.ttft_p95 is None else parse_duration(
            self.ttft_p95, field="spec.slo.ttftP95")

    def tpot_p95_seconds(self) -> float | None:
        return None if self.tpot_p95 is None else parse_duration(
            self.tpot_p95, field="spec.slo.tpotP95")


class CalibrationSpec(_Model):
    """The KV-quality calibration Job (issue 15): measured before a narrower KV dtype first
    rolls out for a model revision."""

    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.quality.calibration", "timeout")))

    enabled: bool = Field(
        default=True,
        description="Measure narrower KV dtypes with a Job on the pool's GPU nodes before "
                    "they roll out. false: plan on the configured evidence alone.")
    image: str | None = Field(
        default=None, min_length=1, max_length=512,
        description="Image with kvtune, torch and transformers for the Job. Default: the "
                    "runtime image when runtime.entrypoint is kvtune (kvtune's runtime images "
                    "carry all three), else the chart's calibration.image (kvtune's runtime "
                    "image for the pool's GPU class).")
    timeout: str = Field(
        default="30m", pattern=DURATION_PATTERN, max_length=32,
        description="The Job's activeDeadlineSeconds; past it the Job fails and the wider "
                    "dtype stays.")
    max_prompt_tokens: int = Field(default=2048, ge=16, le=32768)

    @model_validator(mode="after")
    def _bounded(self) -> CalibrationSpec:
        check_durations(self, "spec.quality.calibration", "timeout")
        return self

    def timeout_seconds(self) -> int:
        return max(1, int(parse_duration(self.timeout, field="spec.quality.calibration.timeout")))


class QualitySpec(_Model):
    lowest_kv_precision: KVPrecision = Field(default="fp8", alias="lowestKVPrecision")
    max_kv_quantization_kl: float = Field(
        default=DEFAULT_MAX_KV_QUANTIZATION_KL, gt=0.0, le=10.0, alias="maxKVQuantizationKL",
        description="Exclude KV dtypes whose measured mean next-token KL divergence against "
                    "16-bit KV (nats, over kvtune's calibration prompts) exceeds this.")
    require_measurement: bool = Field(
        default=False,
        description="Keep 16-bit KV until a measurement for this model revision allows a "
                    "narrower dtype.")
    accept_unverified: bool = Field(
        default=False, alias="acceptUnverified",
        description="Roll out a narrower KV dtype that no measurement covers where none can "
                    "be made (calibration disabled, no calibration image, or calibration Jobs "
                    "not allowed in the namespace). Off: the wider dtype stays and "
                    "status.kvQuality says why.")
    calibration: CalibrationSpec = CalibrationSpec()
