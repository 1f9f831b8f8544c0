"""Checks the operator's plan against the GPUs NVML reports and decides the final memory knob.

A chain of plain checks, each either passing (maybe with a note) or refusing with a message
that quotes what the plan expected, what the node has, and the knob to change. "Refuse" is an
exception (``PlanDoesNotFit``) because the only thing the entrypoint can do then is exit
before vLLM half-starts and OOMs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvtune.tuner.knobs import BY_NAME, FLAG_TO_NAME, TENSOR_PARALLEL_FLAG
from kvtune.tuner.units import GiB as GIB

from .gpus import GPU_CLASSES, GpuInfo, class_of
from .runtime_plan import RuntimePlan

# vLLM takes its free-memory snapshot after CUDA and torch have initialised, which costs
# roughly 0.5 GiB per GPU on Hopper; NVML's free figure is read before that. Keep 1 GiB back.
DEFAULT_CONTEXT_RESERVE_BYTES = 1 * GIB

# The fraction is rounded down to this step so the flag stays readable and never rounds up
# past the memory really free.
_UTIL_STEP = 0.001


class PlanDoesNotFit(Exception):
    """The plan cannot start on this node; the message says expected vs found and the fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # CamelCase, e.g. "WrongGpuClass"
        self.message = message


@dataclass(frozen=True)
class Decision:
    gpu_class: str
    gpus: tuple[GpuInfo, ...]  # the GPUs vLLM will use (the first tensor_parallel visible)
    planned_gpu_memory_utilization: float
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None  # set when the plan sizes the KV cache in bytes
    planned_kv_cache_bytes: int
    kv_cache_bytes: int  # per GPU, what this node will give the KV cache
    planned_kv_cache_tokens: int
    kv_cache_tokens: int
    recomputed: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_report(self) -> dict[str, Any]:
        return {
            "gpuClass": self.gpu_class,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "totalBytes": g.total_bytes,
                    "freeBytes": g.free_bytes,
                    "computeCapability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                    "mig": g.mig,
                }
                for g in self.gpus
            ],
            "gpuMemoryUtilization": {
                "planned": self.planned_gpu_memory_utilization,
                "actual": self.gpu_memory_utilization,
            },
            "kvCacheMemoryBytes": self.kv_cache_memory_bytes,
            "kvCacheBytesPerGpu": {
                "expected": self.planned_kv_cache_bytes,
                "actual": self.kv_cache_bytes,
            },
            "kvCacheTokens": {
                "expected": self.planned_kv_cache_tokens,
                "actual": self.kv_cache_tokens,
            },
            "recomputed": self.recomputed,
            "notes": list(self.notes),
        }


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


def check_gpus(plan: RuntimePlan, gpus: list[GpuInfo]) -> tuple[GpuInfo, ...]:
    """The GPUs vLLM will use, after checking their count, class and architecture."""
    tp = plan.tensor_parallel
    wanted = plan.gpu_class.upper()
    if len(gpus) < tp:
        found = "; ".join(g.describe() for g in gpus) or "no GPU"
        raise PlanDoesNotFit(
            "TooFewGpus",
            f"the plan needs {tp} x {wanted} (tensor parallel {tp}), found {len(gpus)} visible: "
            f"{found}. Fix: request nvidia.com/gpu: {tp} on the pod, or lower the pool's "
            "tensorParallel.",
        )
    used = tuple(gpus[:tp])
    expected_cls = GPU_CLASSES.get(wanted)
    for gpu in used:
        found_cls = class_of(gpu)
        # A class kvtune has data for is matched by its NVML product names; a custom class
        # (declared in the pool, nodes picked by their kvtune.io/gpu-class label) has none.
        name_ok = expected_cls is None or (found_cls or "").upper() == wanted
        if not name_ok:
            raise PlanDoesNotFit(
                "WrongGpuClass",
                f"the plan was made for {wanted}, found {gpu.describe()} (class "
                f"{found_cls or 'unknown'}). Fix: check the pool's node selector and the node's "
                "nvidia.com/gpu.product label, or re-plan for this GPU class.",
            )
        if expected_cls and gpu.compute_capability[0] != expected_cls.compute_capability_major:
            raise PlanDoesNotFit(
                "WrongComputeCapability",
                f"{wanted} is SM {expected_cls.compute_capability_major}.x, found "
                f"{gpu.describe()}; the plan's KV dtype and attention backend were chosen for "
                f"SM {expected_cls.compute_capability_major}.x. Fix: re-plan for this GPU.",
            )
    return used


