"""A memory-bandwidth model of one decode step.

A decode step reads every weight the batch touches once and every running sequence's KV
once; at batch sizes that serving uses it is bandwidth-bound::

    step_seconds = (weights_read + sum of KV bytes of the running sequences)
                   / (hbm_bandwidth * BANDWIDTH_EFFICIENCY)
                   + STEP_OVERHEAD_SECONDS + tensor-parallel all-reduces (measured,
                     ``facts/step_kernels.py``)

MoE reads only the experts the batch routes to: with k of E experts per token and n tokens,
the expected fraction of experts touched is ``1 - (1 - k/E) ** n``.

Data-parallel attention (``tuner/layout.py``): each DP rank decodes its own n sequences, but
the MoE layers of all ranks run together, so a rank's experts see the n * dp tokens of the
whole replica; a rank's weights are its attention (split by TP) and its share of the experts.
Communication per step: one all-reduce per layer among the TP ranks for attention; for the
MoE layers either the second all-reduce (TP alone), an all-reduce among all tp * dp ranks of
the replica's tokens (DP without EP: vLLM flattens TP across DP), or, under expert parallel,
a dispatch and a combine all-to-all of the n * k routed token copies. An all-to-all moves
(P-1)/P of its bytes per rank where a ring all-reduce moves 2(P-1)/P, so it is charged as an
all-reduce of half the bytes (from the same measured table; sizes past the largest measured
group, e.g. 16 ranks over two nodes, use the largest: an underestimate across nodes).

Pipeline parallel (PP stages): vLLM 0.33 (the V2 model runner, async scheduling) keeps pp + 1
batches in flight (``EngineCore.batch_queue``, sized by ``VllmConfig.max_concurrent_batches``)
and schedules a request that sampled again only pp ``schedule()`` calls later
(``AsyncScheduler.decode_stagger``), so an engine's n sequences ride in pp micro-batches of
n / pp (when arrivals spread them: a burst admitted at once stays one micro-batch, which the
simulator's ``sched_pipeline`` replays), and each token crosses the stages in turn. A stage
reads its own weights and its layers' KV of its micro-batch; the time between two tokens of
a sequence is ``pp x stage(n / pp) + (pp - 1) x send(n / pp)``, where a send moves the
micro-batch's hidden states and residual over NVLink (within a node) or the RDMA NIC (across
nodes). Throughput: n tokens per that interval, about one stage's step per micro-batch;
latency: every stage plus the sends. A prompt's prefill likewise crosses every stage
(``prefill_seconds_per_token``), so at the same GPU count TP x PP prefills slower than TP alone.

Worked example, Llama 3.3 70B FP8 on H200, 64 sequences of 2,048 tokens at fp8 KV:
(72.7 GB + 64 * 2,048 * 163,840 B) / (4.8 TB/s * 0.8) + 3 ms = 18.9 + 5.6 + 3 = 27.5 ms.
"""

from __future__ import annotations

from kvtune.tuner.facts.gpus import GPUClass
from kvtune.tuner.facts.kv_links import FABRICS, kv_link
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.facts.step_kernels import (
    ACTIVATION_BYTES,
    MESSAGE_FIRST_EXPONENT,
    all_reduce_table,
    interp_pow2,
)
from kvtune.tuner.layout import ParallelLayout

# Achievable fraction of peak HBM bandwidth for decode kernels (weights GEMV + paged attn).
BANDWIDTH_EFFICIENCY = 0.8
# Scheduler, sampling and launch overhead per step with CUDA graphs.
STEP_OVERHEAD_SECONDS = 0.003
MAX_SEQS_SEARCHED = 4096
# Tensors a pipeline stage sends the next per token: the hidden states and the residual.
PIPELINE_SENT_TENSORS = 2


def _expert_share(model: ModelArchitecture, layout: ParallelLayout | None) -> float:
    """The routed experts' fraction of one GPU's weights (parameters: experts over tp * dp
    ranks, the rest over tp)."""
    assert model.moe is not None
    experts = min(model.expert_parameter_count, model.parameter_count)
    if layout is None or layout.data_parallel == 1:
        return experts / model.parameter_count
    others = (model.parameter_count - experts) / layout.tensor_parallel
    mine = experts / layout.stage_gpus
    return mine / (mine + others)


def weights_read_bytes(
    model: ModelArchitecture, weights_bytes_per_gpu: int, num_seqs: int,
    layout: ParallelLayout | None = None,
) -> float:
    if model.moe is None or num_seqs <= 0:
        return float(weights_bytes_per_gpu)
    moe = model.moe
    routed_tokens = num_seqs * (layout.data_parallel if layout is not None else 1)
    touched = 1.0 - (1.0 - moe.experts_per_token / moe.num_experts) ** routed_tokens
    expert_bytes = weights_bytes_per_gpu * _expert_share(model, layout)
    return weights_bytes_per_gpu - expert_bytes + expert_bytes * touched


def _all_reduce(gpu: GPUClass, ranks: int, message_bytes: float) -> float:
    return interp_pow2(all_reduce_table(gpu.name, ranks), max(1.0, message_bytes),
                       MESSAGE_FIRST_EXPONENT)


