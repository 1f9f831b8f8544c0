"""One pipeline stage's step costs (``sched_pipeline.py``) from the whole engine's.

Under pipeline parallel a GPU holds the layers of its stage (``facts/layouts.py:
pipeline_stages``: vLLM's ``get_pp_indices`` split) at the layout's TP x DP, so a stage's step
reads its own weights and its layers' KV, and runs its layers' GEMMs, attention and
collectives. The whole engine's ``StepCostModel`` (``engine.step_cost_for`` at PP 1) is scaled
to the stage with the most layers: its per-layer terms by that stage's share of the layers
(GEMM time is linear in the GEMMs and their weights, ``step_kernels.linear_seconds``), its
weights the heaviest stage's. The LM head (the last stage's) is charged to the stage: every
stage is costed as the slowest could be, an upper bound (the last stage holds the fewest
layers, so its head and the heaviest stage rarely meet).

Sends: a stage hands the next the hidden states and the residual of each token
(``IntermediateTensors``), over NVLink within a node, else the RDMA NIC
(``planner/decode.py: pipeline_send_seconds``, the rules' same figure).
"""

from __future__ import annotations

import dataclasses
import math

from kvtune.tuner.facts.layouts import pipeline_stages
from kvtune.tuner.planner import planning
from kvtune.tuner.planner.decode import pipeline_send_seconds
from kvtune.tuner.simulator.timing import StepCostModel


def stage_layers(request: planning.PlanRequest) -> int:
    """The most layers any stage of the request's layout holds."""
    return max(s.layers for s in pipeline_stages(request.model, request.weights_dtype,
                                                 request.layout))


def stage_cost(request: planning.PlanRequest, whole: StepCostModel) -> StepCostModel:
    """``whole`` (one engine at PP 1: every layer on each GPU) as its slowest stage (module
    doc)."""
    model = request.model
    stages = pipeline_stages(model, request.weights_dtype, request.layout)
    layers = max(s.layers for s in stages)
    share = layers / model.num_hidden_layers
    kernels = whole.kernels
    if kernels is not None:
        kernels = dataclasses.replace(
            kernels,
            body_seconds=tuple(x * share for x in kernels.body_seconds),
            weight_read_seconds=kernels.weight_read_seconds * share,
            attention_fixed_seconds=kernels.attention_fixed_seconds * share,
            attention_seconds_per_seq=kernels.attention_seconds_per_seq * share,
            all_reduces_per_step=math.ceil(kernels.all_reduces_per_step * share))
    return dataclasses.replace(
        whole,
        weights_bytes=max(s.weights_bytes for s in stages),
        # Per GPU: its stage's layers of each token (one attention kind: ``validation``).
        kv_bytes_per_token=whole.kv_bytes_per_token * layers // model.num_hidden_layers,
        flops_per_token=whole.flops_per_token * share,
        attention_flops_per_token_pair=whole.attention_flops_per_token_pair * share,
        kernels=kernels)


def send_seconds_per_token(request: planning.PlanRequest) -> float:
    """One token's activations from one stage to the next (module doc)."""
    return pipeline_send_seconds(request.model, request.gpu, request.layout, 1)


def latency_seconds(stage_seconds: float, pipeline_parallel: int, send_seconds: float
                    ) -> float:
    """A micro-batch through every stage when nothing waits: ``pp`` stage times and the
    ``pp - 1`` sends between them."""
    return pipeline_parallel * stage_seconds + (pipeline_parallel - 1) * send_seconds
