"""The API's identity (group, version, kind), what the pinned vLLM accepts, the patterns
and CEL helpers the spec and status models share, and their two base classes.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from kvtune.tuner.facts.capabilities import PINNED_VLLM_VERSION, get_runtime
from kvtune.tuner.facts.weights import WEIGHTS_DTYPES
from kvtune.tuner.knobs import KNOBS, camel_name

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




class _Status(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)
