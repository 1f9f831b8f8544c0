"""The InferenceDeployment API (``kvtune.io/v1alpha1``): spec and status as pydantic models.

These types are the one source of the CRD: ``crdgen`` turns them into the openAPIV3Schema in
``crds/``. Field names are snake_case here and camelCase in YAML (aliases). Rules the API
server can check itself (cross-field, valid pins) are written twice: as CEL
(``x-kubernetes-validations`` in ``json_schema_extra``, enforced at admission) and as pydantic
validators (so the operator never trusts an object that bypassed the CRD, e.g. an older CRD).
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kvtune.operator.api.durations import DURATION_PATTERN, parse_duration
from kvtune.operator.api.spec_bounds import (
    LabelValue,
    check_durations,
    check_labels,
    duration_rules,
    label_rules,
)
from kvtune.tuner.facts.capabilities import PINNED_VLLM_VERSION, get_runtime
from kvtune.tuner.facts.vllm_memory import supported_versions
from kvtune.tuner.facts.weights import WEIGHTS_DTYPES
from kvtune.tuner.knobs import KNOBS, PINNABLE, camel_name
from kvtune.tuner.kv_quality import DEFAULT_MAX_KV_QUANTIZATION_KL
from kvtune.tuner.planner.kv_dtype_options import PRECISION_FLOOR_BITS
from kvtune.tuner.planner.policy import KVPrecision, Pins

GROUP = "kvtune.io"
VERSION = "v1alpha1"
KIND = "InferenceDeployment"
PLURAL = "inferencedeployments"
SINGULAR = "inferencedeployment"
SHORT_NAMES = ["infd"]

# vLLM 0.33.0's ``CacheDType`` literal (vllm/config/cache.py). A contract test
# (tests/operator/test_op_vllm_contract.py) fails if the pinned wheel's literal differs.
# What the pinned vLLM accepts, from the tuner's one copy of those facts
# (tuner/facts/data/vllm-<v>.json, checked against the wheel's source).
_RUNTIME = get_runtime(PINNED_VLLM_VERSION)
VLLM_KV_CACHE_DTYPES: tuple[str, ...] = tuple(_RUNTIME.kv_cache_dtype_names)
VLLM_ATTENTION_BACKENDS: tuple[str, ...] = tuple(b.name for b in _RUNTIME.backends)
# Bits per element of the narrowest part of each KV dtype ("auto" is the model's 16 bits).
KV_DTYPE_BITS: dict[str, int] = {n: _RUNTIME.dtype(n).bits for n in VLLM_KV_CACHE_DTYPES}

Mode = Literal["auto", "recommend", "off"]
WorkloadPreset = Literal["chat", "rag", "agent", "multi-tenant", "long-context"]
KVCacheDtype = Literal[VLLM_KV_CACHE_DTYPES]  # type: ignore[valid-type]
AttentionBackend = Literal[VLLM_ATTENTION_BACKENDS]  # type: ignore[valid-type]
WeightsDtype = Literal[WEIGHTS_DTYPES]  # type: ignore[valid-type]

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# The InferenceDeployment's own name: it becomes label values (at most 63 characters) and the
# start of Service names (DNS-1035 labels: a letter first, no dots).
OBJECT_NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
OBJECT_NAME_RULE = ("metadata.name must be at most 63 characters of a-z, 0-9 and '-', starting "
                    "with a letter: it names the Services and labels kvtune creates; rename the "
                    "InferenceDeployment")
_CEL = "x-kubernetes-validations"


def _rules(*rules: tuple[str, str]) -> dict[str, Any]:
    return {_CEL: [{"rule": rule, "message": message} for rule, message in rules]}


def _knob_docs(extra: dict[str, Any]) -> Any:
    """A json_schema_extra that also describes each knob property from the knob table
    (``kvtune.tuner.knobs``: its doc line, unit and vLLM flag)."""

    def apply(schema: dict[str, Any]) -> None:
        schema.update(extra)
        for knob in KNOBS:
            prop = schema.get("properties", {}).get(camel_name(knob))
            if prop is not None and "description" not in prop:
                unit = f" ({knob.unit})" if knob.unit and knob.unit != "fraction" else ""
                prop["description"] = f"{knob.doc}{unit}; vLLM --{knob.flag}"
    return apply


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


# --- spec -----------------------------------------------------------------------------------


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


_POOL_KEY = "(has({v}.name) ? {v}.name : {v}.gpuClass.lowerAscii())"


class Toleration(_Model):
    key: str | None = Field(default=None, max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0, le=31_536_000)  # a year


_QUANTITY = r"^[0-9]+(\.[0-9]+)?\s*[A-Za-z/]+$"


class CustomGPUSpec(_Model):
    """A GPU kvtune has no data for, declared by its facts; label its nodes
    ``kvtune.io/gpu-class: <gpuClass>``."""

    memory: str = Field(pattern=_QUANTITY, max_length=32, description=(
        "Memory as the CUDA runtime reports it (torch.cuda.mem_get_info total), e.g. 47.4GiB."))
    bandwidth: str = Field(pattern=_QUANTITY, max_length=32,
                           description="Memory bandwidth, e.g. 960GB/s or 3.35TB/s.")
    bf16: str = Field(pattern=_QUANTITY, max_length=32,
                      description="Dense BF16 tensor FLOPs, e.g. 364TFLOPS.")
    fp8: str | None = Field(default=None, pattern=_QUANTITY, max_length=32,
                            description="Dense FP8 tensor FLOPs (compute capability 8.9+).")
    compute_capability: str = Field(pattern=r"^[0-9]+\.[0-9]$", max_length=8,
                                    description="e.g. 8.9 (nvidia-smi --query-gpu=compute_cap).")

    def declaration(self, name: str) -> str:
        """The tuner's custom-GPU declaration (``tuner.gpus.parse_gpu_spec``)."""
        fp8 = f",fp8={self.fp8}" if self.fp8 else ""
        return (f"{name}:memory={self.memory},bandwidth={self.bandwidth},bf16={self.bf16}"
                f"{fp8},cc={self.compute_capability}")


