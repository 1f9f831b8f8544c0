"""The plan as the operator hands it to the runtime: JSON in the ``KVTUNE_PLAN`` env var.

The JSON is a ``kvtune.tuner.plan.PoolPlan`` dump (``model_id``, ``gpu_class``,
``tensor_parallel``, ``vllm_version``, ``plan``, ``expected``; ``reasons`` are ignored here).
Keys may be snake_case (``model_dump()``) or camelCase (``model_dump(by_alias=…)`` / the CRD
status style). The runtime keeps its own lenient copy of the types instead of importing the
tuner, so the image needs only pydantic (its fields are generated from the knob table); the
flags render from the knob table itself (``kvtune.tuner.knobs``, standard library only, in
the same wheel), so they cannot differ from the operator's.
"""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kvtune.runtime.knob_fields import RuntimeKnobsFields
from kvtune.tuner.knobs import plan_args

PLAN_ENV = "KVTUNE_PLAN"


# Unknown keys are ignored: a newer operator may send more than this runtime reads.
_LENIENT = ConfigDict(frozen=True, extra="ignore", alias_generator=to_camel,
                      populate_by_name=True)


class _Lenient(BaseModel):
    model_config = _LENIENT


class RuntimeKnobs(RuntimeKnobsFields):
    """The plan's knobs; the fields and vLLM's bounds are the knob table's
    (``kvtune.tuner.knobs``, generated into ``knob_fields.py``)."""

    model_config = _LENIENT

    def vllm_args(self, gpu_memory_utilization: float | None = None,
                  kv_cache_memory_bytes: int | None = None) -> list[str]:
        """The ``vllm serve`` flags, in the order ``KVPlan.vllm_args()`` renders them, with
        the memory knob replaced by what the runtime decided on this node."""
        values = self.model_dump()
        if gpu_memory_utilization is not None:
            values["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_memory_bytes is not None:
            values["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        return plan_args(values)


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
