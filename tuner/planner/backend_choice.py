"""Which attention backend vLLM would run for a KV dtype and block size, and which block
sizes that leaves.

vLLM walks its backend order and takes the first that serves the attention kind, the dtype
and the block size on this compute capability (``capabilities.select_backend``); a pinned
``attention_backend`` replaces the walk. A block size the preferred backend refuses makes vLLM
fall back to a later one (FlashMLA -> Triton MLA), usually slower, so the planner offers only
sizes the preferred backend accepts. Answers are cached per run: every decision asks.
"""

from __future__ import annotations

from kvtune.tuner.facts.capabilities import (
    AttentionFamily,
    BackendCapability,
    KVCacheDType,
    RuntimeCapabilities,
)

# The block sizes kvtune considers, smallest first.
BLOCK_SIZE_CANDIDATES: tuple[int, ...] = (16, 32, 64, 128)


class BackendChooser:
    """vLLM's backend selection for one model on one GPU, with the policy's pin."""

    def __init__(
        self, runtime: RuntimeCapabilities, attention: AttentionFamily,
        cc: tuple[int, int], pinned_backend: str | None, gpu_name: str, model_dtype: str,
        sinks: bool = False,
    ) -> None:
        self.runtime = runtime
        # The model has attention sinks (gpt-oss): only backends that serve them qualify.
        self.sinks = sinks
        self.gpu_name = gpu_name
        self.model_dtype = model_dtype
        self.attention = attention
        self.cc = cc
        self.pinned_backend = pinned_backend
        self._cache: dict[tuple[str, int | None], BackendCapability | None] = {}

    def backend_for(self, dtype_name: str, block_size: int | None = None) -> (
        BackendCapability | None
    ):
        """The backend vLLM would run (None: vLLM would refuse to start)."""
        key = (dtype_name, block_size)
        if key not in self._cache:
            self._cache[key] = self._select(dtype_name, block_size)
        return self._cache[key]

    def _select(self, dtype_name: str, block_size: int | None) -> BackendCapability | None:
        if self.pinned_backend is not None:
            backend = self.runtime.backend(self.pinned_backend)
            dtype = self.runtime.dtype(dtype_name)
            if not backend.supports_dtype(dtype, self.cc):
                return None
            if block_size is not None and not backend.accepts_block_size(block_size, self.cc):
                return None
            if self.sinks and not backend.serves_sinks(self.cc):
                return None
            return backend
        return self.runtime.select_backend(dtype_name, self.attention, self.cc, block_size,
                                           sinks=self.sinks)

    def dtype_unusable(self, dtype: KVCacheDType) -> str | None:
        """Why vLLM cannot run this dtype for this model on this GPU (None: it can)."""
        if dtype.layout == "not_modeled":
            return f"kvtune cannot size {dtype.name} pages ({dtype.note})"
        if dtype.layout == "ds_mla":
            return f"{dtype.name} serves sparse MLA (DeepSeek V3.2) only"
        if dtype.name in ("float16", "bfloat16") and dtype.name != self.model_dtype:
            return f"must match the model dtype ({self.model_dtype}); use auto"
        if self.backend_for(dtype.name) is None:
            backends = [
                b.name for b in self.runtime.backends
                if dtype.name in b.kv_cache_dtypes and b.attention == self.attention
            ]
            where = ", ".join(backends) if backends else "no backend"
            return (
                f"no {self.attention}-attention backend of vLLM {self.runtime.vllm_version} "
                f"serves it on compute capability {self.cc[0]}.{self.cc[1]} "
                f"({self.gpu_name}); it exists on: {where}"
            )
        return None

    def block_size_ok(self, dtype_name: str, block_size: int) -> bool:
        """Some backend serves this dtype at this block size (vLLM would start)."""
        return self.backend_for(dtype_name, block_size) is not None

    def preferred_ok(self, dtype_name: str, block_size: int) -> bool:
        """The backend vLLM prefers for this dtype accepts the size. Other sizes make vLLM
        fall back to a later backend in its order (FlashMLA -> Triton MLA), usually slower."""
        preferred = self.backend_for(dtype_name)
        return preferred is not None and preferred.accepts_block_size(block_size, self.cc)

    def allowed_block_sizes(self, dtype_name: str) -> str:
        backend = self.backend_for(dtype_name)
        if backend is None:
            return "none"
        return f"{backend.name}: {backend.block_size_rule(self.cc)}"

    def smallest_block(self, dtype_name: str) -> int:
        """The smallest candidate the preferred backend accepts (the probe size every
        memory figure uses before the block size is decided)."""
        for bs in BLOCK_SIZE_CANDIDATES:
            if self.preferred_ok(dtype_name, bs):
                return bs
        backend = self.backend_for(dtype_name)
        if backend is not None and backend.block_sizes:
            return min(backend.block_sizes)
        return self.runtime.default_block_size