# spec.pools[].tensorParallel: GPUs per replica, or "auto" (kvtune chooses the degree and the
# replicas, tuner/planner/tp_choice.py). An int-or-string in the CRD (pydantic's mixed enum has
# no structural form), checked there by CEL and here by the Literal.
_TP_VALUES = "1, 2, 4, 8 or auto"
TensorParallel = Annotated[Literal[1, 2, 4, 8, "auto"], WithJsonSchema({
    "x-kubernetes-int-or-string": True, "default": 1,
    "description": "GPUs per replica (tensor parallel): 1, 2, 4 or 8; auto: kvtune chooses the "
                   "degree and the replicas for the lowest cost per good request, with "
                   "replicas as the most it may run.",
    _CEL: [{"rule": "type(self) == string ? self == 'auto' : self in [1, 2, 4, 8]",
            "message": f"tensorParallel must be {_TP_VALUES}; set one of them"}]})]


class PoolSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        (f"!{_POOL_KEY.format(v='self')}.endsWith('-canary')",
         "a pool name must not end in -canary (kvtune names the canary Deployment of pool "
         "<p> <name>-<p>-canary); set pools[].name"),
        *label_rules("spec.pools[]", "nodeSelector", reserved=False),
    ))

    gpu_class: str = Field(
        min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="kvtune GPU class, e.g. H100, H200, B200, L4; or the name of a customGpu.",
    )
    custom_gpu: CustomGPUSpec | None = Field(
        default=None, description="Declares gpuClass as a GPU kvtune has no data for.")
    name: str | None = Field(
        default=None, min_length=1, max_length=20, pattern=_DNS_LABEL,
        description="Pool name in object names; defaults to the lower-cased GPU class.",
    )
    replicas: int = Field(default=1, ge=0, le=512)
    tensor_parallel: TensorParallel = 1
    gpu_price_usd_per_hour: float | None = Field(
        default=None, gt=0, le=100_000,
        description="What one GPU of this pool costs per hour, in USD, for the cost figures in "
        "status (overrides the chart's gpuPrices and kvtune's list prices).")
    node_selector: dict[str, LabelValue] | None = Field(default=None, max_length=16)
    tolerations: list[Toleration] | None = Field(default=None, max_length=16)

    @property
    def pool_name(self) -> str:
        return self.name or self.gpu_class.lower().replace("_", "-")

    @property
    def tp_auto(self) -> bool:
        """``tensorParallel: auto``: the degree and replicas are planned (up to ``replicas``)."""
        return self.tensor_parallel == "auto"

    @property
    def gpu_declaration(self) -> str:
        """What ``tuner.gpus.get_gpu_class`` takes: the class name, or its custom declaration."""
        return self.custom_gpu.declaration(self.gpu_class) if self.custom_gpu else self.gpu_class

    @model_validator(mode="after")
    def _not_a_canary_name(self) -> PoolSpec:
        if self.pool_name.endswith("-canary"):
            raise ValueError(f"pool name {self.pool_name!r} ends in -canary, the suffix of "
                             f"kvtune's canary Deployments; set pools[].name")
        check_labels(self.node_selector, "spec.pools[].nodeSelector", reserved=False)
        return self


_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
PoolSelectorKind = Literal["pod", "labels", "none"]


class PrometheusSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.tuning.prometheus", "window")))

    url: str = Field(min_length=1, max_length=512, pattern=r"^https?://")
    window: str = Field(default="6h", pattern=DURATION_PATTERN, max_length=32)
    pool_selector: PoolSelectorKind = Field(
        default="pod",
        description="How a pool's series are found. pod: namespaceLabel=<namespace>, "
                    "podLabel=~<name>-<pool>-<rs>-<pod> (Kubernetes service discovery's "
                    "target labels); labels: the pod labels kvtune.io/deployment and "
                    "kvtune.io/pool copied onto the series (deploymentLabel, poolLabel); "
                    "none: every pool is planned on the deployment-wide profile "
                    "(model_name).",
    )
    namespace_label: str = Field(default="namespace", pattern=_LABEL_NAME, max_length=128)
    pod_label: str = Field(default="pod", pattern=_LABEL_NAME, max_length=128)
    deployment_label: str = Field(default="kvtune_io_deployment", pattern=_LABEL_NAME,
                                  max_length=128)
    pool_label: str = Field(default="kvtune_io_pool", pattern=_LABEL_NAME, max_length=128)

    @model_validator(mode="after")
    def _bounded(self) -> PrometheusSpec:
        check_durations(self, "spec.tuning.prometheus", "window")
        return self

    def window_seconds(self) -> float:
        return parse_duration(self.window, field="spec.tuning.prometheus.window")


class RetuneSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.tuning.retune", "minInterval", "dwell")))

    min_interval: str = Field(default="6h", pattern=DURATION_PATTERN, max_length=32)
    drift_threshold: float = Field(default=0.2, gt=0.0, le=1.0)
    dwell: str | None = Field(
        default=None, pattern=DURATION_PATTERN, max_length=32,
        description="How long a drift must persist, with the new traffic holding still, "
                    "before the pool is planned again. Default: tuning.prometheus.window. "
                    "At least the window: a shift fills the window only after one window, "
                    "and a shorter dwell would plan for a mix of old and new traffic.",
    )

    @model_validator(mode="after")
    def _bounded(self) -> RetuneSpec:
        check_durations(self, "spec.tuning.retune", "min_interval", "dwell")
        return self

    def dwell_seconds(self, window_seconds: float) -> float:
        """The dwell time; the window when the spec leaves it out."""
        if self.dwell is None:
            return window_seconds
        return parse_duration(self.dwell, field="spec.tuning.retune.dwell")


class PinSpec(_Model):
    """Knobs a human wants fixed (vLLM's flags, camelCase)."""

    model_config = ConfigDict(
        json_schema_extra=_knob_docs(_rules(
            ("!has(self.blockSize) || self.blockSize % 16 == 0",
             "blockSize must be a multiple of 16 (vLLM's attention backends need it); "
             "use 16, 32, 64 or 128"),
            ("!(has(self.gpuMemoryUtilization) && has(self.kvCacheMemoryBytes))",
             "pin gpuMemoryUtilization or kvCacheMemoryBytes, not both: vLLM ignores the "
             "fraction when the bytes are set"),
        ))
    )

    block_size: int | None = Field(default=None, ge=16, le=1024)
    kv_cache_dtype: KVCacheDtype | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1, le=2**40)  # 1 TiB a GPU
    max_model_len: int | None = Field(default=None, ge=1, le=10_000_000)
    max_num_seqs: int | None = Field(default=None, ge=1, le=100_000)
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    enable_prefix_caching: bool | None = None
    kv_offloading_size_gib: float | None = Field(
        default=None, ge=0.0, le=65536.0, alias="kvOffloadingSizeGiB"
    )
    attention_backend: AttentionBackend | None = None

    @model_validator(mode="after")
    def _valid(self) -> PinSpec:
        if self.block_size is not None and self.block_size % 16:
            raise ValueError(
                f"spec.tuning.pin.blockSize={self.block_size} is not a multiple of 16; "
                f"use 16, 32, 64 or 128"
            )
        if self.gpu_memory_utilization is not None and self.kv_cache_memory_bytes is not None:
            raise ValueError("pin gpuMemoryUtilization or kvCacheMemoryBytes, not both")
        return self

    def to_pins(self) -> Pins:
        """The planner's pins: every pinnable knob of the table (``kvtune.tuner.knobs``)."""
        return Pins(**{k.name: getattr(self, k.name) for k in PINNABLE})


_DWELL_RULE = (
    "!has(self.retune) || !has(self.retune.dwell) || !has(self.prometheus) || "
    "duration(self.retune.dwell) >= "
    "duration(has(self.prometheus.window) ? self.prometheus.window : '6h')",
    "tuning.retune.dwell must be at least tuning.prometheus.window: a traffic shift fills "
    "the window only after one window; raise dwell or shorten the window",
)


class TuningSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(_DWELL_RULE))

    mode: Mode = Field(
        default="auto",
        description="auto: apply plans; recommend: write plans to status only; off: hands off.",
    )
    prometheus: PrometheusSpec | None = None
    retune: RetuneSpec | None = None
    pin: PinSpec | None = None
    cpu_offload_gib: float = Field(
        default=0.0, ge=0.0, le=65536.0, alias="cpuOffloadGiB",
        description="CPU memory per GPU (GiB) that may hold offloaded KV blocks; kvtune turns "
                    "KV offloading on when blocks are read back and this is at least 1 GiB. "
                    "0: no KV offload (as `kvtune plan --cpu-offload-gib`).",
    )

    @model_validator(mode="after")
    def _dwell_covers_the_window(self) -> TuningSpec:
        if self.retune is None or self.retune.dwell is None or self.prometheus is None:
            return self
        window = self.prometheus.window_seconds()
        dwell = self.retune.dwell_seconds(window)
        if dwell < window:
            raise ValueError(
                f"spec.tuning.retune.dwell={self.retune.dwell!r} ({dwell:g}s) is shorter "
                f"than spec.tuning.prometheus.window={self.prometheus.window!r} "
                f"({window:g}s): a traffic shift fills the window only after one window; "
                f"raise dwell or shorten the window"
            )
        return self


class RolloutSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.rollout", "analysis", "progressDeadline")))

    canary_replicas: int = Field(default=0, ge=0, le=512)
    analysis: str = Field(default="10m", pattern=DURATION_PATTERN, max_length=32)
    progress_deadline: str = Field(
        default="30m", pattern=DURATION_PATTERN, max_length=32,
        description="A pool whose new pods are not ready by then is Degraded/RolloutStuck "
                    "(the Deployment's progressDeadlineSeconds; loading a large model takes "
                    "minutes).",
    )

    min_requests: int = Field(
        default=100, ge=1, le=10_000_000,
        description="Finished requests each revision (canary and stable) needs in the analysis "
                    "window before the canary is judged on TTFT/TPOT attainment, preemptions "
                    "and queue length from vLLM's histograms (spec.tuning.prometheus).",
    )
    on_inconclusive: Literal["promote", "rollback"] = Field(
        default="promote",
        description="What a canary that stayed available but never reached minRequests in "
                    "analysis + progressDeadline becomes: promote (availability held, no "
                    "evidence against it; said in status and an Event) or rollback.",
    )

    @model_validator(mode="after")
    def _bounded(self) -> RolloutSpec:
        check_durations(self, "spec.rollout", "analysis", "progress_deadline")
        return self

    def progress_deadline_seconds(self) -> int:
        seconds = parse_duration(self.progress_deadline, field="spec.rollout.progressDeadline")
        return max(1, round(seconds))


