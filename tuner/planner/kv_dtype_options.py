"""The KV dtype candidates of one planning run: the runtime's dtypes in kvtune's preference
order, those at or above the policy's quality floor that the KV-quality gate lets through, and
the narrowest of them.

``decide_dtype`` chooses among them and ``infeasible`` quotes them when nothing fits; they live
here, below both, so neither imports the other's module (it was an import cycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtune.tuner import kv_quality
from kvtune.tuner.facts.capabilities import KVCacheDType
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token
from kvtune.tuner.planner.policy import KVPrecision

if TYPE_CHECKING:
    from kvtune.tuner.planner.planrun import PlanRun

PRECISION_FLOOR_BITS: dict[KVPrecision, int] = {
    "bf16": 16, "fp8": 8, "int8": 8, "fp4": 4, "int4": 4,
}
# Among dtypes of one width, the order kvtune prefers: native per-tensor fp8 runs on the
# fastest kernels (FA3 on Hopper, FlashInfer on Blackwell); per-token-head dtypes need
# TRITON_ATTN and carry scales.
DTYPE_PREFERENCE: tuple[str, ...] = (
    "auto", "fp8", "fp8_per_token_head", "int8_per_token_head", "fp8_e5m2",
    "nvfp4", "int4_per_token_head", "nvfp4_4over6",
)
# Same pages as "auto" on a model of that dtype (or as "fp8"); "auto"/"fp8" speak for them.
ALIASES = ("float16", "bfloat16", "fp8_e4m3")


def sixteen_bit(run: PlanRun) -> str:
    """The name of 16-bit KV in a plan: ``auto``, except on a checkpoint that declares a
    KV-cache scheme, where vLLM 0.33's auto is that scheme (fp8) and 16-bit KV must be asked
    for by name (the served dtype; an explicit dtype wins over the checkpoint's scheme,
    vllm/model_executor/layers/attention/attention.py)."""
    return run.model_dtype if run.model.auto_kv_cache_dtype is not None else "auto"


def aliases(run: PlanRun) -> tuple[str, ...]:
    """Dtypes that another candidate speaks for (``ALIASES``), and on a checkpoint that
    declares a KV scheme ``auto`` itself (its scheme's dtype speaks for it) in place of the
    16-bit dtype named by ``sixteen_bit``."""
    rep = sixteen_bit(run)
    if rep == "auto":
        return ALIASES
    return (*(a for a in ALIASES if a != rep), "auto")


def options(run: PlanRun) -> list[KVCacheDType]:
    """The runtime's dtypes in kvtune's preference order (16-bit first, as ``sixteen_bit``
    names it)."""
    rep = sixteen_bit(run)
    preference = [rep if n == "auto" else n for n in DTYPE_PREFERENCE]
    names = [n for n in preference if n in run.runtime.kv_cache_dtype_names]
    names += [n for n in run.runtime.kv_cache_dtype_names if n not in names]
    return [run.runtime.dtype(n) for n in names]


def allowed(run: PlanRun) -> list[str]:
    """Dtypes vLLM runs here at or above the policy's quality floor that the KV-quality
    gate lets through (``kv_quality``: the measured KL within the limit, or unmeasured
    without ``require_measurement``)."""
    floor_bits = PRECISION_FLOOR_BITS[run.req.policy.lowest_kv_precision]
    return kv_quality.allowed_dtypes([
        d.name for d in options(run)
        if run.backends.dtype_unusable(d) is None and d.bits >= floor_bits
    ], run.req.kv_quality_evidence, run.req.policy.kv_quality)


def narrowest(run: PlanRun, names: list[str]) -> str:
    """The dtype with the fewest KV bytes per token."""
    return min(names, key=lambda name: kv_bytes_per_token(
        run.model, name, run.tp, model_dtype=run.model_dtype))
