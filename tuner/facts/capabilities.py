"""What a pinned vLLM version can do, as data per version (``tuner/facts/data/vllm-<v>.json``):
the exact ``--kv-cache-dtype`` values, each attention backend's dtypes, block sizes and
compute capabilities, and the order in which vLLM picks backends on CUDA.

The data is checked against the real wheel's source by
``tests/tuner/facts/test_tuner_capabilities.py`` (``CacheDType`` in ``vllm/config/cache.py``,
``supported_kv_cache_dtypes`` of each backend, the flags in ``vllm/engine/arg_utils.py``), so
it cannot drift from the runtime.
"""

from __future__ import annotations

import difflib
from functools import cache, cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.errors import InvalidInput, UnknownName
from kvtune.tuner.facts import data_files
from kvtune.tuner.facts.vllm_memory import memory_data, supported_versions

PINNED_VLLM_VERSION = "0.33.0"

# How kvtune sizes a dtype's pages (kvmemory.py); "not_modeled" dtypes exist in vLLM but
# kvtune cannot size them, so the planner never picks them and rejects them as pins.
DTypeLayout = Literal["dense", "per_token_head", "nvfp4", "ds_mla", "not_modeled"]
AttentionFamily = Literal["standard", "mla"]


class KVCacheDType(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    bits: int = Field(gt=0)  # bits per stored element, before scales
    layout: DTypeLayout
    note: str


class BackendCapability(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    attention: AttentionFamily
    source: str
    kv_cache_dtypes: tuple[str, ...]
    # Either any multiple of ``block_size_multiple_of`` or exactly one of ``block_sizes``.
    block_size_multiple_of: int | None
    block_sizes: tuple[int, ...] | None
    # Extra block sizes allowed on some compute-capability majors ("10": [...]).
    block_sizes_on_majors: dict[str, tuple[int, ...]] = {}
    compute_capability_min: tuple[int, int] | None
    compute_capability_max: tuple[int, int] | None
    # Quantized KV dtypes only on these majors (FlashAttention 3 on Hopper).
    quantized_kv_compute_capability_majors: tuple[int, ...] | None = None
    # Per-dtype major restrictions (NVFP4 on Blackwell).
    dtype_compute_capability_majors: dict[str, tuple[int, ...]] = {}
    # Attention sinks (gpt-oss) only on these majors (``supports_sink``); None: on every one.
    sink_compute_capability_majors: tuple[int, ...] | None = None
    notes: str = ""

    def serves_sinks(self, compute_capability: tuple[int, int]) -> bool:
        majors = self.sink_compute_capability_majors
        return majors is None or compute_capability[0] in majors

    def runs_on(self, compute_capability: tuple[int, int]) -> bool:
        if self.compute_capability_min and compute_capability < self.compute_capability_min:
            return False
        return not (
            self.compute_capability_max and compute_capability > self.compute_capability_max
        )

    def supports_dtype(
        self, dtype: KVCacheDType, compute_capability: tuple[int, int]
    ) -> bool:
        if dtype.name not in self.kv_cache_dtypes or not self.runs_on(compute_capability):
            return False
        major = compute_capability[0]
        quantized_majors = self.quantized_kv_compute_capability_majors
        if dtype.bits < 16 and quantized_majors is not None and major not in quantized_majors:
            return False
        majors = self.dtype_compute_capability_majors.get(dtype.name)
        return majors is None or major in majors

    def accepts_block_size(self, block_size: int, compute_capability: tuple[int, int]) -> bool:
        if self.block_size_multiple_of is not None:
            return block_size > 0 and block_size % self.block_size_multiple_of == 0
        extra = self.block_sizes_on_majors.get(str(compute_capability[0]), ())
        return block_size in (self.block_sizes or ()) or block_size in extra

    def block_size_rule(self, compute_capability: tuple[int, int]) -> str:
        if self.block_size_multiple_of is not None:
            return f"any multiple of {self.block_size_multiple_of}"
        sizes = sorted(
            {*(self.block_sizes or ()), *self.block_sizes_on_majors.get(
                str(compute_capability[0]), ())}
        )
        return "one of " + ", ".join(str(s) for s in sizes)


class RuntimeCapabilities(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    vllm_version: str
    kv_cache_dtypes: tuple[KVCacheDType, ...]
    default_block_size: int
    default_gpu_memory_utilization: float
    prefix_caching_hash_algos: tuple[str, ...]
    kv_offloading_backends: tuple[str, ...]
    flags: tuple[str, ...]
    backends: tuple[BackendCapability, ...]
    # attention family -> compute-capability major (or "default") -> backend names.
    backend_priority: dict[str, dict[str, tuple[str, ...]]]
    default_max_num_batched_tokens: tuple[dict[str, int], ...]
    source: str

    @cached_property
    def kv_cache_dtype_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.kv_cache_dtypes)

    @cached_property
    def _dtypes_by_name(self) -> dict[str, KVCacheDType]:
        return {d.name: d for d in self.kv_cache_dtypes}

    def dtype(self, name: str) -> KVCacheDType:
        found = self._dtypes_by_name.get(name)
        if found is not None:
            return found
        raise InvalidInput(
            "kv_cache_dtype", name,
            f"vLLM {self.vllm_version} has no such --kv-cache-dtype; allowed: "
            f"{', '.join(self.kv_cache_dtype_names)}",
        )

    def backend(self, name: str) -> BackendCapability:
        for b in self.backends:
            if b.name == name:
                return b
        raise InvalidInput(
            "attention_backend", name,
            f"kvtune knows these vLLM {self.vllm_version} CUDA backends: "
            f"{', '.join(b.name for b in self.backends)}",
        )

    def backends_in_priority(
        self, attention: AttentionFamily, compute_capability: tuple[int, int]
    ) -> tuple[BackendCapability, ...]:
        order = self.backend_priority[attention]
        names = order.get(str(compute_capability[0]), order["default"])
        return tuple(self.backend(n) for n in names)

    def select_backend(
        self,
        dtype_name: str,
        attention: AttentionFamily,
        compute_capability: tuple[int, int],
        block_size: int | None = None,
        sinks: bool = False,
    ) -> BackendCapability | None:
        """The backend vLLM would pick for this dtype (and block size) on this GPU: the first
        in its priority order that supports them (and the model's attention sinks), or None."""
        dtype = self.dtype(dtype_name)
        for backend in self.backends_in_priority(attention, compute_capability):
            if not backend.supports_dtype(dtype, compute_capability):
                continue
            if sinks and not backend.serves_sinks(compute_capability):
                continue
            if block_size is not None and not backend.accepts_block_size(
                block_size, compute_capability
            ):
                continue
            return backend
        return None

    def defaults_for_memory(self, total_bytes: int, gpu_name: str) -> tuple[int, int]:
        """vLLM's default (max_num_batched_tokens, max_num_seqs) for the OpenAI server on a GPU
        of this size (``EngineArgs._set_default_args``; A100 stays on the small tier)."""
        gib = total_bytes / (1 << 30)
        for tier in self.default_max_num_batched_tokens:
            if gib >= tier["min_memory_gib"]:
                if tier["min_memory_gib"] and tier["min_memory_gib"] < 160 and (
                    "a100" in gpu_name.lower()
                ):
                    continue
                return tier["tokens"], tier["seqs"]
        last = self.default_max_num_batched_tokens[-1]
        return last["tokens"], last["seqs"]


def available_versions() -> list[str]:
    return sorted(
        name[len("vllm-"):-len(".json")]
        for name in data_files.names("data")
        if name.startswith("vllm-") and name.endswith(".json")
    )


@cache
def get_runtime(version: str = PINNED_VLLM_VERSION) -> RuntimeCapabilities:
    """The capabilities of one vLLM version. Versions with a capability file are read from
    it; the older versions kvtune's memory model is calibrated for (``vllm_memory``) reuse
    the pinned version's backends with the KV dtypes every version since 0.11 has and their
    own default fraction. Raises ``UnknownName`` for any other version."""
    versions = available_versions()
    if version in versions:
        return RuntimeCapabilities.model_validate(
            data_files.read_json("data", f"vllm-{version}.json"))
    memory = memory_data().versions.get(version)
    if memory is None or memory.kv_cache_dtypes is None:
        raise UnknownName(
            "vllm_version", version,
            difflib.get_close_matches(version, supported_versions(), n=3, cutoff=0.6),
            f"kvtune supports vLLM {', '.join(supported_versions())}; pass one of them "
            "(--vllm-version, spec.runtime.vllmVersion).",
        )
    pinned = get_runtime(PINNED_VLLM_VERSION).model_dump(mode="json")
    allowed = set(memory.kv_cache_dtypes)
    pinned["vllm_version"] = version
    pinned["kv_cache_dtypes"] = [d for d in pinned["kv_cache_dtypes"] if d["name"] in allowed]
    for backend in pinned["backends"]:
        backend["kv_cache_dtypes"] = [d for d in backend["kv_cache_dtypes"] if d in allowed]
    pinned["default_gpu_memory_utilization"] = memory.default_gpu_memory_utilization
    pinned["source"] = (
        f"vLLM {PINNED_VLLM_VERSION}'s capability file, restricted to the KV dtypes of "
        f"vLLM {version} (tuner/facts/data/vllm_memory.json: {memory.evidence})"
    )
    return RuntimeCapabilities.model_validate(pinned)