HEADER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class GatewayRef(_Model):
    """The Gateway API Gateway the InferenceDeployment's HTTPRoute attaches to."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
    namespace: str | None = Field(default=None, max_length=63, pattern=_DNS_LABEL, description=(
        "The Gateway's namespace; empty: the InferenceDeployment's (a Gateway elsewhere must "
        "allow routes from this namespace in its listener's allowedRoutes)."))
    section_name: str | None = Field(default=None, max_length=253, pattern=_DNS_LABEL,
                                     description="One listener of the Gateway, by name.")


class RoutingSpec(_Model):
    enabled: bool = Field(
        default=False,
        description="Render each pool's Gateway API Inference Extension objects: an "
                    "InferencePool (inference.networking.k8s.io/v1), its endpoint picker's "
                    "configuration, whose prefix-cache scorer hashes in the plan's block size, "
                    "and the endpoint picker's Deployment and Service. Needs the operator's "
                    "routing.enabled chart value (the cluster has the Inference Extension's "
                    "CRDs).",
    )
    gateway: GatewayRef | None = Field(default=None, description=(
        "Also render an HTTPRoute (gateway.networking.k8s.io/v1) named like the "
        "InferenceDeployment, attached to this Gateway, whose backends are the pools' "
        "InferencePools, weighted by replicas."))
    session_header: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=HEADER_NAME_PATTERN, description=(
            "Multi-turn traffic: the request header that names a session (e.g. "
            "x-session-id). The HTTPRoute's rules then carry sessionPersistence of type Header "
            "with this name (Gateway API's experimental channel; Extended support), so a "
            "gateway that implements it keeps a session on one pool. Within a pool, the "
            "endpoint picker keeps multi-turn traffic on the pods holding its prefix."))
    length_header: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=HEADER_NAME_PATTERN, description=(
            "A request header that states the prompt's length in tokens, set by the client "
            "or a gateway transform (nothing in Gateway API or the Inference Extension v1.5.0 "
            "counts a prompt's tokens). The HTTPRoute then sends a request longer than a "
            "pool's max-model-len to the shortest pools that hold it (a RegularExpression "
            "header match); requests without it go to every pool."))

    @model_validator(mode="after")
    def _route_needs_a_gateway(self) -> RoutingSpec:
        if self.gateway is not None and not self.enabled:
            raise ValueError("spec.routing.gateway is set but spec.routing.enabled=false: the "
                             "HTTPRoute's backends are the InferencePools routing renders; "
                             "set enabled: true or remove gateway")
        for field, value in (("sessionHeader", self.session_header),
                             ("lengthHeader", self.length_header)):
            if value is not None and self.gateway is None:
                raise ValueError(f"spec.routing.{field}={value!r} acts in the HTTPRoute, "
                                 f"which needs spec.routing.gateway: name the Gateway, or "
                                 f"remove {field}")
        return self


_LABELS_DESCRIPTION = ("Extra labels, e.g. the `release` label your Prometheus selects on "
                       "(kube-prometheus-stack: release=<its release name>).")


class ScrapeSpec(_Model):
    """How the Prometheus operator scrapes the pools' vLLM pods (it ignores the
    prometheus.io annotations a stock Prometheus reads)."""

    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.monitoring.scrape", "interval"),
        *label_rules("spec.monitoring.scrape", "labels", reserved=True)))

    enabled: bool = Field(default=True, description=(
        "Render a PodMonitor (or ServiceMonitor) per pool; applied where the cluster serves "
        "monitoring.coreos.com, deleted when switched off."))
    kind: Literal["PodMonitor", "ServiceMonitor"] = Field(
        default="PodMonitor",
        description="PodMonitor selects the pool's pods; ServiceMonitor its Service.")
    interval: str | None = Field(default=None, pattern=DURATION_PATTERN, max_length=32,
                                 description="Scrape interval; empty: Prometheus's own.")
    labels: dict[str, LabelValue] | None = Field(default=None, max_length=16,
                                                 description=_LABELS_DESCRIPTION)

    @model_validator(mode="after")
    def _bounded(self) -> ScrapeSpec:
        check_durations(self, "spec.monitoring.scrape", "interval")
        check_labels(self.labels, "spec.monitoring.scrape.labels", reserved=True)
        return self


class PrometheusRuleSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        *label_rules("spec.monitoring.prometheusRule", "labels", reserved=True)))

    enabled: bool = Field(default=True, description=(
        "Render this deployment's KV-cache and SLO alerts as a PrometheusRule (the one source "
        "of kvtune's alert rules); deleted when switched off."))
    labels: dict[str, LabelValue] | None = Field(
        default=None, max_length=16,
        description="Extra labels for the Prometheus ruleSelector (kube-prometheus-stack: "
                    "release=<its release name>).")

    @model_validator(mode="after")
    def _bounded(self) -> PrometheusRuleSpec:
        check_labels(self.labels, "spec.monitoring.prometheusRule.labels", reserved=True)
        return self


class MonitoringSpec(_Model):
    scrape: ScrapeSpec = ScrapeSpec()
    prometheus_rule: PrometheusRuleSpec = PrometheusRuleSpec()


def _pin_floor_rule() -> tuple[str, str]:
    """CEL: a pinned KV dtype must not be narrower than quality.lowestKVPrecision."""
    clauses = []
    for floor, floor_bits in PRECISION_FLOOR_BITS.items():
        narrower = [d for d, bits in KV_DTYPE_BITS.items() if bits < floor_bits]
        if narrower:
            listed = ", ".join(f"'{d}'" for d in narrower)
            clauses.append(f"!(self.quality.lowestKVPrecision == '{floor}' && "
                           f"self.tuning.pin.kvCacheDtype in [{listed}])")
    guard = ("!has(self.quality) || !has(self.quality.lowestKVPrecision) || "
             "!has(self.tuning) || !has(self.tuning.pin) || !has(self.tuning.pin.kvCacheDtype)")
    return (f"{guard} || ({' && '.join(clauses)})",
            "tuning.pin.kvCacheDtype is narrower than quality.lowestKVPrecision; "
            "pin a wider dtype or lower the floor")


class InferenceDeploymentSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("!has(self.rollout) || self.pools.all(p, p.replicas >= self.rollout.canaryReplicas)",
             "every pool's replicas must be >= rollout.canaryReplicas; raise the replicas or "
             "lower canaryReplicas"),
            (f"self.pools.all(p, self.pools.exists_one(q, {_POOL_KEY.format(v='q')} == "
             f"{_POOL_KEY.format(v='p')}))",
             "pool names must be unique; give pools of the same gpuClass distinct names"),
            _pin_floor_rule(),
            ("!has(self.tuning) || !has(self.tuning.pin) || !has(self.tuning.pin.maxModelLen) "
             "|| !has(self.workload) || !has(self.workload.contextTokens) || "
             "!has(self.workload.contextTokens.max) || "
             "self.tuning.pin.maxModelLen >= self.workload.contextTokens.max",
             "tuning.pin.maxModelLen is below workload.contextTokens.max: vLLM would refuse "
             "the longest requests the spec promises; raise the pin or lower the max"),
        )
    )

    model: ModelSpec
    runtime: RuntimeSpec = RuntimeSpec()
    workload: WorkloadSpec = WorkloadSpec()
    slo: SLOSpec | None = None
    quality: QualitySpec | None = None
    pools: list[PoolSpec] = Field(min_length=1, max_length=8)
    tuning: TuningSpec = TuningSpec()
    rollout: RolloutSpec | None = None
    monitoring: MonitoringSpec = MonitoringSpec()
    routing: RoutingSpec = RoutingSpec()

    @model_validator(mode="after")
    def _cross_field(self) -> InferenceDeploymentSpec:
        if self.rollout is not None:
            for i, pool in enumerate(self.pools):
                if pool.replicas < self.rollout.canary_replicas:
                    raise ValueError(
                        f"spec.pools[{i}].replicas={pool.replicas} is below "
                        f"spec.rollout.canaryReplicas={self.rollout.canary_replicas}; raise "
                        f"the replicas or lower canaryReplicas"
                    )
        names = [p.pool_name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"spec.pools: pool name(s) {dupes} used twice; give each pool a distinct name"
            )
        pin = self.tuning.pin
        ctx_max = self.workload.context_tokens.max if self.workload.context_tokens else None
        if pin is not None and pin.max_model_len is not None and ctx_max is not None \
                and pin.max_model_len < ctx_max:
            raise ValueError(
                f"spec.tuning.pin.maxModelLen={pin.max_model_len} is below "
                f"spec.workload.contextTokens.max={ctx_max}: vLLM would refuse the longest "
                f"requests the spec promises; raise the pin or lower the max")
        if pin is not None and pin.kv_cache_dtype is not None:
            floor = self.quality.lowest_kv_precision if self.quality else "fp8"
            if KV_DTYPE_BITS[pin.kv_cache_dtype] < PRECISION_FLOOR_BITS[floor]:
                raise ValueError(
                    f"spec.tuning.pin.kvCacheDtype={pin.kv_cache_dtype!r} is narrower than "
                    f"spec.quality.lowestKVPrecision={floor!r}; pin a wider dtype or lower "
                    f"the floor"
                )
        return self

    @property
    def mode(self) -> Mode:
        return self.tuning.mode


# --- status ---------------------------------------------------------------------------------


class _Status(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class Condition(_Status):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class PlanStatus(_Status):
    """The knobs of a pool's plan, named as vLLM's flags (camelCase)."""

    model_config = ConfigDict(json_schema_extra=_knob_docs({}))

    block_size: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None = None
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    kv_offloading_size_gib: float | None = Field(default=None, alias="kvOffloadingSizeGiB")
    kv_offloading_backend: str | None = None
    attention_backend: str | None = None
    # What the weights dtype needs (--dtype, load-time --quantization, deprecated methods).
    dtype: str | None = None
    quantization: str | None = None
    allow_deprecated_quantization: bool = False


class ExpectedStatus(_Status):
    kv_cache_tokens: int
    kv_cache_bytes: int
    num_gpu_blocks: int
    kv_bytes_per_token: int
    concurrent_sequences: int
    concurrent_sequences_context_tokens: int
    decode_step_seconds: float | None = None
    prefix_hit_rate: float | None = None
    # Absent in a status an older kvtune wrote (the plan in force then takes the new plan's).
    weights_bytes_per_gpu: int | None = None
    non_kv_bytes_per_gpu: int | None = None
    # Predicted by the capacity search on the pool's observed traffic (tuner/planner/search):
    # one replica's capacity at SLO (the highest arrival rate of this traffic at which 95 %
    # of requests meet both targets), the fraction that do at the observed rate, and the p95
    # latencies there.
    capacity_requests_per_second: float | None = None
    slo_attainment: float | None = None
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    # ceil(the pool's observed rate / capacity): replicas all of its traffic needs at SLO.
    replicas_needed: int | None = None


PoolPhase = Literal["Applied", "Canary", "Recommended", "Unmanaged", "NoNodes", "Failed",
                    "Searching"]


class RevisionFiguresStatus(_Status):
    """One revision's live figures over the analysis window."""

    requests: float
    ttft_within_slo: float | None = None
    tpot_within_slo: float | None = None
    preemptions_per_request: float = 0.0
    kv_usage_mean: float | None = None
    waiting_mean: float | None = None


