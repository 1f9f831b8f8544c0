"""The plan as the operator hands it to the runtime: JSON in the ``KVTUNE_PLAN`` env var.

The JSON is a ``kvtune.tuner.plan.PoolPlan`` dump (``model_id``, ``gpu_class``,
``tensor_parallel``, ``vllm_version``, ``plan``, ``expected``; ``reasons`` are ignored here).
Keys may be snake_case (``model_dump()``) or camelCase (``model_dump(by_alias=…)`` / the CRD
status style). The runtime keeps its own lenient copy of the types instead of importing the
tuner, so the image needs only pydantic; a test checks both agree on the flags.
"""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

PLAN_ENV = "KVTUNE_PLAN"


class _Lenient(BaseModel):
    # Unknown keys are ignored: a newer operator may send more than this runtime reads.
    model_config = ConfigDict(
        frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True
    )


class RuntimeKnobs(_Lenient):
    block_size: int = Field(gt=0)
    kv_cache_dtype: str
    gpu_memory_utilization: float = Field(gt=0.0, le=1.0)
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0)
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    enable_prefix_caching: bool
    kv_offloading_size_gib: float | None = Field(default=None, gt=0.0)
    kv_offloading_backend: str | None = None
    attention_backend: str | None = None
    # What the weights dtype needs (--dtype, load-time --quantization, deprecated methods).
    dtype: str | None = None
    quantization: str | None = None
    allow_deprecated_quantization: bool = False

    def vllm_args(self, gpu_memory_utilization: float | None = None,
                  kv_cache_memory_bytes: int | None = None) -> list[str]:
        """The ``vllm serve`` flags, in the order ``KVPlan.vllm_args()`` renders them, with
        the memory knob replaced by what the runtime decided on this node."""
        util = self.gpu_memory_utilization if gpu_memory_utilization is None \
            else gpu_memory_utilization
        kv_bytes = self.kv_cache_memory_bytes if kv_cache_memory_bytes is None \
            else kv_cache_memory_bytes
        args = [f"--dtype={self.dtype}"] if self.dtype else []
        if self.quantization:
            args.append(f"--quantization={self.quantization}")
        if self.allow_deprecated_quantization:
            args.append("--allow-deprecated-quantization")
        args += [f"--block-size={self.block_size}", f"--kv-cache-dtype={self.kv_cache_dtype}"]
        if kv_bytes is not None:
            args.append(f"--kv-cache-memory-bytes={kv_bytes}")
        else:
            args.append(f"--gpu-memory-utilization={util:.4g}")
        args += [
            f"--max-model-len={self.max_model_len}",
            f"--max-num-seqs={self.max_num_seqs}",
            f"--max-num-batched-tokens={self.max_num_batched_tokens}",
            "--enable-prefix-caching" if self.enable_prefix_caching
            else "--no-enable-prefix-caching",
        ]
        if self.kv_offloading_size_gib is not None:
            args.append(f"--kv-offloading-size={self.kv_offloading_size_gib:g}")
            if self.kv_offloading_backend is not None:
                args.append(f"--kv-offloading-backend={self.kv_offloading_backend}")
        if self.attention_backend is not None:
            args.append(f"--attention-backend={self.attention_backend}")
        return args


class RuntimeExpected(_Lenient):
    kv_bytes_per_token: int = Field(gt=0)  # per GPU (one TP rank)
    kv_cache_bytes: int = Field(ge=0)  # per GPU
    kv_cache_tokens: int = Field(ge=0)
    non_kv_bytes_per_gpu: int = Field(ge=0)
    concurrent_sequences: int | None = None
    concurrent_sequences_context_tokens: int | None = None


class RuntimePlan(_Lenient):
    model_id: str = Field(validation_alias=AliasChoices("model_id", "modelId", "model"))
    gpu_class: str
    tensor_parallel: int = Field(default=1, gt=0)
    vllm_version: str | None = None
    plan: RuntimeKnobs
    expected: RuntimeExpected


def parse_plan(raw: str | None) -> RuntimePlan:
    """The plan from the env var's text; errors say what was expected and how to fix it."""
    if raw is None or raw.strip() == "":
        raise ValueError(
            f"{PLAN_ENV} is not set: expected the JSON plan the kvtune operator renders into "
            "the vLLM container's env. Fix: deploy through an InferenceDeployment, or set "
            f"{PLAN_ENV} to a PoolPlan JSON (see `kvtune plan … -o json`)."
        )
    try:
        return RuntimePlan.model_validate_json(raw)
    except ValueError as err:
        raise ValueError(
            f"{PLAN_ENV} is not a valid plan: {err}. Expected a PoolPlan JSON with model_id, "
            "gpu_class, tensor_parallel, plan and expected; fix the operator's rendering or "
            "the hand-written value."
        ) from err
