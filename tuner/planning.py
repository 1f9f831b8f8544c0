"""The offline planner: one pool's vLLM KV-cache configuration, with a reason for every
choice and the figures it expects.

The decisions, in order (each reads the ones before it):

1. ``max-num-batched-tokens``: vLLM's default for the GPU's memory (activations depend on it).
2. ``gpu-memory-utilization``: the largest fraction that leaves a reserve outside vLLM
   (``budget.py``); weights, activations, CUDA graphs and non-torch memory come off it.
3. ``max-model-len``: a high quantile of prompt + output, with headroom, capped by the
   model, never below what the policy guarantees.
4. ``kv-cache-dtype``: the widest dtype that holds the target concurrency at the profile's
   p95 session, among those vLLM supports for this attention on this GPU, never below the
   quality floor, and only if one ``max-model-len`` request fits (pre-flight).
5. ``max-num-seqs``: the decode-step bandwidth model against the TPOT target, capped by the
   sequences that fit at the median session.
6. ``block-size``: the backend's allowed sizes; closed form: least fragmentation and finest
   prefix granularity. With a ``CandidateScorer`` (the simulator), block size x
   max-num-seqs candidates are scored on the workload and the best that meets the SLOs wins.
7. prefix caching and KV offload from the profile's sharing and multi-turn pattern.

Every knob can be pinned (``PlanPolicy.pins``); a pin that can never work raises
``InvalidInput`` naming the pin, the value and the allowed values. When nothing fits,
``NoFeasiblePlan`` quotes the bytes needed and available and the smallest changes that fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvtune.tuner import budget, decode, prefill, scored
from kvtune.tuner.capabilities import (
    PINNED_VLLM_VERSION,
    AttentionFamily,
    BackendCapability,
    KVCacheDType,
    RuntimeCapabilities,
    get_runtime,
)
from kvtune.tuner.checks import (
    BELOW_QUALITY_FLOOR,
    CHOSEN,
    FITS,
    MAX_MODEL_LEN_DOES_NOT_FIT,
    MORE_WASTE,
    NOT_MODELED,
    PINNED,
    SWITCHES_BACKEND,
    TOO_FEW_SEQUENCES,
    UNSUPPORTED_BY_BACKEND,
    WIDER_MEETS_TARGET,
)
from kvtune.tuner.errors import InvalidInput, NoFeasiblePlan
from kvtune.tuner.gpus import GPUClass
from kvtune.tuner.kvmemory import (
    block_bytes,
    kv_bytes_per_token,
    request_blocks,
    request_kv_bytes,
)
from kvtune.tuner.models import ModelArchitecture
from kvtune.tuner.plan import (
    CandidateScore,
    CandidateVerdict,
    ExpectedFigures,
    KVPlan,
    PoolPlan,
    Reason,
)
from kvtune.tuner.policy import KVPrecision, PlanPolicy
from kvtune.tuner.weights import weight_bits, weights_bytes_per_gpu
from kvtune.tuner.workload import WorkloadProfile
from pydantic import BaseModel, ConfigDict, Field

GiB = 1 << 30


# When the policy sets no TPOT target, size the batch for this one (interactive serving).
DEFAULT_TPOT_SECONDS = 0.05
# max-model-len headroom over the observed high quantile of prompt + output.
MAX_MODEL_LEN_HEADROOM = 1.1
MAX_MODEL_LEN_ROUNDING_TOKENS = 1024
BLOCK_SIZE_CANDIDATES: tuple[int, ...] = (16, 32, 64, 128)
# vLLM's scheduler cap on running sequences by default.
MAX_NUM_SEQS_CEILING = 1024

_PRECISION_FLOOR_BITS: dict[KVPrecision, int] = {
    "bf16": 16, "fp8": 8, "int8": 8, "fp4": 4, "int4": 4,
}
# Among dtypes of one width, the order kvtune prefers: native per-tensor fp8 runs on the
# fastest kernels (FA3 on Hopper, FlashInfer on Blackwell); per-token-head dtypes need
# TRITON_ATTN and carry scales.
_DTYPE_PREFERENCE: tuple[str, ...] = (
    "auto", "fp8", "fp8_per_token_head", "int8_per_token_head", "fp8_e5m2",
    "nvfp4", "int4_per_token_head", "nvfp4_4over6",
)


class PlanRequest(BaseModel):
    """Everything one pool's plan depends on (pure data)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelArchitecture
    gpu: GPUClass
    tensor_parallel: int = Field(default=1, gt=0)
    # "auto": the checkpoint's own (DeepSeek-V3: fp8), else the model's 16-bit dtype.
    weights_dtype: str = "auto"
    profile: WorkloadProfile
    policy: PlanPolicy = PlanPolicy()
    vllm_version: str = PINNED_VLLM_VERSION


class CandidateScorer(Protocol):
    """Scores candidate plans on the request's workload (the simulator implements it).
    Must return one score per candidate, in the same order."""

    def __call__(
        self, request: PlanRequest, candidates: Sequence[KVPlan]
    ) -> Sequence[CandidateScore]: ...


@dataclass(frozen=True, slots=True)
class _Memory:
    """The memory arithmetic of one (dtype, block size, max-num-seqs) choice."""

    non_kv: budget.NonKVBytes
    kv_budget_bytes: int
    page_bytes: int
    num_gpu_blocks: int

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_gpu_blocks * self.page_bytes


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def session_tokens(profile: WorkloadProfile, quantile: str) -> int:
    """Prompt + output at one quantile (``p50``, ``p95``, ``p99``, ``max``)."""
    ctx = getattr(profile.context_tokens, quantile)
    out = getattr(profile.output_tokens, quantile)
    return max(1, int(ctx) + int(out))