class CanaryAnalysisStatus(_Status):
    """The canary's last verdict on live metrics, with both revisions' figures as evidence."""

    verdict: str  # promote | rollback | inconclusive
    reason: str
    message: str
    at: str
    stable: RevisionFiguresStatus
    canary: RevisionFiguresStatus


class CanaryStatus(_Status):
    """A new plan running on ``canaryReplicas`` replicas beside the old one."""

    plan_hash: str
    revision: int
    started_at: str
    deployment: str
    analysis: CanaryAnalysisStatus | None = None


class UtilizationStatus(_Status):
    planned: float
    actual: float


class TokensStatus(_Status):
    expected: int
    actual: int


class RuntimeStatus(_Status):
    """What kvtune's runtime entrypoint found on the pool's pods running the current plan
    (their ``kvtune.io/runtime-report`` annotations; ``spec.runtime.entrypoint: kvtune``).
    Figures are the worst pod's: the smallest fraction and KV cache, the least free memory."""

    pods: int  # pods of the pool running the current plan
    reported_pods: int
    started_pods: int = 0
    refused_pods: int = 0
    gpu_product: str | None = None  # NVML's product name, e.g. "NVIDIA H200"
    gpu_memory_total_bytes: int | None = None
    gpu_memory_free_bytes: int | None = None  # when the entrypoint looked, before vLLM
    gpu_memory_utilization: UtilizationStatus | None = None
    kv_cache_tokens: TokensStatus | None = None
    refusal_reason: str | None = None
    refusal: str | None = None  # the entrypoint's message: expected, found, the fix
    message: str = ""
    last_report_time: str | None = None


