"""A model's kernel costs on one GPU class (``timing.KernelTimes``) from kvtune's facts.

Where the GPU class has measured kernels (``facts/step_kernels.py``) they give every term; a
class without them gets the same terms from ``efficiency.json``'s roofline fractions (linear
layers at ``max(weight bytes / bandwidth, FLOPs / matrix rate)`` per M, attention at the
bandwidth and compute fractions, no fixed attention cost) and the fallback all-reduce time.

What the measured facts stand for: GQA attention with head_dim 128 (MLA and other head sizes
are costed with it too), dense GEMMs of LLM projection shapes (MoE experts as dense weights at
their active count, every expert read at least once a step as vLLM's fused MoE does at small
batches), activations all-reduced in 16 bits.
"""

from __future__ import annotations

from typing import Any

from kvtune.tuner.facts.step_kernels import (
    ACTIVATION_BYTES,
    all_reduce_table,
    gpu_kernels,
)
from kvtune.tuner.facts.weights import weight_bits
from kvtune.tuner.planner import planning
from kvtune.tuner.simulator.timing import Efficiency, KernelTimes

# M = 1, 2, 4, ... 32768: the points of a roofline table (as the measured ones).
_ROOFLINE_M_POINTS = 16
# GEMMs per layer of a dense transformer: QKV, output, gate-up, down.
_GEMMS_PER_LAYER = 4


def kernel_times(request: planning.PlanRequest, matrix_flops_per_second: float,
                 eff: Efficiency) -> KernelTimes:
    """The request's model on its GPU class and TP size (module doc)."""
    model, gpu, tp = request.model, request.gpu, request.tensor_parallel
    bits = weight_bits(model, request.weights_dtype)
    not_linear = model.embedding_parameter_count + model.vision_parameter_count
    body_active = max(1, model.active_parameter_count - not_linear) / tp
    # Under DP the routed experts are split over all tp * dp ranks, the rest over tp; a rank's
    # expert FLOPs per own token stay those of TP (it computes dp times the tokens on 1/dp of
    # the experts).
    dp = request.data_parallel
    experts = min(model.expert_parameter_count, model.parameter_count)
    body_total = (max(1, model.parameter_count - not_linear - experts) / tp
                  + experts / (tp * dp))
    layers = model.num_hidden_layers
    bf16_rate = float(gpu.dense_bf16_flops_per_second)
    hbm = float(gpu.hbm_bandwidth_bytes_per_second)
    head_params = model.vocab_size * model.hidden_size / tp
    gemms = _GEMMS_PER_LAYER * layers
    measured = gpu_kernels(gpu.name)
    if measured is not None:
        body = measured.linear_seconds(bits, gemms, body_active)
        read = measured.linear_seconds(bits, gemms, body_total)[0]
        head = measured.linear_seconds(16, 1, head_params)
        fixed = layers * measured.attention_fixed_seconds_per_layer
        per_seq = layers * measured.attention_seconds_per_seq_per_layer
        kv_rate = hbm * measured.kv_bandwidth_efficiency
        prefill = tuple(bf16_rate * e for e in measured.prefill_bf16_efficiency_by_context)
    else:
        bw = hbm * eff.bandwidth_efficiency
        per_param = _roofline_table(min(16, bits) / 8 / bw,
                                    matrix_flops_per_second * eff.compute_efficiency)
        body = tuple(body_active * g for g in per_param)
        read = body_total * per_param[0]
        head = tuple(head_params * g for g in _roofline_table(
            2 / bw, bf16_rate * eff.compute_efficiency))
        fixed = per_seq = 0.0
        kv_rate = bw
        prefill = (bf16_rate * eff.compute_efficiency,)
    return KernelTimes(
        body_seconds=body,
        head_seconds=head,
        weight_read_seconds=read,
        attention_fixed_seconds=fixed,
        attention_seconds_per_seq=per_seq,
        kv_bytes_per_second=kv_rate,
        prefill_flops_per_second=prefill,
        **_collectives(request),
    )


def _collectives(request: planning.PlanRequest) -> dict[str, Any]:
    """The step's collectives as all-reduces: TP alone, two per layer among the TP ranks;
    under expert parallel (DP > 1 or EP), a dispatch and a combine all-to-all per MoE layer of
    the k routed copies of each token among all ranks, each charged as an all-reduce of half
    the bytes (``planner/decode.py``; the attention all-reduces of TP > 1 ride along at that
    size); DP without EP, one all-reduce per MoE layer among all ranks of the replica's tokens
    besides TP's per layer."""
    model, gpu, layout = request.model, request.gpu, request.layout
    tp, layers = layout.tensor_parallel, model.num_hidden_layers
    token = model.hidden_size * ACTIVATION_BYTES
    # Decode context parallel: one more collective per layer (gather q, reduce outputs), at
    # the table of the group charged below (DCP divides TP: an overcharge at worst).
    dcp_extra = layers if layout.decode_context_parallel > 1 else 0
    moe_layers = layers - model.moe.num_dense_layers if model.moe is not None else 0
    if moe_layers == 0 or (layout.data_parallel == 1 and not layout.expert_parallel):
        return {"all_reduces_per_step": (2 * layers if tp > 1 else 0) + dcp_extra,
                "all_reduce_bytes_per_token": token,
                "all_reduce_seconds": all_reduce_table(gpu.name, tp)}
    assert model.moe is not None
    if layout.expert_parallel:
        return {"all_reduces_per_step": 2 * moe_layers + (layers if tp > 1 else 0) + dcp_extra,
                "all_reduce_bytes_per_token": token * model.moe.experts_per_token // 2,
                "all_reduce_seconds": all_reduce_table(gpu.name, layout.stage_gpus)}
    return {"all_reduces_per_step": moe_layers + (layers if tp > 1 else 0) + dcp_extra,
            "all_reduce_bytes_per_token": token * layout.data_parallel,
            "all_reduce_seconds": all_reduce_table(gpu.name, layout.stage_gpus)}


def _roofline_table(read_seconds_per_param: float, flops_per_second: float
                    ) -> tuple[float, ...]:
    """Seconds per weight at M = 1, 2, 4, ...: reading it, or its 2 M FLOPs, the larger."""
    return tuple(max(read_seconds_per_param, 2.0 * 2**i / flops_per_second)
                 for i in range(_ROOFLINE_M_POINTS))