def decide(
    plan: RuntimePlan,
    gpus: list[GpuInfo],
    context_reserve_bytes: int = DEFAULT_CONTEXT_RESERVE_BYTES,
) -> Decision:
    """Check ``plan`` against ``gpus`` and size the memory knob to what is really free.

    vLLM asks for ceil(total x gpu_memory_utilization) bytes per GPU and fails at start when
    free memory is below that (``request_memory`` in vllm/v1/worker/utils.py). The KV cache
    gets that budget minus the non-KV bytes (weights, activations, CUDA graphs), which the
    plan's expected figures carry. Every rank gets the same budget, so the GPU with the least
    free memory decides.
    """
    used = check_gpus(plan, gpus)
    knobs, expected = plan.plan, plan.expected
    total = min(g.total_bytes for g in used)
    tightest = min(used, key=lambda g: g.free_bytes)
    usable = tightest.free_bytes - context_reserve_bytes
    notes: list[str] = []
    one_sequence_bytes = expected.kv_bytes_per_token * knobs.max_model_len
    need_bytes = expected.non_kv_bytes_per_gpu + one_sequence_bytes

    util, kv_memory, kv_bytes, recomputed = _fit_memory_knob(plan, total, usable)

    if kv_bytes < one_sequence_bytes or usable <= 0:
        fit_tokens = max(0, kv_bytes) // expected.kv_bytes_per_token
        raise PlanDoesNotFit(
            "InsufficientGpuMemory",
            f"the plan needs {_gib(need_bytes)} per GPU "
            f"(non-KV {_gib(expected.non_kv_bytes_per_gpu)} + KV for one "
            f"{knobs.max_model_len}-token sequence {_gib(one_sequence_bytes)}), "
            f"found {tightest.describe()} with {_gib(max(usable, 0))} usable after a "
            f"{_gib(context_reserve_bytes)} CUDA-context reserve; the KV cache would hold "
            f"{fit_tokens} tokens. Fix: free the GPU (another process or a smaller MIG slice "
            f"holds it), lower max-model-len to at most {fit_tokens} (spec.tuning.pin), or "
            "raise the pool's tensorParallel.",
        )

    if recomputed:
        where = f"{tightest.describe()} has {_gib(usable)} usable"
        if kv_memory is not None:
            notes.append(
                f"kv-cache-memory-bytes lowered from {knobs.kv_cache_memory_bytes} to "
                f"{kv_memory}: {where}"
            )
        else:
            notes.append(
                f"gpu-memory-utilization lowered from {knobs.gpu_memory_utilization:.4g} to "
                f"{util:.4g}: {where}, the plan "
                f"asked for {_gib(math.ceil(total * knobs.gpu_memory_utilization))}"
            )
    block = knobs.block_size
    tokens = (kv_bytes // expected.kv_bytes_per_token) // block * block
    if expected.kv_cache_tokens and tokens < expected.kv_cache_tokens:
        notes.append(
            f"KV cache holds {tokens} tokens, {tokens / expected.kv_cache_tokens:.0%} of the "
            f"{expected.kv_cache_tokens} planned"
        )
    return Decision(
        gpu_class=plan.gpu_class.upper(),
        gpus=used,
        planned_gpu_memory_utilization=knobs.gpu_memory_utilization,
        gpu_memory_utilization=util,
        kv_cache_memory_bytes=kv_memory,
        planned_kv_cache_bytes=expected.kv_cache_bytes,
        kv_cache_bytes=kv_bytes,
        planned_kv_cache_tokens=expected.kv_cache_tokens,
        kv_cache_tokens=tokens,
        recomputed=recomputed,
        notes=tuple(notes),
    )


def _fit_memory_knob(plan: RuntimePlan, total: int, usable: int
                     ) -> tuple[float, int | None, int, bool]:
    """The memory knob lowered to what is usable where the plan's asks for more: the
    utilization, the KV-cache bytes pinned (None: profiled), the KV cache's bytes, and
    whether either was lowered."""
    knobs, expected = plan.plan, plan.expected
    util = knobs.gpu_memory_utilization
    kv_memory = knobs.kv_cache_memory_bytes
    recomputed = False
    if kv_memory is not None:
        # vLLM skips profiling: it needs the non-KV bytes plus exactly kv_memory.
        if expected.non_kv_bytes_per_gpu + kv_memory > usable:
            kv_memory = usable - expected.non_kv_bytes_per_gpu
            recomputed = True
        kv_bytes = kv_memory
    else:
        requested = math.ceil(total * util)
        if requested > usable:
            util = math.floor(usable / total / _UTIL_STEP) * _UTIL_STEP
            util = round(util, 3)
            recomputed = True
        kv_bytes = math.floor(total * util) - expected.non_kv_bytes_per_gpu
    return util, kv_memory, kv_bytes, recomputed


# Flags the plan owns, by the knob they set, from the knob table (both spellings of a bool are
# one knob; the memory fraction and the KV bytes are one "memory" knob: the node decides it).
_MEMORY_KNOBS = ("gpu_memory_utilization", "kv_cache_memory_bytes")
_PLAN_FLAG_KNOB = {
    **{f"--{flag}": "memory" if name in _MEMORY_KNOBS else name
       for flag, name in FLAG_TO_NAME.items()},
    f"--{TENSOR_PARALLEL_FLAG}": "tensor-parallel", "-tp": "tensor-parallel",
}
_BOOLEAN_FLAGS = {f"--{flag}" for flag, name in FLAG_TO_NAME.items()
                  if BY_NAME[name].type is bool}


def _joined(args: list[str]) -> list[str]:
    """``--flag value`` pairs of plan flags as ``--flag=value``, so they compare as one."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _PLAN_FLAG_KNOB and arg not in _BOOLEAN_FLAGS and i + 1 < len(args):
            out.append(f"{arg}={args[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def build_command(
    plan: RuntimePlan, decision: Decision, args: list[str], vllm_bin: str = "vllm"
) -> list[str]:
    """The final ``vllm serve`` command.

    ``args`` are the container's args: either the operator's full list (model first, then
    server flags, TP and the plan's flags, as ``kvtune.operator.render.objects.vllm_args`` renders
    them) or only extra server flags. Plan flags found in ``args`` must equal the plan's
    (a container arg that disagrees would silently override it); the memory flag is replaced
    by what this node allows; plan flags missing from ``args`` are added, as is the model.
    """
    decided = [
        f"--tensor-parallel-size={plan.tensor_parallel}",
        *plan.plan.vllm_args(
            gpu_memory_utilization=decision.gpu_memory_utilization,
            kv_cache_memory_bytes=decision.kv_cache_memory_bytes,
        ),
    ]
    decided_by_knob = {_PLAN_FLAG_KNOB[a.split("=", 1)[0]]: a for a in decided}
    out: list[str] = []
    for arg in _joined(args):
        flag = arg.split("=", 1)[0]
        knob = _PLAN_FLAG_KNOB.get(flag)
        if knob is None:
            out.append(arg)
            continue
        if knob == "memory":
            # The node's decision replaces the operator's assumption, in place.
            if knob in decided_by_knob:
                out.append(decided_by_knob.pop(knob))
            continue
        want = decided_by_knob.get(knob)
        if arg.replace("-tp=", "--tensor-parallel-size=", 1) != want:
            raise PlanDoesNotFit(
                "ArgOverridesPlan",
                f"container arg {arg!r} disagrees with the kvtune plan ({want or 'unset'}). "
                "Fix: remove it from the container args and pin the value in "
                "spec.tuning.pin instead.",
            )
        out.append(want)
        del decided_by_knob[knob]
    if not out or out[0].startswith("-"):
        out.insert(0, plan.model_id)
    return [vllm_bin, "serve", *out, *decided_by_knob.values()]
