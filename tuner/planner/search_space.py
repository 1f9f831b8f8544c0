"""The capacity search's candidates (``search.py``, step 1) and the exhaustive grid a
benchmark compares it with. Pure.

KV dtype (the widest allowed dtype of each precision class) x max-num-seqs (Little's law,
4x that, and the rules') x max-num-batched-tokens (the settings' and the rules'), each kept
only when vLLM's analytic pre-flight says it starts; CPU KV offload is searched only where
``offload_size`` gives a size.
"""

from __future__ import annotations

import math

from kvtune.tuner import knobs
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner import (
    decide_block_size,
    decide_max_num_seqs,
    decide_offload_size,
    decide_prefix_offload,
    kv_dtype_options,
)
from kvtune.tuner.planner.planning import plan_pool, preflight
from kvtune.tuner.planner.planrun import MAX_NUM_SEQS_CEILING, PlanRun
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_settings import (
    DEFAULT_SETTINGS,
    DEFAULT_TTFT_SECONDS,
    SearchSettings,
)

# The knobs the halving varies (block size is tried on the finalists).
SEARCHED = ("kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens")
_KNOBS = ("kv_cache_dtype", "block_size", "max_num_seqs", "max_num_batched_tokens",
          "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len",
          "enable_prefix_caching", "kv_offloading_size_gib")


def changed_knobs(plan: KVPlan, reference: KVPlan | None) -> tuple[str, ...]:
    """The vLLM flags (dashed) whose value differs from ``reference``."""
    if reference is None:
        return ()
    return tuple(knobs.BY_NAME[k].flag for k in _KNOBS
                 if getattr(plan, k) != getattr(reference, k))


def littles_law_sequences(request: PlanRequest, rate_per_second: float) -> int:
    """Sequences in the engine at once (L = lambda x W): the arrival rate times the time a
    median request spends there when it just meets the targets (TTFT, then its output at
    the TPOT target)."""
    slo = request.policy.slo
    ttft = slo.ttft_p95_seconds or DEFAULT_TTFT_SECONDS
    tpot = slo.tpot_p95_seconds or decide_max_num_seqs.DEFAULT_TPOT_SECONDS
    outputs = request.profile.output_tokens
    mean_output = (outputs.p50 + outputs.p95) / 2  # a skewed mean, from two quantiles
    return max(1, math.ceil(rate_per_second * (ttft + mean_output * tpot)))


def _round8(n: float) -> int:
    return int(max(8, min(MAX_NUM_SEQS_CEILING, 8 * math.ceil(n / 8))))


def precision_bits(run: PlanRun, dtype: str) -> int:
    return run.runtime.dtype(dtype).bits


def _dtypes(run: PlanRun) -> list[str]:
    """The widest allowed dtype of each precision class (16, 8, 4 bits), widest first."""
    if run.pins.kv_cache_dtype is not None:
        return [run.pins.kv_cache_dtype]
    out: list[str] = []
    bits_seen: set[int] = set()
    skip = kv_dtype_options.aliases(run)
    for name in kv_dtype_options.allowed(run):
        if name in skip:
            continue
        bits = precision_bits(run, name)
        if bits not in bits_seen:
            bits_seen.add(bits)
            out.append(name)
    return out


def candidates(run: PlanRun, base: KVPlan, rate: float, settings: SearchSettings
               ) -> list[KVPlan]:
    """Every combination of the searched knobs around ``base`` (pins fix theirs)."""
    pins = run.pins
    little = littles_law_sequences(run.req, rate)
    if pins.max_num_seqs is not None:
        seqs = [pins.max_num_seqs]
    else:
        seqs = sorted({_round8(little), _round8(4 * little), base.max_num_seqs})
    if pins.max_num_batched_tokens is not None:
        batched = [pins.max_num_batched_tokens]
    else:
        batched = sorted({*settings.batched_tokens, base.max_num_batched_tokens})
    out: list[KVPlan] = []
    for dtype in _dtypes(run):
        bs = pins.block_size or (base.block_size if dtype == base.kv_cache_dtype
                                 else run.backends.smallest_block(dtype))
        bs = decide_block_size.hybrid_forced(run, dtype, bs) or bs
        for s in seqs:
            for b in batched:
                plan = base.model_copy(update={
                    "kv_cache_dtype": dtype, "block_size": bs, "max_num_seqs": s,
                    # vLLM refuses fewer batched tokens than sequences.
                    "max_num_batched_tokens": max(b, s),
                })
                if plan not in out:
                    out.append(plan)
    return out


def offload_size(run: PlanRun, base: KVPlan) -> float | None:
    """The ``--kv-offloading-size`` the search tries besides off, or None when offload is
    not searched: pinned, no CPU budget of at least 1 GiB, prefix caching off (the tier is
    keyed by its hashes), no reuse in the profile, or a GPU class without a host-link fact
    (nothing to time the loads with), or pipeline parallel (its replay has no CPU tier)."""
    if run.pins.kv_offloading_size_gib is not None or not base.enable_prefix_caching:
        return None
    if run.layout.pipeline_parallel > 1:
        return None
    if run.req.gpu.host_link_bytes_per_second is None:
        return None
    size = decide_prefix_offload.budget_size_gib(run)
    if size < 1 or not decide_prefix_offload.shares_prefixes(run):
        return None
    return float(size)


def starts(request: PlanRequest, plan: KVPlan) -> bool:
    """vLLM's analytic pre-flight passes: the plan would start."""
    ok, _, _ = preflight(request, plan)
    return ok


def grid(request: PlanRequest, rate_per_second: float,
         settings: SearchSettings | None = None) -> list[KVPlan]:
    """Every candidate the search could consider (all block sizes, offload off and on
    wherever the search tries it, no halving), that vLLM would start: the exhaustive grid a
    benchmark compares the search with."""
    settings = settings or DEFAULT_SETTINGS
    base = plan_pool(request).plan
    run = PlanRun(request)
    size_gib = offload_size(run, base)
    sizes: tuple[float | None, ...] = (base.kv_offloading_size_gib,)
    if size_gib is not None:
        sizes = (None, *(o.size_gib for o in decide_offload_size.options(run, base, size_gib)))
        base = base.with_offload(None)
    out: list[KVPlan] = []
    for p in candidates(run, base, rate_per_second, settings):
        for bs in decide_block_size.candidates(run, p.kv_cache_dtype):
            for size in sizes:
                q = p.model_copy(update={"block_size": bs}).with_offload(size)
                if q not in out and starts(request, q):
                    out.append(q)
    if base not in out:
        out.insert(0, base)
    return out


__all__ = [
    "SEARCHED",
    "candidates",
    "changed_knobs",
    "grid",
    "littles_law_sequences",
    "offload_size",
    "precision_bits",
    "starts",
]