class CostStatus(_Status):
    """What the chosen configuration costs (tuner/planner/cost.py): one replica's GPUs for an
    hour over what it serves of the pool's traffic at the observed rate."""

    usd_per_gpu_hour: float
    price_source: str
    gpus_per_replica: int
    cost_per_million_output_tokens_usd: float | None = None
    # Over the capacity at SLO: a replica run at capacity, the pool scaled to the traffic.
    cost_per_million_good_requests_usd: float | None = None


class ObservedSLOStatus(_Status):
    """The SLO attainment vLLM's histograms show for the pool over the retune timer's last
    window, beside the capacity search's prediction (operator/retune/slo_observed.py)."""

    at: str
    window_seconds: float
    requests: int
    scope: Literal["pool", "deployment"]  # the pool's own series, or the deployment's
    ttft_within_slo: float | None = None  # at the bucket at or below the target
    tpot_within_slo: float | None = None
    ttft_bound_seconds: float | None = None
    tpot_bound_seconds: float | None = None
    # The most that can have met both targets (each read at the bucket at or above it).
    attainment_upper_bound: float | None = None
    predicted_attainment: float | None = None
    verdict: str  # ObservedBelowPrediction, ObservedAsPredicted, InsufficientSample, ...
    message: str


class PoolRoutingStatus(_Status):
    """The pool's routing objects (spec.routing) as applied and as the cluster sees them.

    ``max_model_len`` is what the pool's InferencePool and endpoint picker were applied with:
    the plan its stable pods run. It moves only when the pool's main Deployment takes a plan,
    so during a canary the HTTPRoute's length rules keep the stable plan's length (status'
    ``plan`` is then the canary's). The rest is refreshed by the operator
    (operator/monitoring/routing_status.py)."""

    max_model_len: int
    endpoint_picker: str  # its Deployment and Service
    # Requests/s one replica of the applied plan sustains within the SLO (the capacity
    # search's capacity at SLO, when it ran): the HTTPRoute weighs pools by it x replicas
    # (operator/routing/http_route.py). None: not measured; the weights then follow replicas.
    capacity_requests_per_second_per_replica: float | None = None
    endpoint_picker_available: bool | None = None  # None: not read yet
    message: str = ""


class PoolStatus(_Status):
    name: str
    gpu_class: str
    tensor_parallel: int
    replicas: int
    nodes: int = 0
    phase: PoolPhase
    message: str = ""
    deployment: str | None = None
    plan: PlanStatus | None = None
    expected: ExpectedStatus | None = None
    reasons: list[str] = []
    warnings: list[str] = []
    vllm_args: list[str] = []
    plan_hash: str | None = None
    # Digest of what the plan in force was made from (rollout/plan.planning_inputs): while it
    # holds, the plan is kept as it is, even by a kvtune whose planner would now choose
    # otherwise (an operator upgrade never re-plans a running pool on its own).
    plan_inputs: str | None = None
    revision: int = 0
    canary: CanaryStatus | None = None
    # A plan that failed its canary; kvtune does not try it again (another plan will be).
    rejected_plan_hash: str | None = None
    runtime: RuntimeStatus | None = None
    profile: ProfileStatus | None = None  # what this pool's plan was made for
    # Set when the capacity search finds no configuration meeting the SLO at the observed
    # rate: the attainment, the rate one replica sustains and the replicas needed.
    slo_at_risk: str | None = None
    cost: CostStatus | None = None  # the chosen configuration's, when the class has a price
    observed_slo: ObservedSLOStatus | None = None  # written by the retune timer
    routing: PoolRoutingStatus | None = None  # spec.routing.enabled, once applied


class TokenQuantilesStatus(_Status):
    p50: int
    p90: int | None = None
    p95: int
    p99: int
    max: int


ProfileScope = Literal["pool", "deployment"]


class ProfileStatus(_Status):
    """The workload profile a plan was made for, and where it came from. The profiling
    module fills this with ``source: prometheus``; until then it is the declared workload.
    ``scope`` (in ``pools[].profile``): ``pool`` when it was observed on the pool's own
    series, ``deployment`` when it is the deployment-wide (or declared) one."""

    source: str
    scope: ProfileScope | None = None
    kind: str | None = None
    window: str | None = None
    requests: int | None = None
    context_tokens: TokenQuantilesStatus | None = None
    output_tokens: TokenQuantilesStatus | None = None
    shared_prefix_tokens: int | None = None
    prefix_hit_rate: float | None = None
    request_rate_per_second: float | None = None
    observed_at: str | None = None
    # The rest of the exact profile the plan was made from (``workloads.profile_from_status``
    # gives it back whole, so the next reconcile recognises the plan in force): absent in a
    # status an older kvtune wrote.
    arrival_cv: float | None = None
    window_seconds: float | None = None
    notes: list[str] | None = None