def communication_seconds(
    model: ModelArchitecture, gpu: GPUClass, layout: ParallelLayout, num_seqs: int
) -> float:
    """The collectives of one decode step (module docstring)."""
    tp, n = layout.tensor_parallel, max(1, num_seqs)
    activation = n * model.hidden_size * ACTIVATION_BYTES
    layers = model.num_hidden_layers
    moe_layers = layers - model.moe.num_dense_layers if model.moe is not None else 0
    if layout.stage_gpus == 1:
        return 0.0
    if moe_layers == 0 or (layout.data_parallel == 1 and not layout.expert_parallel):
        # TP alone: two all-reduces per layer (measured, step_kernels.json).
        return ((2 * layers * _all_reduce(gpu, tp, activation) if tp > 1 else 0.0)
                + _dcp_seconds(model, gpu, layout, activation))
    seconds = layers * _all_reduce(gpu, tp, activation) if tp > 1 else 0.0
    seconds += _dcp_seconds(model, gpu, layout, activation)
    # Dense-MLP layers (DeepSeek's first three) all-reduce among the TP ranks.
    if tp > 1:
        seconds += (layers - moe_layers) * _all_reduce(gpu, tp, activation)
    assert model.moe is not None
    if layout.expert_parallel:
        routed = activation * model.moe.experts_per_token
        # Dispatch and combine: two all-to-alls, each an all-reduce of half the bytes.
        return seconds + moe_layers * 2 * _all_reduce(gpu, layout.stage_gpus, routed / 2)
    return seconds + moe_layers * _all_reduce(gpu, layout.stage_gpus,
                                              activation * layout.data_parallel)


def _dcp_seconds(model: ModelArchitecture, gpu: GPUClass, layout: ParallelLayout,
                 activation_bytes: float) -> float:
    """Decode context parallel: per layer the DCP ranks gather the queries and reduce the
    partial attention outputs (vLLM's ag_rs backend), charged as one all-reduce of the
    batch's activations among them."""
    dcp = layout.decode_context_parallel
    if dcp == 1:
        return 0.0
    return model.num_hidden_layers * _all_reduce(gpu, dcp, activation_bytes)


def decode_step_seconds(
    model: ModelArchitecture,
    gpu: GPUClass,
    tensor_parallel: int,
    weights_bytes_per_gpu: int,
    num_seqs: int,
    kv_bytes_per_seq: float,
    layout: ParallelLayout | None = None,
) -> float:
    """One engine's decode step at ``num_seqs`` sequences (per DP rank under a layout): the
    time between two tokens of a sequence. Under pipeline parallel (module docstring) the
    weights and KV per sequence are one stage's."""
    layout = layout or ParallelLayout(tensor_parallel=tensor_parallel)
    pp = layout.pipeline_parallel
    # PP: vLLM reschedules a sequence every pp schedules (module doc), so the sequences ride
    # in pp micro-batches and a token of each crosses every stage in turn.
    batch = -(-num_seqs // pp)
    bandwidth = gpu.hbm_bandwidth_bytes_per_second * BANDWIDTH_EFFICIENCY
    read = weights_read_bytes(model, weights_bytes_per_gpu, batch, layout) + batch * (
        kv_bytes_per_seq
    )
    stage = (read / bandwidth + STEP_OVERHEAD_SECONDS
             + communication_seconds(model, gpu, layout, batch) / pp)
    if pp == 1:
        return stage
    return pp * stage + (pp - 1) * pipeline_send_seconds(model, gpu, layout, batch)


def pipeline_send_seconds(model: ModelArchitecture, gpu: GPUClass, layout: ParallelLayout,
                          tokens: int) -> float:
    """One stage-to-stage send of ``tokens`` tokens' activations (vLLM sends the hidden states
    and the residual, ``IntermediateTensors``) over the link between the stages: NVLink when
    the replica sits on one node, else the RDMA NIC (``facts/kv_links.py``): a replica over
    nodes has a stage boundary on the NIC, and the pipeline runs at its slowest stage and
    send, as ``pipeline_costs`` charges every stage the slowest's; a class without link facts
    at the slowest NIC kvtune knows."""
    bytes_ = tokens * model.hidden_size * ACTIVATION_BYTES * PIPELINE_SENT_TENSORS
    facts = FABRICS.get(gpu.name)
    if facts is None:
        rate = float(min(f.rdma_bytes_per_second for f in FABRICS.values()))
    else:
        rate = float(kv_link(gpu.name, layout.gpus, nodes=layout.nodes_per_replica)
                     .bytes_per_second)
    return bytes_ / rate


def max_seqs_within(
    model: ModelArchitecture,
    gpu: GPUClass,
    tensor_parallel: int,
    weights_bytes_per_gpu: int,
    kv_bytes_per_seq: float,
    tpot_seconds: float,
    layout: ParallelLayout | None = None,
) -> int:
    """The most sequences whose decode step stays within ``tpot_seconds`` (0: not even one).
    Step time grows monotonically with the batch, so a binary search finds it."""
    def ok(n: int) -> bool:
        return decode_step_seconds(
            model, gpu, tensor_parallel, weights_bytes_per_gpu, n, kv_bytes_per_seq, layout
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
    model: ModelArchitecture, gpu: GPUClass, tensor_parallel: int, weight_bits: int,
    layout: ParallelLayout | None = None,
) -> float:
    """Compute time of one prompt token: 2 FLOPs per active parameter, shared by the TP
    ranks, at FP8 tensor-core speed when the weights are 8-bit and the GPU has FP8. Under
    pipeline parallel a prompt crosses the stages one after another (each computes its
    layers, on its own TP ranks), so its time is TP's plus the sends between stages."""
    flops = gpu.dense_bf16_flops_per_second
    if weight_bits <= 8 and gpu.dense_fp8_flops_per_second:
        flops = gpu.dense_fp8_flops_per_second
    compute = 2 * model.active_parameter_count / (tensor_parallel * flops * PREFILL_MFU)
    if layout is None or layout.pipeline_parallel == 1:
        return compute
    return compute + (layout.pipeline_parallel - 1) * pipeline_send_seconds(
        model, gpu, layout, 1)