class _Planner:
    """One planning run. Holds the request's derived facts; methods decide one knob each."""

    def __init__(self, request: PlanRequest) -> None:
        self.req = request
        self.model = request.model
        self.gpu = request.gpu
        self.tp = request.tensor_parallel
        self.pins = request.policy.pins
        self.runtime: RuntimeCapabilities = get_runtime(request.vllm_version)
        self.attention: AttentionFamily = "mla" if self.model.is_mla else "standard"
        self.cc = self.gpu.compute_capability
        self.model_dtype = self.model.torch_dtype
        self.reasons: list[Reason] = []
        self.warnings: list[str] = []
        self._backend_cache: dict[tuple[str, int | None], BackendCapability | None] = {}
        self._validate_static()
        self.weights_bytes = weights_bytes_per_gpu(
            self.model, request.weights_dtype, self.tp
        )
        self.p95_session = session_tokens(request.profile, "p95")
        # vLLM's profiling run sizes the sampler for max-num-seqs sequences: until that is
        # chosen, memory is figured for the pin or the runtime default.
        _, default_seqs = self.runtime.defaults_for_memory(
            self.gpu.cuda_total_bytes, self.gpu.name)
        self.seqs_for_memory = self.pins.max_num_seqs or min(default_seqs, MAX_NUM_SEQS_CEILING)
        self.p50_session = session_tokens(request.profile, "p50")

    # --- validation ---------------------------------------------------------------------

    def _validate_static(self) -> None:
        model, tp = self.model, self.tp
        if not model.is_mla and model.num_attention_heads % tp:
            raise InvalidInput(
                "tensor_parallel", tp,
                f"{model.hf_id} has {model.num_attention_heads} attention heads; tensor "
                "parallel must divide them (vLLM refuses otherwise). Try "
                + ", ".join(str(t) for t in (1, 2, 4, 8) if model.num_attention_heads % t == 0),
            )
        bits = weight_bits(model, self.req.weights_dtype)
        if bits == 8 and not self.gpu.supports_fp8 and self.req.weights_dtype == "fp8":
            self.warnings.append(
                f"{self.gpu.name} has no native FP8: vLLM serves FP8 weights there with "
                "weight-only Marlin kernels (slower prefill)"
            )
        pins = self.pins
        if pins.kv_cache_dtype is not None:
            if pins.kv_cache_dtype not in self.runtime.kv_cache_dtype_names:
                raise InvalidInput(
                    "pins.kv_cache_dtype", pins.kv_cache_dtype,
                    f"vLLM {self.runtime.vllm_version} accepts "
                    f"{', '.join(self.runtime.kv_cache_dtype_names)}",
                )
            dtype = self.runtime.dtype(pins.kv_cache_dtype)
            reason = self._dtype_unusable(dtype)
            if reason is not None:
                raise InvalidInput("pins.kv_cache_dtype", pins.kv_cache_dtype, reason)
        if pins.attention_backend is not None:
            backend = self.runtime.backend(pins.attention_backend)
            if backend.attention != self.attention or not backend.runs_on(self.cc):
                raise InvalidInput(
                    "pins.attention_backend", pins.attention_backend,
                    f"does not serve {self.attention} attention on compute capability "
                    f"{self.cc[0]}.{self.cc[1]} ({self.gpu.name}); allowed: "
                    + ", ".join(
                        b.name for b in self.runtime.backends
                        if b.attention == self.attention and b.runs_on(self.cc)
                    ),
                )
        if pins.block_size is not None:
            allowed = self._allowed_block_sizes(pins.kv_cache_dtype or "auto")
            if not self._block_size_ok(pins.kv_cache_dtype or "auto", pins.block_size):
                raise InvalidInput(
                    "pins.block_size", pins.block_size,
                    f"no {self.attention}-attention backend of vLLM "
                    f"{self.runtime.vllm_version} on {self.gpu.name} accepts it for "
                    f"kv_cache_dtype={pins.kv_cache_dtype or 'auto'}; allowed: "
                    f"{allowed}",
                )
        floor = self.req.policy.min_max_model_len_tokens
        if floor is not None and floor > model.max_position_embeddings:
            raise InvalidInput(
                "policy.min_max_model_len_tokens", floor,
                f"above {model.hf_id}'s max_position_embeddings="
                f"{model.max_position_embeddings}; lower it",
            )
        if pins.max_model_len is not None and pins.max_model_len > model.max_position_embeddings:
            raise InvalidInput(
                "pins.max_model_len", pins.max_model_len,
                f"above {model.hf_id}'s max_position_embeddings="
                f"{model.max_position_embeddings}; vLLM refuses it without "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
            )

    def _dtype_unusable(self, dtype: KVCacheDType) -> str | None:
        """Why vLLM cannot run this dtype for this model on this GPU (None: it can)."""
        if dtype.layout == "not_modeled":
            return f"kvtune cannot size {dtype.name} pages ({dtype.note})"
        if dtype.layout == "ds_mla":
            return f"{dtype.name} serves sparse MLA (DeepSeek V3.2) only"
        if dtype.name in ("float16", "bfloat16") and dtype.name != self.model_dtype:
            return f"must match the model dtype ({self.model_dtype}); use auto"
        if self._backend_for(dtype.name) is None:
            backends = [
                b.name for b in self.runtime.backends
                if dtype.name in b.kv_cache_dtypes and b.attention == self.attention
            ]
            where = ", ".join(backends) if backends else "no backend"
            return (
                f"no {self.attention}-attention backend of vLLM {self.runtime.vllm_version} "
                f"serves it on compute capability {self.cc[0]}.{self.cc[1]} "
                f"({self.gpu.name}); it exists on: {where}"
            )
        return None

    def _backend_for(self, dtype_name: str, block_size: int | None = None) -> (
        BackendCapability | None
    ):
        key = (dtype_name, block_size)
        if key not in self._backend_cache:
            self._backend_cache[key] = self._select_backend(dtype_name, block_size)
        return self._backend_cache[key]

    def _select_backend(self, dtype_name: str, block_size: int | None) -> (
        BackendCapability | None
    ):
        if self.pins.attention_backend is not None:
            backend = self.runtime.backend(self.pins.attention_backend)
            dtype = self.runtime.dtype(dtype_name)
            if not backend.supports_dtype(dtype, self.cc):
                return None
            if block_size is not None and not backend.accepts_block_size(block_size, self.cc):
                return None
            return backend
        return self.runtime.select_backend(dtype_name, self.attention, self.cc, block_size)

    def _block_size_ok(self, dtype_name: str, block_size: int) -> bool:
        """Some backend serves this dtype at this block size (vLLM would start)."""
        return self._backend_for(dtype_name, block_size) is not None

    def _preferred_ok(self, dtype_name: str, block_size: int) -> bool:
        """The backend vLLM prefers for this dtype accepts the size. Other sizes make vLLM
        fall back to a later backend in its order (FlashMLA -> Triton MLA), usually slower."""
        preferred = self._backend_for(dtype_name)
        return preferred is not None and preferred.accepts_block_size(block_size, self.cc)

    def _allowed_block_sizes(self, dtype_name: str) -> str:
        backend = self._backend_for(dtype_name)
        if backend is None:
            return "none"
        return f"{backend.name}: {backend.block_size_rule(self.cc)}"

    # --- memory ---------------------------------------------------------------------------

    def memory(
        self, dtype: str, block_size: int, max_num_seqs: int, batched_tokens: int,
        utilization: float,
    ) -> _Memory:
        non_kv = budget.non_kv_bytes(
            self.model, self.weights_bytes, self.tp, batched_tokens, max_num_seqs
        )
        if self.pins.kv_cache_memory_bytes is not None:
            kv_budget = self.pins.kv_cache_memory_bytes
        else:
            kv_budget = budget.kv_budget_bytes(self.gpu, utilization, non_kv)
        page = block_bytes(
            self.model, dtype, self.tp, block_size, model_dtype=self.model_dtype
        )
        blocks = max(0, kv_budget) // page
        return _Memory(non_kv, kv_budget, page, blocks)

    def request_bytes(
        self, dtype: str, block_size: int, tokens: int, batched_tokens: int, max_model_len: int
    ) -> int:
        return request_kv_bytes(
            self.model, dtype, self.tp, block_size, tokens, batched_tokens, max_model_len,
            model_dtype=self.model_dtype,
        )

    def sessions(
        self, mem: _Memory, dtype: str, block_size: int, tokens: int, batched_tokens: int,
        max_model_len: int,
    ) -> int:
        """Sequences of ``tokens`` that fit at once (one block is vLLM's null block)."""
        per_request = self.request_bytes(
            dtype, block_size, min(tokens, max_model_len), batched_tokens, max_model_len
        )
        usable = (mem.num_gpu_blocks - 1) * mem.page_bytes
        return max(0, usable // per_request)

    def preflight_ok(
        self, mem: _Memory, dtype: str, block_size: int, batched_tokens: int, max_model_len: int
    ) -> bool:
        """vLLM refuses to start unless one ``max_model_len`` request fits in the KV cache."""
        need = self.request_bytes(dtype, block_size, max_model_len, batched_tokens, max_model_len)
        return mem.num_gpu_blocks >= 2 and need <= (mem.num_gpu_blocks - 1) * mem.page_bytes

    def largest_fitting_len(
        self, mem: _Memory, dtype: str, block_size: int, batched_tokens: int, ceiling: int
    ) -> int:
        """The largest max-model-len (a multiple of the block size) one request of which fits."""
        lo, hi = 0, ceiling
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.preflight_ok(mem, dtype, block_size, batched_tokens, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    # --- the decisions ----------------------------------------------------------------------

    def batched_tokens(self) -> int:
        default_tokens, _ = self.runtime.defaults_for_memory(
            self.gpu.cuda_total_bytes, self.gpu.name
        )
        if self.pins.max_num_batched_tokens is not None:
            self._pinned("max-num-batched-tokens", str(self.pins.max_num_batched_tokens))
            return self.pins.max_num_batched_tokens
        return default_tokens

    def chunked_step_seconds(
        self, dtype: str, bs: int, num_seqs: int, chunk_tokens: int, max_model_len: int,
        batched: int,
    ) -> float:
        """A step that decodes ``num_seqs`` median sessions and prefills ``chunk_tokens``:
        the bandwidth-bound decode plus the compute-bound chunk (conservatively additive)."""
        per_seq = self.request_bytes(
            dtype, bs, min(self.p50_session, max_model_len), batched, max_model_len)
        decode_s = decode.decode_step_seconds(
            self.model, self.gpu, self.tp, self.weights_bytes, num_seqs, per_seq)
        bits = weight_bits(self.model, self.req.weights_dtype)
        return decode_s + chunk_tokens * decode.prefill_seconds_per_token(
            self.model, self.gpu, self.tp, bits)

    def tune_batched_tokens(
        self, default: int, dtype: str, bs: int, num_seqs: int, utilization: float,
        max_model_len: int,
    ) -> int:
        """``prefill.step_token_budget`` for this pool (pinned: left alone)."""
        if self.pins.max_num_batched_tokens is not None:
            return default
        bits = weight_bits(self.model, self.req.weights_dtype)

        def fits(tokens: int) -> bool:
            mem = self.memory(dtype, bs, num_seqs, tokens, utilization)
            return self.preflight_ok(mem, dtype, bs, tokens, max_model_len)

        result = prefill.step_token_budget(
            default_tokens=default,
            num_seqs=num_seqs,
            prompt_tokens=self.req.profile.context_tokens.p95,
            decode_seconds=self.chunked_step_seconds(
                dtype, bs, num_seqs, 0, max_model_len, default),
            prefill_seconds_per_token=decode.prefill_seconds_per_token(
                self.model, self.gpu, self.tp, bits),
            ttft_slo_seconds=self.req.policy.slo.ttft_p95_seconds,
            fits=fits,
            default_label=f"vLLM {self.runtime.vllm_version}'s default for a "
            f"{_gib(self.gpu.cuda_total_bytes)} GPU",
        )
        self.warnings.extend(result.warnings)
        self.reasons.append(Reason(
            knob="max-num-batched-tokens", choice=str(result.tokens), code=result.code,
            message=result.message,
        ))
        return result.tokens

    def utilization(self) -> float:
        pinned = self.pins.gpu_memory_utilization
        if pinned is not None:
            # vLLM refuses to start when free memory is below the requested fraction, and the
            # CUDA context is never free.
            most = (self.gpu.cuda_total_bytes - budget.CUDA_CONTEXT_BYTES) / (
                self.gpu.cuda_total_bytes)
            if pinned > most:
                raise InvalidInput(
                    "pins.gpu_memory_utilization", pinned,
                    f"asks for {_gib(budget.requested_bytes(self.gpu, pinned))} of "
                    f"{self.gpu.name}'s {_gib(self.gpu.cuda_total_bytes)}, but the CUDA context "
                    f"takes about {_gib(budget.CUDA_CONTEXT_BYTES)}: vLLM would refuse to start; "
                    f"use at most {math.floor(most * 100) / 100:g}",
                )
            self._pinned("gpu-memory-utilization", f"{pinned:g}")
            return pinned
        util = budget.default_gpu_memory_utilization(self.gpu)
        outside = self.gpu.cuda_total_bytes - budget.requested_bytes(self.gpu, util)
        self.reasons.append(Reason(
            knob="gpu-memory-utilization", choice=f"{util:g}", code="LargestSafeFraction",
            message=(
                f"{util:g} of the CUDA total {_gib(self.gpu.cuda_total_bytes)} "
                f"({self.gpu.name}; NVML says {_gib(self.gpu.nvml_total_bytes)}) leaves "
                f"{_gib(outside)} outside vLLM for the CUDA context, allocator "
                "fragmentation and sidecars"
            ),
        ))
        return util

    def max_model_len_target(self) -> tuple[int, str, str]:
        """(tokens, code, message) before the pre-flight check."""
        profile, model = self.req.profile, self.model
        floor = self.req.policy.min_max_model_len_tokens or 1
        if self.pins.max_model_len is not None:
            return self.pins.max_model_len, PINNED, "pinned by the policy"
        high = session_tokens(profile, "p99")
        top = session_tokens(profile, "max")
        # Take the observed maximum when it is close to p99 (fixed or bounded lengths);
        # otherwise the p99 with headroom, so rare outliers do not size every request.
        if top <= high * MAX_MODEL_LEN_HEADROOM:
            basis, raw = f"the longest session ({top} tokens)", top
        else:
            basis, raw = (
                f"p99 prompt + p99 output ({high} tokens) with "
                f"{MAX_MODEL_LEN_HEADROOM - 1:.0%} headroom",
                math.ceil(high * MAX_MODEL_LEN_HEADROOM),
            )
        tokens = -(-raw // MAX_MODEL_LEN_ROUNDING_TOKENS) * MAX_MODEL_LEN_ROUNDING_TOKENS
        code = "HighQuantileOfSessions"
        message = f"{basis}, rounded up to a multiple of {MAX_MODEL_LEN_ROUNDING_TOKENS}"
        if tokens > model.max_position_embeddings:
            tokens = model.max_position_embeddings
            code = "CappedByModel"
            message += f", capped by max_position_embeddings={model.max_position_embeddings}"
        if tokens < floor:
            tokens = floor
            code = "PolicyMinimum"
            message += f", raised to the policy's guaranteed {floor}"
        if top > tokens:
            self.warnings.append(
                f"max-model-len {tokens} is below the longest observed session ({top} "
                "tokens): vLLM rejects such requests; pin max_model_len or set "
                "min_max_model_len_tokens to serve them"
            )
        return tokens, code, message

    def tpot_target(self) -> tuple[float, str]:
        tpot = self.req.policy.slo.tpot_p95_seconds
        if tpot is not None:
            return tpot, f"the TPOT p95 SLO of {tpot * 1000:.0f} ms"
        return DEFAULT_TPOT_SECONDS, (
            f"a default TPOT target of {DEFAULT_TPOT_SECONDS * 1000:.0f} ms (no SLO set)"
        )

    def bandwidth_seqs(
        self, dtype: str, block_size: int, batched_tokens: int, max_model_len: int,
        tpot: float,
    ) -> int:
        per_seq = self.request_bytes(
            dtype, block_size, min(self.p50_session, max_model_len), batched_tokens,
            max_model_len,
        )
        return decode.max_seqs_within(
            self.model, self.gpu, self.tp, self.weights_bytes, per_seq, tpot
        )

    def _pinned(self, knob: str, value: str) -> None:
        self.reasons.append(Reason(
            knob=knob, choice=value, code=PINNED, message=f"pinned by the policy to {value}"
        ))

    def dtype_options(self) -> list[KVCacheDType]:
        names = [n for n in _DTYPE_PREFERENCE if n in self.runtime.kv_cache_dtype_names]
        names += [n for n in self.runtime.kv_cache_dtype_names if n not in names]
        return [self.runtime.dtype(n) for n in names]

    def choose_dtype(
        self, block_size: int, batched_tokens: int, seqs_for_memory: int, utilization: float,
        max_model_len: int, target: int, target_why: str,
    ) -> str:
        floor_name = self.req.policy.lowest_kv_precision
        floor_bits = _PRECISION_FLOOR_BITS[floor_name]
        verdicts: list[CandidateVerdict] = []
        feasible: list[tuple[KVCacheDType, int]] = []
        for dtype in self.dtype_options():
            if dtype.name in ("float16", "bfloat16", "fp8_e4m3"):
                # Same pages as "auto" on a model of that dtype; "auto" speaks for them.
                continue
            unusable = self._dtype_unusable(dtype)
            if unusable is not None:
                check = NOT_MODELED if dtype.layout == "not_modeled" else UNSUPPORTED_BY_BACKEND
                verdicts.append(CandidateVerdict(
                    value=dtype.name, ok=False, check=check, detail=unusable))
                continue
            if dtype.bits < floor_bits:
                verdicts.append(CandidateVerdict(
                    value=dtype.name, ok=False, check=BELOW_QUALITY_FLOOR,
                    detail=f"{dtype.bits}-bit is below the policy's lowest precision "
                    f"{floor_name} ({floor_bits}-bit)",
                ))
                continue
            bs = block_size if self._block_size_ok(dtype.name, block_size) else (
                self._smallest_block(dtype.name)
            )
            mem = self.memory(dtype.name, bs, seqs_for_memory, batched_tokens, utilization)
            if not self.preflight_ok(mem, dtype.name, bs, batched_tokens, max_model_len):
                verdicts.append(CandidateVerdict(
                    value=dtype.name, ok=False, check=MAX_MODEL_LEN_DOES_NOT_FIT,
                    detail=f"one {max_model_len}-token request needs "
                    f"{_gib(self.request_bytes(dtype.name, bs, max_model_len, batched_tokens, max_model_len))}"  # noqa: E501
                    f", the KV cache has {_gib(max(0, mem.kv_budget_bytes))}",
                ))
                continue
            sessions = self.sessions(
                mem, dtype.name, bs, self.p95_session, batched_tokens, max_model_len
            )
            feasible.append((dtype, sessions))
            verdicts.append(CandidateVerdict(
                value=dtype.name, ok=sessions >= target,
                check=FITS if sessions >= target else TOO_FEW_SEQUENCES,
                detail=f"{sessions} sequences of {self.p95_session} tokens (p95) fit; "
                f"target {target}",
            ))
        if not feasible:
            raise self._no_fit(max_model_len, batched_tokens, utilization, verdicts)
        meeting = [(d, s) for d, s in feasible if s >= target]
        if meeting:
            chosen, sessions = meeting[0]  # the widest (preference order)
            code = "WidestThatMeetsConcurrency"
            message = (
                f"{chosen.name} ({chosen.bits}-bit) is the widest dtype that holds the target "
                f"{target} sequences at the p95 session of {self.p95_session} tokens "
                f"({sessions} fit); target from {target_why}"
            )
        else:
            chosen, sessions = max(feasible, key=lambda ds: ds[1])
            code = "MostSequencesAllowed"
            message = (
                f"no allowed dtype holds the target {target} sequences at {self.p95_session} "
                f"tokens; {chosen.name} holds the most ({sessions}) without going below "
                f"{floor_name}"
            )
            self.warnings.append(
                f"KV capacity limits concurrency: {sessions} sequences at the p95 session, "
                f"below the target {target}; a larger tensor parallel, a lower quality floor "
                "or a larger GPU would hold more"
            )
        verdicts = [
            v.model_copy(update={"check": CHOSEN}) if v.value == chosen.name
            else v.model_copy(update={"check": WIDER_MEETS_TARGET})
            if v.ok and self._narrower(v.value, chosen) else v
            for v in verdicts
        ]
        self.reasons.append(Reason(
            knob="kv-cache-dtype", choice=chosen.name, code=code, message=message,
            candidates=tuple(verdicts),
        ))
        return chosen.name

    def _narrower(self, name: str, chosen: KVCacheDType) -> bool:
        order = [d.name for d in self.dtype_options()]
        return name in order and order.index(name) > order.index(chosen.name)

    def _smallest_block(self, dtype_name: str) -> int:
        for bs in BLOCK_SIZE_CANDIDATES:
            if self._preferred_ok(dtype_name, bs):
                return bs
        backend = self._backend_for(dtype_name)
        if backend is not None and backend.block_sizes:
            return min(backend.block_sizes)
        return self.runtime.default_block_size

    def block_size_candidates(self, dtype_name: str) -> list[int]:
        if self.pins.block_size is not None:
            return [self.pins.block_size]
        return [bs for bs in BLOCK_SIZE_CANDIDATES if self._preferred_ok(dtype_name, bs)] or [
            self._smallest_block(dtype_name)]

    def closed_form_block_size(
        self, dtype_name: str, sessions: int, prefix_caching: bool
    ) -> tuple[int, Reason]:
        if self.pins.block_size is not None:
            return self.pins.block_size, Reason(
                knob="block-size", choice=str(self.pins.block_size), code=PINNED,
                message=f"pinned by the policy to {self.pins.block_size}",
            )
        backend = self._backend_for(dtype_name)
        verdicts: list[CandidateVerdict] = []
        scored: list[tuple[float, int]] = []
        shared = self.req.profile.shared_prefix_tokens
        for bs in BLOCK_SIZE_CANDIDATES:
            if not self._preferred_ok(dtype_name, bs):
                fallback = self._backend_for(dtype_name, bs)
                verdicts.append(CandidateVerdict(
                    value=str(bs), ok=False,
                    check=SWITCHES_BACKEND if fallback else UNSUPPORTED_BY_BACKEND,
                    detail=f"{backend.name if backend else 'the backend'} accepts "
                    f"{backend.block_size_rule(self.cc) if backend else 'none'}"
                    + (f"; vLLM would fall back to {fallback.name}" if fallback else ""),
                ))
                continue
            # Half a block per running sequence is allocated but empty on average; only
            # full blocks are prefix-cached, so a shared prefix loses its partial tail.
            frag = max(1, sessions) * bs / 2
            prefix_loss = (shared % bs if shared else bs / 2) if prefix_caching else 0.0
            waste = frag + prefix_loss * max(1, sessions)
            scored.append((waste, bs))
            verdicts.append(CandidateVerdict(
                value=str(bs), ok=True, check=FITS,
                detail=f"~{frag:.0f} tokens fragmented across {max(1, sessions)} sequences"
                + (f", ~{prefix_loss:.0f} prefix tokens per request not cacheable"
                   if prefix_caching else ""),
            ))
        if not scored:
            bs = self._smallest_block(dtype_name)
            return bs, Reason(
                knob="block-size", choice=str(bs), code="BackendRequires",
                message=f"{backend.name if backend else 'the backend'} accepts only "
                f"{backend.block_size_rule(self.cc) if backend else bs}",
                candidates=tuple(verdicts),
            )
        waste, bs = min(scored)
        verdicts = [
            v.model_copy(update={"check": CHOSEN}) if v.value == str(bs)
            else (v.model_copy(update={"check": MORE_WASTE}) if v.ok else v)
            for v in verdicts
        ]
        return bs, Reason(
            knob="block-size", choice=str(bs), code="LeastWaste",
            message=(
                f"{bs} tokens: the least fragmentation and prefix-granularity loss among the "
                f"sizes {backend.name if backend else 'the backend'} accepts "
                f"({backend.block_size_rule(self.cc) if backend else ''}); about {waste:.0f} "
                "tokens of KV held but unused"
            ),
            candidates=tuple(verdicts),
        )

    def prefix_caching(self) -> bool:
        if self.pins.enable_prefix_caching is not None:
            self._pinned("enable-prefix-caching", str(self.pins.enable_prefix_caching).lower())
            return self.pins.enable_prefix_caching
        p = self.req.profile
        if p.prefix_hit_rate is not None and p.prefix_hit_rate < 0.01 and (
            p.shared_prefix_tokens == 0 and not p.multi_turn
        ):
            self.reasons.append(Reason(
                knob="enable-prefix-caching", choice="false", code="NoSharing",
                message=f"observed prefix hit rate {p.prefix_hit_rate:.3f} and no shared "
                "prefix: hashing every block would cost CPU for no hits",
            ))
            return False
        why = []
        if p.shared_prefix_tokens:
            why.append(f"a shared prefix of {p.shared_prefix_tokens} tokens")
        if p.prefix_hit_rate is not None:
            why.append(f"prefix hit rate {p.prefix_hit_rate:.2f}")
        if p.multi_turn:
            why.append("multi-turn requests re-send their history")
        if not why:
            why.append("sharing unknown; vLLM's default, and a miss costs only a hash")
        self.reasons.append(Reason(
            knob="enable-prefix-caching", choice="true", code="PrefixSharing",
            message="; ".join(why),
        ))
        return True

    def offload(self) -> float | None:
        pin = self.pins.kv_offloading_size_gib
        if pin is not None:
            self._pinned("kv-offloading-size", f"{pin:g}" if pin else "off")
            return pin if pin > 0 else None
        cpu_budget = self.req.policy.cpu_offload_budget_bytes
        p = self.req.profile
        reusable = p.multi_turn or (p.prefix_hit_rate or 0.0) >= 0.3
        if cpu_budget <= 0 or not reusable:
            self.reasons.append(Reason(
                knob="kv-offloading-size", choice="off", code="NoOffload",
                message="no CPU memory budget for KV in the policy" if cpu_budget <= 0 else
                "little prefix reuse: offloaded blocks would rarely be read back",
            ))
            return None
        # vLLM takes the size in GiB across all TP ranks.
        size = math.floor(cpu_budget * self.tp / GiB)
        if size < 1:
            self.reasons.append(Reason(
                knob="kv-offloading-size", choice="off", code="NoOffload",
                message=f"the CPU budget ({_gib(cpu_budget)} per GPU) is below 1 GiB",
            ))
            return None
        self.reasons.append(Reason(
            knob="kv-offloading-size", choice=f"{size}", code="ReusableKV",
            message=f"{size} GiB of CPU memory across {self.tp} rank(s) keeps evicted prefix "
            "blocks for later turns (multi-turn or prefix reuse)",
        ))
        return float(size)

    # --- failure ------------------------------------------------------------------------------

    def _fits_with(
        self, tp: int, weights_dtype: str, dtype: str, max_model_len: int, batched: int,
        utilization: float,
    ) -> bool:
        try:
            req = self.req.model_copy(update={
                "tensor_parallel": tp, "weights_dtype": weights_dtype,
                "policy": self.req.policy.model_copy(update={"pins": self.pins.model_copy(
                    update={"kv_cache_dtype": None})}),
            })
            other = _Planner(req)
        except InvalidInput:
            return False
        bs = other._smallest_block(dtype)
        mem = other.memory(dtype, bs, other.seqs_for_memory, batched, utilization)
        return other.preflight_ok(mem, dtype, bs, batched, max_model_len)

    def _no_fit(
        self, max_model_len: int, batched: int, utilization: float,
        verdicts: Sequence[CandidateVerdict],
    ) -> NoFeasiblePlan:
        # Bytes are quoted at the policy's narrowest allowed dtype (what could have fitted).
        floor_bits = _PRECISION_FLOOR_BITS[self.req.policy.lowest_kv_precision]
        allowed = [
            d.name for d in self.dtype_options()
            if self._dtype_unusable(d) is None and d.bits >= floor_bits
        ] or ["auto"]
        narrowest = self.pins.kv_cache_dtype or min(allowed, key=lambda name: kv_bytes_per_token(
            self.model, name, self.tp, model_dtype=self.model_dtype))
        bs = self._smallest_block(narrowest)
        mem = self.memory(narrowest, bs, self.seqs_for_memory, batched, utilization)
        need = mem.non_kv.total_bytes + self.request_bytes(
            narrowest, bs, max_model_len, batched, max_model_len
        ) + mem.page_bytes
        available = budget.requested_bytes(self.gpu, utilization)
        if self.pins.kv_cache_memory_bytes is not None:
            available = mem.non_kv.total_bytes + self.pins.kv_cache_memory_bytes
        suggestions: list[str] = []
        for tp in (2, 4, 8):
            if tp > self.tp and self._fits_with(
                tp, self.req.weights_dtype, narrowest, max_model_len, batched, utilization
            ):
                suggestions.append(f"tensor parallel {tp}")
                break
        if weight_bits(self.model, self.req.weights_dtype) > 8 and self._fits_with(
            self.tp, "fp8", narrowest, max_model_len, batched, utilization
        ):
            suggestions.append("FP8 weights (--weights-dtype fp8)")
        for d in self.dtype_options():
            if d.bits < floor_bits and self._dtype_unusable(d) is None:
                m = self.memory(d.name, self._smallest_block(d.name), self.seqs_for_memory,
                                batched, utilization)
                if self.preflight_ok(m, d.name, self._smallest_block(d.name), batched,
                                     max_model_len):
                    suggestions.append(
                        f"a lower KV precision floor ({d.name}, {d.bits}-bit)")
                    break
        longest = self.largest_fitting_len(
            mem, narrowest, bs, batched, max_model_len
        ) if mem.num_gpu_blocks >= 2 else 0
        if longest >= 256:
            suggestions.append(f"max-model-len {longest // 256 * 256}")
        relevant = (MAX_MODEL_LEN_DOES_NOT_FIT, TOO_FEW_SEQUENCES, BELOW_QUALITY_FLOOR)
        detail = "; ".join(
            f"{v.value}: {v.detail}" for v in verdicts if not v.ok and v.check in relevant
        ) or "none"
        what = (
            "the weights and runtime buffers alone do not fit"
            if mem.non_kv.total_bytes >= available
            else f"one {max_model_len}-token request does not fit"
        )
        return NoFeasiblePlan(
            f"{self.model.hf_id} on {self.gpu.name} at TP {self.tp} with "
            f"{self.req.weights_dtype} weights: {what}. Needed {_gib(need)} "
            f"({_gib(mem.non_kv.weights_bytes)} weights, "
            f"{_gib(mem.non_kv.total_bytes - mem.non_kv.weights_bytes)} activations/CUDA "
            f"graphs/buffers, the rest KV), available {_gib(available)} of "
            f"{_gib(self.gpu.cuda_total_bytes)} at gpu-memory-utilization {utilization:g}. "
            f"Candidates: {detail}.",
            needed_bytes=need, available_bytes=available, suggestions=suggestions,
        )

    # --- the run ------------------------------------------------------------------------------

    def plan(self, scorer: CandidateScorer | None) -> PoolPlan:
        batched = self.batched_tokens()
        utilization = self.utilization()
        seqs_for_memory = self.seqs_for_memory
        prefix_caching = self.prefix_caching()
        max_model_len, len_code, len_message = self.max_model_len_target()
        self._len_target = max_model_len

        # Weights and fixed overheads alone must fit before any KV question makes sense.
        probe = self.memory("auto", 16, seqs_for_memory, batched, utilization)
        if probe.kv_budget_bytes <= 0:
            raise self._no_fit(max_model_len, batched, utilization, ())
        pinned_kv = self.pins.kv_cache_memory_bytes
        if pinned_kv is not None:
            # vLLM allocates exactly this much without profiling: it must fit beside the
            # weights and buffers, leaving the CUDA context its share.
            room = self.gpu.cuda_total_bytes - budget.CUDA_CONTEXT_BYTES - probe.non_kv.total_bytes
            if pinned_kv > room:
                raise InvalidInput(
                    "pins.kv_cache_memory_bytes", pinned_kv,
                    f"{_gib(pinned_kv)} of KV does not fit beside {_gib(probe.non_kv.total_bytes)} "
                    f"of weights and buffers on {self.gpu.name} ({_gib(self.gpu.cuda_total_bytes)} "
                    f"total); at most {max(0, room)} bytes ({_gib(max(0, room))})",
                )

        tpot, tpot_why = self.tpot_target()
        base_dtype = "auto" if self._dtype_unusable(self.runtime.dtype("auto")) is None else (
            self.pins.kv_cache_dtype or "auto"
        )
        bs_probe = self.pins.block_size or self._smallest_block(base_dtype)
        if self.req.policy.target_concurrent_sequences is not None:
            target = self.req.policy.target_concurrent_sequences
            target_why = "the policy's target_concurrent_sequences"
        else:
            target = max(1, min(seqs_for_memory, self.bandwidth_seqs(
                base_dtype, bs_probe, batched, max_model_len, tpot)))
            target_why = (
                f"the decode bandwidth model: {target} sequences of the median session "
                f"({self.p50_session} tokens) at 16-bit KV keep a decode step within {tpot_why}"
            )

        # Pre-flight may shrink an unpinned max-model-len to what the narrowest allowed
        # dtype fits, but never below the policy's floor or the p95 session.
        if self.pins.kv_cache_dtype is not None:
            dtype = self.pins.kv_cache_dtype
            bs0 = self.pins.block_size or self._smallest_block(dtype)
            mem = self.memory(dtype, bs0, seqs_for_memory, batched, utilization)
            if not self.preflight_ok(mem, dtype, bs0, batched, max_model_len):
                max_model_len, len_code, len_message = self._shrink_len(
                    mem, dtype, bs0, batched, max_model_len, len_code, len_message,
                    utilization)
            sessions = self.sessions(mem, dtype, bs0, self.p95_session, batched, max_model_len)
            self.reasons.append(Reason(
                knob="kv-cache-dtype", choice=dtype, code=PINNED,
                message=f"pinned by the policy; {sessions} sequences of {self.p95_session} "
                "tokens (p95) fit",
            ))
        else:
            dtype, (max_model_len, len_code, len_message) = self._choose_dtype_with_preflight(
                bs_probe, batched, seqs_for_memory, utilization, max_model_len, target,
                target_why, len_code, len_message)

        # max-num-seqs: bandwidth model at the chosen dtype, capped by what fits.
        bs = self.pins.block_size or self._smallest_block(dtype)
        mem = self.memory(dtype, bs, seqs_for_memory, batched, utilization)
        fit_p50 = self.sessions(mem, dtype, bs, self.p50_session, batched, max_model_len)
        if self.pins.max_num_seqs is not None:
            max_num_seqs = self.pins.max_num_seqs
            self._pinned("max-num-seqs", str(max_num_seqs))
        else:
            bw = self.bandwidth_seqs(dtype, bs, batched, max_model_len, tpot)
            if bw == 0:
                self.warnings.append(
                    f"even one sequence misses {tpot_why}: reading "
                    f"{_gib(self.weights_bytes)} of weights per step takes longer; more "
                    "tensor parallel or lower-precision weights would help"
                )
            seqs = max(1, min(bw, fit_p50, MAX_NUM_SEQS_CEILING, batched))
            if seqs >= 16:
                seqs = seqs // 8 * 8  # CUDA-graph capture sizes are multiples of 8
            max_num_seqs = seqs
            limit = "bandwidth" if bw <= fit_p50 else "KV capacity"
            self.reasons.append(Reason(
                knob="max-num-seqs", choice=str(max_num_seqs), code=(
                    "DecodeBandwidth" if limit == "bandwidth" else "KVCapacity"),
                message=(
                    f"{bw} sequences of the median session keep a decode step within "
                    f"{tpot_why}; {fit_p50} median sessions fit in the KV cache; the "
                    f"{limit} limit binds"
                ),
            ))
        if len_code == "LargestThatFits":
            # The length was shrunk with memory for the default max-num-seqs; the sampler
            # needs less for fewer sequences, which leaves room for a longer request.
            final = self.memory(dtype, bs, max_num_seqs, batched, utilization)
            longer = self.largest_fitting_len(
                final, dtype, bs, batched, self._len_target) // bs * bs
            if longer > max_model_len:
                len_message = len_message.replace(str(max_model_len), str(longer))
                self.warnings = [w.replace(f"to {max_model_len}:", f"to {longer}:")
                                 for w in self.warnings]
                max_model_len = longer
        self.reasons.append(Reason(
            knob="max-model-len", choice=str(max_model_len), code=len_code, message=len_message,
        ))
        batched = self.tune_batched_tokens(
            batched, dtype, bs, max_num_seqs, utilization, max_model_len)
        offload = self.offload()

        plan = KVPlan(
            block_size=bs,
            kv_cache_dtype=dtype,
            gpu_memory_utilization=utilization,
            kv_cache_memory_bytes=self.pins.kv_cache_memory_bytes,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max(batched, max_num_seqs),
            enable_prefix_caching=prefix_caching,
            kv_offloading_size_gib=offload,
            kv_offloading_backend="native" if offload else None,
            attention_backend=self.pins.attention_backend,
        )
        block_reason: Reason
        chosen_score: CandidateScore | None = None
        if scorer is not None:
            plan, block_reason, chosen_score = self._scored(plan, scorer, fit_p50)
        else:
            sessions_p95 = self.sessions(
                mem, dtype, bs, self.p95_session, batched, max_model_len)
            bs, block_reason = self.closed_form_block_size(dtype, sessions_p95, prefix_caching)
            plan = plan.model_copy(update={"block_size": bs})
        self.reasons.append(block_reason)
        if not self.preflight_ok(
            self.memory(plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs, batched,
                        utilization),
            plan.kv_cache_dtype, plan.block_size, batched, plan.max_model_len,
        ):
            raise self._no_fit(plan.max_model_len, batched, utilization, ())
        backend = self._backend_for(plan.kv_cache_dtype, plan.block_size)
        preferred = self._backend_for(plan.kv_cache_dtype)
        if backend is not None and preferred is not None and backend.name != preferred.name:
            self.warnings.append(
                f"block size {plan.block_size} makes vLLM fall back from {preferred.name} to "
                f"{backend.name} for {plan.kv_cache_dtype} KV ({preferred.name} accepts "
                f"{preferred.block_size_rule(self.cc)})"
            )
        if backend is not None and plan.attention_backend is None:
            self.reasons.append(Reason(
                knob="attention-backend", choice=f"auto ({backend.name})", code="RuntimePicks",
                message=f"vLLM picks {backend.name} for {plan.kv_cache_dtype} KV on compute "
                f"capability {self.cc[0]}.{self.cc[1]}; not pinned so upgrades keep their "
                "choice",
            ))
        return PoolPlan(
            model_id=self.model.hf_id,
            gpu_class=self.gpu.name,
            tensor_parallel=self.tp,
            vllm_version=self.runtime.vllm_version,
            plan=plan,
            expected=self.expected(plan, chosen_score),
            reasons=tuple(self.reasons),
            warnings=tuple(self.warnings),
        )

    _len_target: int

    def _choose_dtype_with_preflight(
        self, bs: int, batched: int, seqs: int, utilization: float, max_model_len: int,
        target: int, target_why: str, len_code: str, len_message: str,
    ) -> tuple[str, tuple[int, str, str]]:
        """The dtype, and max-model-len with its (code, message), lowered to what fits when
        no allowed dtype passes pre-flight at the target length (and it is not pinned)."""
        try:
            dtype = self.choose_dtype(
                bs, batched, seqs, utilization, max_model_len, target, target_why)
            return dtype, (max_model_len, len_code, len_message)
        except NoFeasiblePlan:
            if self.pins.max_model_len is not None:
                raise
        # Shrink for the allowed dtype with the fewest bytes per token, then choose again.
        floor_bits = _PRECISION_FLOOR_BITS[self.req.policy.lowest_kv_precision]
        allowed = [
            d.name for d in self.dtype_options()
            if self._dtype_unusable(d) is None and d.bits >= floor_bits
        ]
        if not allowed:
            raise self._no_fit(max_model_len, batched, utilization, ())
        narrowest = min(allowed, key=lambda name: kv_bytes_per_token(
            self.model, name, self.tp, model_dtype=self.model_dtype))
        nbs = self._smallest_block(narrowest)
        mem = self.memory(narrowest, nbs, seqs, batched, utilization)
        length = self._shrink_len(
            mem, narrowest, nbs, batched, max_model_len, len_code, len_message, utilization)
        dtype = self.choose_dtype(bs, batched, seqs, utilization, length[0], target, target_why)
        return dtype, length

    def _shrink_len(
        self, mem: _Memory, dtype: str, bs: int, batched: int, max_model_len: int,
        len_code: str, len_message: str, utilization: float,
    ) -> tuple[int, str, str]:
        if self.pins.max_model_len is not None:
            raise self._no_fit(max_model_len, batched, utilization, ())
        longest = self.largest_fitting_len(mem, dtype, bs, batched, max_model_len)
        longest = longest // bs * bs
        floor = max(self.req.policy.min_max_model_len_tokens or 1, self.p95_session)
        if longest < floor:
            raise self._no_fit(max(floor, 1), batched, utilization, ())
        self.warnings.append(
            f"max-model-len lowered from {max_model_len} to {longest}: one longer request "
            f"would not fit in the KV cache ({dtype}), and vLLM would refuse to start"
        )
        return longest, "LargestThatFits", (
            f"{len_message}; lowered to {longest}, the longest request the KV cache holds "
            "(pre-flight)"
        )

    def _scored(
        self, plan: KVPlan, scorer: CandidateScorer, fit_p50: int
    ) -> tuple[KVPlan, Reason, CandidateScore]:
        base = plan.max_num_seqs
        seq_options = sorted({
            max(1, s) for s in (base // 2, base * 3 // 4, base, base * 5 // 4, base * 3 // 2)
            if s <= max(base, fit_p50)
        } | ({self.pins.max_num_seqs} if self.pins.max_num_seqs else set()))
        if self.pins.max_num_seqs is not None:
            seq_options = [self.pins.max_num_seqs]
        candidates = [
            c for c in (
                plan.model_copy(update={
                    "block_size": bs, "max_num_seqs": s,
                    "max_num_batched_tokens": max(plan.max_num_batched_tokens, s),
                })
                for bs in self.block_size_candidates(plan.kv_cache_dtype)
                for s in seq_options
            )
            # Larger blocks round a request up further: offer only what passes pre-flight.
            if self.preflight_ok(
                self.memory(c.kv_cache_dtype, c.block_size, c.max_num_seqs,
                            c.max_num_batched_tokens, c.gpu_memory_utilization),
                c.kv_cache_dtype, c.block_size, c.max_num_batched_tokens, c.max_model_len)
        ] or [plan]
        scores = list(scorer(self.req, candidates))
        if len(scores) != len(candidates):
            raise InvalidInput(
                "scorer", type(scorer).__name__,
                f"returned {len(scores)} scores for {len(candidates)} candidates",
            )
        picked = scored.pick_scored(scores, self.req.policy.slo)
        best, code, verdicts = picked.best, picked.code, picked.verdicts
        if picked.warning is not None:
            self.warnings.append(picked.warning)
        chosen = best.plan
        reason = Reason(
            knob="block-size", choice=str(chosen.block_size), code=code,
            message=(
                f"scored {len(scores)} candidates (block size x max-num-seqs) on the workload; "
                f"block {chosen.block_size} with {chosen.max_num_seqs} sequences: "
                f"{best.summary}"
            ),
            candidates=verdicts,
        )
        if chosen.max_num_seqs != plan.max_num_seqs:
            self.reasons.append(Reason(
                knob="max-num-seqs", choice=str(chosen.max_num_seqs), code=code,
                message=f"the scorer preferred {chosen.max_num_seqs} over the bandwidth "
                f"model's {plan.max_num_seqs}: {best.summary}",
            ))
        return chosen, reason, best

    def expected(
        self, plan: KVPlan, score: CandidateScore | None
    ) -> ExpectedFigures:
        batched = plan.max_num_batched_tokens
        mem = self.memory(
            plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs, batched,
            plan.gpu_memory_utilization,
        )
        sessions = self.sessions(
            mem, plan.kv_cache_dtype, plan.block_size, self.p95_session, batched,
            plan.max_model_len,
        )
        per_seq = self.request_bytes(
            plan.kv_cache_dtype, plan.block_size, min(self.p50_session, plan.max_model_len),
            batched, plan.max_model_len,
        )
        step = decode.decode_step_seconds(
            self.model, self.gpu, self.tp, self.weights_bytes, plan.max_num_seqs, per_seq
        )
        return ExpectedFigures(
            kv_bytes_per_token=kv_bytes_per_token(
                self.model, plan.kv_cache_dtype, self.tp, model_dtype=self.model_dtype),
            kv_cache_bytes=mem.kv_cache_bytes,
            # As vLLM logs it ("GPU KV cache size: N tokens"): max-model-len requests that
            # fit times max-model-len; num_blocks x block_size for single-kind models.
            kv_cache_tokens=int(mem.num_gpu_blocks / request_blocks(
                self.model, plan.max_model_len, plan.block_size, batched, plan.max_model_len,
            ) * plan.max_model_len),
            num_gpu_blocks=mem.num_gpu_blocks,
            weights_bytes_per_gpu=self.weights_bytes,
            non_kv_bytes_per_gpu=mem.non_kv.total_bytes,
            concurrent_sequences=sessions,
            concurrent_sequences_context_tokens=min(self.p95_session, plan.max_model_len),
            decode_step_seconds=round(step, 6),
            prefix_hit_rate=score.prefix_hit_rate if score is not None else None,
        )


def plan_pool(request: PlanRequest, scorer: CandidateScorer | None = None) -> PoolPlan:
    """Plan one pool. Pure: no I/O. Raises ``NoFeasiblePlan`` when nothing fits and
    ``InvalidInput`` for a pin or input that can never work."""
    return _Planner(request).plan(scorer)


def preflight(request: PlanRequest, plan: KVPlan) -> tuple[bool, int, int]:
    """(ok, bytes one max-model-len request needs, KV bytes available) for any plan, e.g. one
    a human wrote: vLLM refuses to start unless ``ok``."""
    planner = _Planner(request.model_copy(update={"policy": PlanPolicy()}))
    batched = plan.max_num_batched_tokens
    mem = planner.memory(
        plan.kv_cache_dtype, plan.block_size, plan.max_num_seqs, batched,
        plan.gpu_memory_utilization,
    )
    if plan.kv_cache_memory_bytes is not None:
        page = mem.page_bytes
        mem = _Memory(mem.non_kv, plan.kv_cache_memory_bytes, page,
                      plan.kv_cache_memory_bytes // page)
    need = planner.request_bytes(
        plan.kv_cache_dtype, plan.block_size, plan.max_model_len, batched, plan.max_model_len)
    ok = planner.preflight_ok(
        mem, plan.kv_cache_dtype, plan.block_size, batched, plan.max_model_len)
    return ok, need, max(0, (mem.num_gpu_blocks - 1) * mem.page_bytes)


def kv_capacity_by_dtype(request: PlanRequest) -> dict[str, int]:
    """Concurrent p95 sessions per usable KV dtype at the planner's other choices (what the
    table's dtype comparison shows). Ignores the quality floor."""
    planner = _Planner(request.model_copy(update={"policy": PlanPolicy(
        slo=request.policy.slo, lowest_kv_precision="int4")}))
    out: dict[str, int] = {}
    batched, _ = planner.runtime.defaults_for_memory(request.gpu.cuda_total_bytes,
                                                     request.gpu.name)
    util = budget.default_gpu_memory_utilization(request.gpu)
    mml, _, _ = planner.max_model_len_target()
    for d in planner.dtype_options():
        if d.name in ("float16", "bfloat16", "fp8_e4m3") or planner._dtype_unusable(d) is not None:
            continue
        bs = planner._smallest_block(d.name)
        mem = planner.memory(d.name, bs, MAX_NUM_SEQS_CEILING, batched, util)
        out[d.name] = planner.sessions(mem, d.name, bs, planner.p95_session, batched, mml)
    return out