class DeploymentProfileStatus(ProfileStatus):
    """``status.profile``: the deployment-wide profile, and the retune timer's part: the
    last window's figures, whether they were trusted and why, its decisions and clocks."""

    observed: ObservedStatus | None = None
    trusted: bool | None = None
    profile_message: str | None = None
    retune: RetuneStatus | None = None


class QuantileEstimateStatus(_Status):
    """A length quantile read from a histogram: the estimate and the bucket holding it."""

    q: float
    estimate: int
    lower: float | None = None
    upper: float | None = None  # absent: in the +Inf bucket with no cap known
    histogram_quantile: float | None = None  # Prometheus' interpolation, for comparison


class ObservedStatus(_Status):
    """What the last profiling window showed (the retune timer writes it)."""

    window_seconds: float
    requests: int
    request_rate_per_second: float | None = None
    prefix_hit_rate: float | None = None
    kv_cache_usage_mean: float | None = None
    kv_cache_usage_max: float | None = None
    preemptions_per_second: float | None = None
    waiting_mean: float | None = None
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    num_gpu_blocks: list[int] = []
    context_tokens: list[QuantileEstimateStatus] = []
    output_tokens: list[QuantileEstimateStatus] = []


class CandidateProfileStatus(_Status):
    """The traffic a dwell started from (the retune timer compares the next windows with
    it): the figures drift is measured on."""

    context_tokens: TokenQuantilesStatus
    output_tokens: TokenQuantilesStatus
    prefix_hit_rate: float | None = None
    shared_prefix_tokens: int | None = None
    request_rate_per_second: float | None = None
    requests: int | None = None
    arrival_cv: float | None = None
    window_seconds: float | None = None
    notes: list[str] | None = None


class RetuneStateStatus(_Status):
    """The retune timer's clocks for one pool (Unix seconds), kept in status so that a
    restart, a reconcile or a rollout keeps them: the dwell and the min interval hold."""

    drift_since_seconds: float | None = None
    candidate: CandidateProfileStatus | None = None
    stable_since_seconds: float | None = None
    last_rollout_seconds: float | None = None


class RetunePoolStatus(_Status):
    name: str
    scope: ProfileScope | None = None
    selector: str = ""
    requests: int | None = None
    profile_message: str = ""
    reason: str
    message: str = ""
    drift_score: float | None = None
    state: RetuneStateStatus = RetuneStateStatus()


class RetuneStatus(_Status):
    """The retune timer's last decision (the tick's reason: the pool furthest along)."""

    reason: str
    message: str = ""
    at: str | None = None
    drift_score: float | None = None
    drift_threshold: float | None = None
    dwell_seconds: float | None = None
    pools: list[RetunePoolStatus] = []


# Unverified: a narrower KV dtype is planned that no measurement covers and none can be made
# here (no calibration image, or calibration Jobs are forbidden in the namespace).
KVQualityPhase = Literal["Measured", "Calibrating", "Failed", "Disabled", "NotNeeded",
                         "Unverified"]
# Why none can run: calibration disabled in the spec, no image with kvtune, Jobs forbidden,
# the spec's calibration image off the chart's podPolicy.allowedImages.
UnverifiedCause = Literal["Disabled", "NoImage", "Forbidden", "ImageNotAllowed"]


class KVQualityDtypeStatus(_Status):
    dtype: str
    kl_mean: float  # nats vs 16-bit KV
    top1_agreement: float
    attention_error_max: float
    worst_layer: int
    allowed: bool  # within spec.quality.maxKVQuantizationKL


class KVQualityStatus(_Status):
    """The KV-quality evidence the plans were gated on (issue 15)."""

    model: str
    revision: str  # spec.model.revision, or "unpinned"
    phase: KVQualityPhase
    message: str = ""
    job: str | None = None  # the calibration Job, while it runs or when it failed
    config_map: str | None = None  # where the report is kept
    measured_at: str | None = None
    weights: str | None = None  # "checkpoint" | "random-init"
    checkpoint_kv_scales: str | None = None  # what the checkpoint says of its KV scales
    dtypes: list[KVQualityDtypeStatus] = []
    # Phase Unverified: "pool: dtype" per pool held at the wider dtype, and why no calibration
    # can run (UnverifiedCause). A later reconcile holds from these while the cause stands,
    # instead of planning the narrower dtype again only to be held again.
    unverified: list[str] = []
    unverified_cause: UnverifiedCause | None = None


class InferenceDeploymentStatus(_Status):
    observed_generation: int | None = None
    mode: str | None = None
    conditions: list[Condition] = []
    profile: DeploymentProfileStatus | None = None
    kv_quality: KVQualityStatus | None = None
    pools: list[PoolStatus] = []
    pool_summary: str | None = None  # "H200x2,H100x1", for the printer column
