"""``--gpu-memory-utilization`` (the fraction of the GPU vLLM may take), and the check that
weights plus a pinned ``--kv-cache-memory-bytes`` fit in it.

Inputs: the GPU class and the policy's pins. Rule (``decide``): the largest fraction that
leaves a reserve outside vLLM for the CUDA context, allocator fragmentation and sidecars
(``budget.default_gpu_memory_utilization``). A pin wins unless it asks for memory the CUDA
context holds (vLLM would refuse to start): then ``InvalidInput`` with the most it may be.
``check_room``: weights and buffers must leave some KV budget, and pinned KV bytes must fit
beside them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.plan import Reason
from kvtune.tuner.planner import budget, infeasible, kv_dtype_options
from kvtune.tuner.planner.draft import need

if TYPE_CHECKING:
    from kvtune.tuner.planner.draft import Draft
    from kvtune.tuner.planner.planrun import PlanRun


def decide(run: PlanRun, draft: Draft) -> Draft:
    """The draft with gpu-memory-utilization decided."""
    gib, gpu = run.gib, run.gpu
    pinned = run.pins.gpu_memory_utilization
    if pinned is not None:
        # vLLM refuses to start when free memory is below the requested fraction, and the
        # CUDA context is never free.
        most = (gpu.cuda_total_bytes - budget.CUDA_CONTEXT_BYTES) / gpu.cuda_total_bytes
        if pinned > most:
            raise InvalidInput(
                "pins.gpu_memory_utilization", pinned,
                f"asks for {gib(budget.requested_bytes(gpu, pinned))} of "
                f"{gpu.name}'s {gib(gpu.cuda_total_bytes)}, but the CUDA context "
                f"takes about {gib(budget.CUDA_CONTEXT_BYTES)}: vLLM would refuse to start; "
                f"use at most {math.floor(most * 100) / 100:g}",
            )
        return replace(draft.pinned("gpu-memory-utilization", f"{pinned:g}"),
                       gpu_memory_utilization=pinned)
    util = budget.default_gpu_memory_utilization(gpu)
    outside = gpu.cuda_total_bytes - budget.requested_bytes(gpu, util)
    return replace(draft.reason(Reason(
        knob="gpu-memory-utilization", choice=f"{util:g}", code="LargestSafeFraction",
        message=(
            f"{util:g} of the CUDA total {gib(gpu.cuda_total_bytes)} "
            f"({gpu.name}; NVML says {gib(gpu.nvml_total_bytes)}) leaves "
            f"{gib(outside)} outside vLLM for the CUDA context, allocator "
            "fragmentation and sidecars"
        ),
    )), gpu_memory_utilization=util)


def check_room(run: PlanRun, draft: Draft) -> Draft:
    """Weights and fixed overheads alone must fit before any KV question makes sense: the
    draft unchanged, or ``NoFeasiblePlan`` / ``InvalidInput``."""
    gib, gpu = run.gib, run.gpu
    batched = need(draft.batched_tokens, "max-num-batched-tokens")
    utilization = need(draft.gpu_memory_utilization, "gpu-memory-utilization")
    max_model_len = need(draft.max_model_len, "max-model-len").tokens
    probe = run.memory(kv_dtype_options.sixteen_bit(run), 16, run.seqs_for_memory, batched,
                       utilization)
    if probe.kv_budget_bytes <= 0:
        raise infeasible.no_fit(run, max_model_len, batched, utilization, ())
    pinned_kv = run.pins.kv_cache_memory_bytes
    if pinned_kv is not None:
        # vLLM allocates exactly this much without profiling: it must fit beside the
        # weights and buffers, leaving the CUDA context its share.
        room = gpu.cuda_total_bytes - budget.CUDA_CONTEXT_BYTES - probe.non_kv.total_bytes
        if pinned_kv > room:
            raise InvalidInput(
                "pins.kv_cache_memory_bytes", pinned_kv,
                f"{gib(pinned_kv)} of KV does not fit beside {gib(probe.non_kv.total_bytes)} "
                f"of weights and buffers on {gpu.name} ({gib(gpu.cuda_total_bytes)} "
                f"total); at most {max(0, room)} bytes ({gib(max(0, room))})",
            )
    return draft
