"""What is not KV on a GPU, and how much KV budget a memory fraction leaves.

vLLM sizes the KV cache at start (``vllm/v1/worker/gpu_worker.py``)::

    requested    = ceil(cuda_total * gpu_memory_utilization)
    available_kv = requested - (weights + activation peak + non-torch memory)
                   - CUDA-graph estimate      (subtracted from 0.21.0 on: ``vllm_memory``)

Weights are exact (``weights.py``). The rest is kvtune's model of what vLLM's profiling run
measures, its coefficients fitted to published start-up logs (``vllm_memory``: the data, the
version differences and the provenance; ``bench/memory_calibration.py``: the leave-one-out
error):

- activation peak = base + the larger of the sampler run (sampler bytes per logit x
  min(max-num-seqs, batched tokens) x vocab + copies x batched tokens x hidden x element
  bytes) and a dense forward pass (batched tokens x (3 I / TP + 3 hidden) x element bytes,
  which wins at large batched-token budgets) + factor x the fused-MoE
  workspace (batched tokens x top-k x (max(2 I / TP, hidden) + I / TP) x 2 bytes). The
  sampler's dummy run over max-num-seqs logits is the peak for dense models; tensor
  parallelism does not shrink it (the logits are gathered on every rank).
- non-torch = the version's TP = 1 figure, plus the communication buffers when TP > 1.
- CUDA graphs = vLLM's own estimate (``profile_cudagraph_memory``): base + per layer x graphs
  past the first of each mode, fitted on the V1 runner's sampled estimates, or on the real
  pools for 0.33's V2 runner, which measures them; counted only for the versions that
  subtract it.

Worked example, Llama 3.3 70B, FP8 weights, H200, TP 1, 8,192 batched tokens, vLLM 0.33.0:
at 1,024 sequences the sampler run sets the peak: 15.8 B x 1,024 x 128,256 = 1.93 GiB + 1.31
x 8,192 x 8,192 x 2 B = 0.16 GiB, base -0.14 GiB: 1.96 GiB (logged 1.96 on H100 at TP 2 in
0.19); at 96 sequences the forward pass does: 8,192 x (3 x 28,672 + 3 x 8,192) x 2 B =
1.69 GiB - 0.14 = 1.55 GiB. Non-torch 0.13 GiB; CUDA graphs (0.33's V2 runner measures the
pool) 0.48 + 0.000147 x 80 layers x 100 further graphs = 1.65 GiB at 1,024 sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtune.tuner.facts.capabilities import PINNED_VLLM_VERSION
from kvtune.tuner.facts.gpus import GPUClass
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.facts.vllm_memory import (
    MemoryCoefficients,
    coefficients,
    graph_capture_sizes,
    tensor_parallel_extra_gib,
    version_memory,
)
from kvtune.tuner.facts.weights import rope_cache_bytes
from kvtune.tuner.units import GiB, MiB

# Memory outside vLLM's fraction: the CUDA context (~0.5 GiB, counted in the total but never
# free), allocator fragmentation and any sidecar. Larger GPUs can give a larger fraction.
OUTSIDE_RESERVE_BYTES = 4 * GiB
# What the CUDA context takes of the total before vLLM allocates anything.
CUDA_CONTEXT_BYTES = 512 * MiB
MAX_GPU_MEMORY_UTILIZATION = 0.97
# Activations are kept in the model's dtype; the MoE workspace in 16 bits.
_MOE_ELEMENT_BYTES = 2
# Widths alive at the peak of a dense SwiGLU MLP: gate+up output (2 x I) and its activation
# (I); the residual stream, its normed copy and the MLP output (3 x hidden). Llama 3.1 8B in
# vLLM 0.6's profiling run at 20,000 / 29,000 tokens: 2.06 / 2.99 GiB predicted, 2.07 / 2.99
# logged (vllm-project/vllm#10517; its sampler over 256 sequences is smaller there).
_FORWARD_INTERMEDIATE_COPIES = 3
_FORWARD_HIDDEN_COPIES = 3


@dataclass(frozen=True, slots=True)
class NonKVBytes:
    weights_bytes: int
    activation_bytes: int
    # The CUDA-graph memory the version subtracts from the KV budget (0 where it does not).
    cuda_graph_bytes: int
    non_torch_bytes: int

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes + self.activation_bytes + self.cuda_graph_bytes
            + self.non_torch_bytes
        )


@dataclass(frozen=True, slots=True)
class ActivationTerms:
    """The quantities the activation peak is linear in (what the fit regresses on)."""

    logits: int  # min(max_num_seqs, batched tokens) x vocab
    hidden_bytes: int  # batched tokens x hidden x element bytes
    moe_workspace_bytes: int
    # The forward pass's own peak inside a dense MLP: gate/up output, its activation and the
    # residual stream, batched tokens x (3 x intermediate / TP + 3 x hidden) x element bytes.
    forward_bytes: int = 0


def activation_terms(
    vocab_size: int,
    hidden_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    *,
    element_bytes: int = 2,
    moe_intermediate_per_rank: int = 0,
    experts_per_token: int = 0,
    dense_intermediate_per_rank: int = 0,
) -> ActivationTerms:
    moe = max_num_batched_tokens * experts_per_token * (
        max(2 * moe_intermediate_per_rank, hidden_size) + moe_intermediate_per_rank
    ) * _MOE_ELEMENT_BYTES if experts_per_token else 0
    return ActivationTerms(
        logits=min(max_num_seqs, max_num_batched_tokens) * vocab_size,
        hidden_bytes=max_num_batched_tokens * hidden_size * element_bytes,
        moe_workspace_bytes=moe,
        forward_bytes=max_num_batched_tokens * (
            _FORWARD_INTERMEDIATE_COPIES * dense_intermediate_per_rank
            + _FORWARD_HIDDEN_COPIES * hidden_size) * element_bytes,
    )


def model_activation_terms(
    model: ModelArchitecture,
    tensor_parallel: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    model_dtype: str = "bfloat16",
) -> ActivationTerms:
    # MXFP4 experts (gpt-oss) run on their own matmul kernels, not the fused-MoE path with its
    # workspace: gpt-oss-20b at TP 2 logs 2.87 GiB, what the dense terms alone give (2.93).
    moe = model.moe if not (model.quantization and model.quantization.method == "mxfp4") else None
    return activation_terms(
        model.vocab_size, model.hidden_size, max_num_batched_tokens, max_num_seqs,
        element_bytes=4 if model_dtype == "float32" else 2,
        moe_intermediate_per_rank=-(-moe.expert_intermediate_size // tensor_parallel)
        if moe else 0,
        experts_per_token=moe.experts_per_token if moe else 0,
        dense_intermediate_per_rank=0 if model.moe else -(
            -model.intermediate_size // tensor_parallel),
    )


def activation_bytes(
    model: ModelArchitecture,
    tensor_parallel: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    *,
    vllm_version: str = PINNED_VLLM_VERSION,
    model_dtype: str = "bfloat16",
    coefs: MemoryCoefficients | None = None,
) -> int:
    """The torch peak increase of vLLM's profiling run: a forward pass over
    ``max_num_batched_tokens`` tokens, then the sampler over ``max_num_seqs`` logits."""
    terms = model_activation_terms(
        model, tensor_parallel, max_num_batched_tokens, max_num_seqs, model_dtype)
    return activation_bytes_of(terms, vllm_version, coefs)


def activation_bytes_of(
    terms: ActivationTerms, vllm_version: str, coefs: MemoryCoefficients | None = None,
) -> int:
    c = coefs or coefficients()
    sampler = c.sampler_bytes_per_logit[version_memory(vllm_version).sampler]
    # The forward pass and the sampler run one after the other: the peak is the larger of
    # the two (the hidden states stay alive into the sampler run).
    sampling = sampler * terms.logits + c.hidden_state_copies * terms.hidden_bytes
    peak = (
        c.activation_base_gib * GiB + max(sampling, terms.forward_bytes)
        + c.moe_workspace_factor * terms.moe_workspace_bytes
    )
    return max(0, round(peak))


def non_torch_bytes(
    tensor_parallel: int, vllm_version: str = PINNED_VLLM_VERSION,
    coefs: MemoryCoefficients | None = None,
) -> int:
    """Memory outside torch that appears during profiling (cuBLAS/NCCL workspaces, the
    communication buffers of tensor parallelism)."""
    c = coefs or coefficients()
    gib = c.non_torch_gib[version_memory(vllm_version).non_torch]
    gib += tensor_parallel_extra_gib(c, tensor_parallel)
    return round(gib * GiB)


def cuda_graph_estimate_bytes(
    num_layers: int, max_num_seqs: int, max_num_batched_tokens: int, *,
    blackwell: bool = False, coefs: MemoryCoefficients | None = None,
    measured: bool = False,
) -> int:
    """vLLM's estimate of its CUDA-graph pool (``profile_cudagraph_memory``), which the
    versions from 0.21.0 subtract from the KV budget: the V1 runner's sampled estimate, or
    (``measured``) the pool the V2 runner measures by capturing the graphs."""
    c = coefs or coefficients()
    piecewise, full = graph_capture_sizes(
        max_num_seqs, max_num_batched_tokens, blackwell=blackwell)
    further = max(0, piecewise - 1) + max(0, full - 1)
    if measured:
        base, per = c.cuda_graph_pool_base_gib, c.cuda_graph_pool_gib_per_layer_graph
    else:
        base, per = c.cuda_graph_base_gib, c.cuda_graph_gib_per_layer_graph
    return round((base + per * num_layers * further) * GiB)


def non_kv_bytes(
    model: ModelArchitecture,
    weights_bytes: int,
    tensor_parallel: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    *,
    vllm_version: str = PINNED_VLLM_VERSION,
    gpu: GPUClass | None = None,
    model_dtype: str = "bfloat16",
    coefs: MemoryCoefficients | None = None,
    communicating_ranks: int = 1,
) -> NonKVBytes:
    """Everything vLLM subtracts from the requested memory before the KV cache (``coefs``:
    the shipped fit unless a leave-one-out refit is given). ``weights_bytes``: the parameters
    on one GPU (``weights_bytes_per_gpu``); the rotary table is added here."""
    version = version_memory(vllm_version)
    blackwell = gpu is not None and gpu.compute_capability[0] == 10
    return NonKVBytes(
        # The parameters and vLLM's rotary cos/sin table, as "Model loading took" counts them.
        weights_bytes=weights_bytes + rope_cache_bytes(model),
        activation_bytes=activation_bytes(
            model, tensor_parallel, max_num_batched_tokens, max_num_seqs,
            vllm_version=vllm_version, model_dtype=model_dtype, coefs=coefs,
        ),
        cuda_graph_bytes=cuda_graph_estimate_bytes(
            model.num_hidden_layers, max_num_seqs, max_num_batched_tokens,
            blackwell=blackwell, coefs=coefs,
            measured=version.cuda_graph_estimator == "measured",
        ) if version.cuda_graph_deducted else 0,
        # DP+EP ranks keep communication buffers (all-to-all) as TP ranks do (all-reduce).
        non_torch_bytes=non_torch_bytes(max(tensor_parallel, communicating_ranks),
                                        vllm_version, coefs),
    )


def default_gpu_memory_utilization(gpu: GPUClass) -> float:
    """The largest fraction (in hundredths) that leaves ``OUTSIDE_RESERVE_BYTES`` outside
    vLLM, at most ``MAX_GPU_MEMORY_UTILIZATION``."""
    fraction = (gpu.cuda_total_bytes - OUTSIDE_RESERVE_BYTES) / gpu.cuda_total_bytes
    return min(MAX_GPU_MEMORY_UTILIZATION, math.floor(fraction * 100) / 100)


def requested_bytes(gpu: GPUClass, gpu_memory_utilization: float) -> int:
    return math.ceil(gpu.cuda_total_bytes * gpu_memory_utilization)


def kv_budget_bytes(gpu: GPUClass, gpu_memory_utilization: float, non_kv: NonKVBytes) -> int:
    """KV bytes vLLM will allocate (may be negative: nothing fits)."""
    return requested_bytes(gpu, gpu_memory_utilization) - non_kv.total_bytes
