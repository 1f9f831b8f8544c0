"""What is not KV on a GPU, and how much KV budget a memory fraction leaves.

vLLM sizes the KV cache at start (``vllm/v1/worker/gpu_worker.py``)::

    requested    = ceil(cuda_total * gpu_memory_utilization)
    available_kv = requested - (weights + peak activations + non-torch memory) - CUDA graphs

Weights are exact (``weights.py``); activations, non-torch memory (NCCL buffers, cuBLAS
workspaces) and CUDA graphs are estimates from the shapes, on the safe side of what vLLM's
start-up log prints for these models. The operator compares them with the observed
``vllm:cache_config_info`` (num_gpu_blocks) after rollout.

Worked example, Llama 3.3 70B, FP8 weights, H200, TP 1, 8,192 batched tokens, 1,024 seqs:
activations 8,192 * 2 * (4 * 8,192 + 2 * 28,672) = 1.48 GB + logits 1,024 * 128,256 * 4 * 2
= 1.05 GB; CUDA graphs 256 MiB + 80 * 8 MiB = 0.94 GB; non-torch 256 MiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtune.tuner.facts.gpus import GPUClass
from kvtune.tuner.facts.models import ModelArchitecture

GiB = 1 << 30
MiB = 1 << 20

# Memory outside vLLM's fraction: the CUDA context (~0.5 GiB, counted in the total but never
# free), allocator fragmentation and any sidecar. Larger GPUs can give a larger fraction.
OUTSIDE_RESERVE_BYTES = 4 * GiB
# What the CUDA context takes of the total before vLLM allocates anything.
CUDA_CONTEXT_BYTES = 512 * MiB
MAX_GPU_MEMORY_UTILIZATION = 0.97
CUDA_GRAPH_BASE_BYTES = 256 * MiB
CUDA_GRAPH_BYTES_PER_LAYER = 8 * MiB
NON_TORCH_BYTES = 256 * MiB
NCCL_BYTES = 512 * MiB  # NCCL buffers when tensor parallel > 1
ACTIVATION_BYTES_PER_ELEMENT = 2
LOGITS_BYTES_PER_ELEMENT = 4 * 2  # fp32 logits plus the sampler's softmax copy


@dataclass(frozen=True, slots=True)
class NonKVBytes:
    weights_bytes: int
    activation_bytes: int
    cuda_graph_bytes: int
    non_torch_bytes: int

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes + self.activation_bytes + self.cuda_graph_bytes
            + self.non_torch_bytes
        )


def activation_bytes(
    model: ModelArchitecture,
    tensor_parallel: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> int:
    """Peak activations of vLLM's profiling forward pass over ``max_num_batched_tokens``
    tokens, plus the sampler's logits for ``max_num_seqs`` sequences (not sharded)."""
    if model.moe is not None:
        ffn = model.moe.expert_intermediate_size * model.moe.experts_per_token
        if model.moe.dense_intermediate_size:
            ffn = max(ffn, model.moe.dense_intermediate_size)
    else:
        ffn = model.intermediate_size
    per_token = 4 * model.hidden_size + 2 * -(-ffn // tensor_parallel)
    hidden = max_num_batched_tokens * per_token * ACTIVATION_BYTES_PER_ELEMENT
    logits = min(max_num_seqs, max_num_batched_tokens) * model.vocab_size * (
        LOGITS_BYTES_PER_ELEMENT
    )
    return hidden + logits


def non_kv_bytes(
    model: ModelArchitecture,
    weights_bytes: int,
    tensor_parallel: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> NonKVBytes:
    return NonKVBytes(
        weights_bytes=weights_bytes,
        activation_bytes=activation_bytes(
            model, tensor_parallel, max_num_batched_tokens, max_num_seqs
        ),
        cuda_graph_bytes=CUDA_GRAPH_BASE_BYTES
        + model.num_hidden_layers * CUDA_GRAPH_BYTES_PER_LAYER,
        non_torch_bytes=NON_TORCH_BYTES + (NCCL_BYTES if tensor_parallel > 1 else 0),
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
