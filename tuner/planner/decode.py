"""A memory-bandwidth model of one decode step.

A decode step reads every weight the batch touches once and every running sequence's KV
once; at batch sizes that serving uses it is bandwidth-bound::

    step_seconds = (weights_read + sum of KV bytes of the running sequences)
                   / (hbm_bandwidth * BANDWIDTH_EFFICIENCY)
                   + STEP_OVERHEAD_SECONDS + tensor-parallel all-reduces (measured,
                     ``facts/step_kernels.py``)

MoE reads only the experts the batch routes to: with k of E experts per token and n tokens,
the expected fraction of experts touched is ``1 - (1 - k/E) ** n``.

Worked example, Llama 3.3 70B FP8 on H200, 64 sequences of 2,048 tokens at fp8 KV:
(72.7 GB + 64 * 2,048 * 163,840 B) / (4.8 TB/s * 0.8) + 3 ms = 18.9 + 5.6 + 3 = 27.5 ms.
"""

from __future__ import annotations

from kvtune.tuner.facts.gpus import GPUClass
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.facts.step_kernels import (
    ACTIVATION_BYTES,
    MESSAGE_FIRST_EXPONENT,
    all_reduce_table,
    interp_pow2,
)

# Achievable fraction of peak HBM bandwidth for decode kernels (weights GEMV + paged attn).
BANDWIDTH_EFFICIENCY = 0.8
# Scheduler, sampling and launch overhead per step with CUDA graphs.
STEP_OVERHEAD_SECONDS = 0.003
MAX_SEQS_SEARCHED = 4096


def weights_read_bytes(
    model: ModelArchitecture, weights_bytes_per_gpu: int, num_seqs: int
) -> float:
    if model.moe is None or num_seqs <= 0:
        return float(weights_bytes_per_gpu)
    moe = model.moe
    expert_params = (
        (model.num_hidden_layers - moe.num_dense_layers)
        * moe.num_experts * 3 * model.hidden_size * moe.expert_intermediate_size
    )
    expert_fraction_of_weights = min(1.0, expert_params / model.parameter_count)
    touched = 1.0 - (1.0 - moe.experts_per_token / moe.num_experts) ** num_seqs
    expert_bytes = weights_bytes_per_gpu * expert_fraction_of_weights
    return weights_bytes_per_gpu - expert_bytes + expert_bytes * touched


def decode_step_seconds(
    model: ModelArchitecture,
    gpu: GPUClass,
    tensor_parallel: int,
    weights_bytes_per_gpu: int,
    num_seqs: int,
    kv_bytes_per_seq: float,
) -> float:
    bandwidth = gpu.hbm_bandwidth_bytes_per_second * BANDWIDTH_EFFICIENCY
    read = weights_read_bytes(model, weights_bytes_per_gpu, num_seqs) + num_seqs * (
        kv_bytes_per_seq
    )
    comm = 0.0
    if tensor_parallel > 1:
        # Two all-reduces per layer of the batch's activations (measured, step_kernels.json).
        comm = 2 * model.num_hidden_layers * interp_pow2(
            all_reduce_table(gpu.name, tensor_parallel),
            max(1, num_seqs) * model.hidden_size * ACTIVATION_BYTES, MESSAGE_FIRST_EXPONENT)
    return read / bandwidth + STEP_OVERHEAD_SECONDS + comm


def max_seqs_within(
    model: ModelArchitecture,
    gpu: GPUClass,
    tensor_parallel: int,
    weights_bytes_per_gpu: int,
    kv_bytes_per_seq: float,
    tpot_seconds: float,
) -> int:
    """The most sequences whose decode step stays within ``tpot_seconds`` (0: not even one).
    Step time grows monotonically with the batch, so a binary search finds it."""
    def ok(n: int) -> bool:
        return decode_step_seconds(
            model, gpu, tensor_parallel, weights_bytes_per_gpu, n, kv_bytes_per_seq
        ) <= tpot_seconds

    if not ok(1):
        return 0
    lo, hi = 1, MAX_SEQS_SEARCHED
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


# Model FLOPs utilization of chunked prefill (large GEMMs, attention over the chunk).
PREFILL_MFU = 0.4


def prefill_seconds_per_token(
    model: ModelArchitecture, gpu: GPUClass, tensor_parallel: int, weight_bits: int
) -> float:
    """Compute time of one prompt token: 2 FLOPs per active parameter, shared by the TP
    ranks, at FP8 tensor-core speed when the weights are 8-bit and the GPU has FP8."""
    flops = gpu.dense_bf16_flops_per_second
    if weight_bits <= 8 and gpu.dense_fp8_flops_per_second:
        flops = gpu.dense_fp8_flops_per_second
    return 2 * model.active_parameter_count / (tensor_parallel * flops * PREFILL_MFU)
