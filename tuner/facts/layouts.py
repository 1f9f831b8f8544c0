"""KV capacity and weights per GPU and per replica of a parallel layout, as vLLM 0.33 lays
them out (``tuner/layout.py`` names the layout).

- Each DP rank is an engine with its own scheduler, block pool and sequences: a replica holds
  ``data_parallel`` times one engine's tokens.
- Within an engine every TP rank allocates the same number of blocks (vLLM takes the smallest
  rank's count, ``get_kv_cache_configs``), so one engine holds ``num_gpu_blocks * block_size``
  tokens whatever its TP.
- Per GPU, a token's KV is ``kvmemory.kv_bytes_per_token(model, dtype, tp)``: standard
  attention splits its KV heads over TP (copies only when TP exceeds them); MLA keeps one latent
  per token that every TP rank holds in full (``num_kv_heads=1, max_tp_shards=1`` in
  ``MLAAttention.get_kv_cache_spec``; vLLM's ``kv_tp_replicas`` = TP). So TP8 holds one eighth
  of the tokens DP8 does at the same bytes per GPU.
- Decode context parallel (MLA): each TP rank of a DCP group holds 1/DCP of a sequence's
  tokens; a scheduler block is ``block_size * dcp`` tokens, so an engine holds DCP times the
  tokens at the same blocks per GPU.
- Weights: ``weights.weights_bytes_per_gpu(..., data_parallel=)``.
- Pipeline parallel: an engine's layers split into stages as vLLM's ``get_pp_indices`` splits
  them (even shares; the remainder to the stages before the last); each stage's TP workers
  hold only their layers' weights and KV. The first stage adds the embedding table, the last
  the lm_head; a layer's weights are taken as the body's average (DeepSeek's three dense
  layers are lighter than its MoE layers: an approximation). vLLM sizes every worker's cache
  from its own free memory and then gives all of them the smallest count
  (``get_kv_cache_configs``, step 5), so an engine holds the fewest blocks of any stage.

Worked example, DeepSeek-V3 (61 MLA layers, 576-element fp8 latent: 35,136 bytes per token) on
8 x H200: TP8 keeps 78.4 GiB of weights per GPU and ~51 GiB of KV, 1.56 M tokens per replica
(each copied 8 times); DP8+EP keeps 93.9 GiB of weights (attention copied, experts split) and
~36 GiB of KV per GPU, 8 engines x ~1.1 M = ~8.8 M tokens per replica.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.facts.weights import weights_bytes_per_gpu
from kvtune.tuner.layout import ParallelLayout

# The embedding table and lm_head stay 16-bit in every checkpoint kvtune loads (weights.py).
TABLE_BYTES_PER_PARAM = 2


def kv_copies(model: ModelArchitecture, layout: ParallelLayout) -> int:
    """How many TP ranks of one engine hold each token's KV: MLA's latent is on all of them
    (vLLM's ``kv_tp_replicas``); standard attention's heads are split, copied only when TP
    exceeds the KV heads."""
    tp = layout.tensor_parallel
    if model.is_mla:
        # DCP splits the tokens among DCP ranks: tp / dcp copies of each (vLLM's
        # kv_tp_replicas says 1 whenever DCP is on).
        return tp // layout.decode_context_parallel
    return max(1, tp // max(1, model.num_kv_heads))


def engine_kv_tokens(layout: ParallelLayout, num_gpu_blocks: int, block_size: int) -> int:
    """Tokens one engine (DP rank) holds: every TP rank has the same blocks; under DCP a
    scheduler block is ``block_size * dcp`` tokens (``resolve_dcp_kv_block_size``)."""
    return max(0, num_gpu_blocks) * block_size * layout.decode_context_parallel


def replica_kv_tokens(layout: ParallelLayout, num_gpu_blocks: int, block_size: int) -> int:
    """Tokens a replica holds: its DP ranks' caches are separate, so they add up."""
    return layout.data_parallel * engine_kv_tokens(layout, num_gpu_blocks, block_size)


def pipeline_stage_layers(num_layers: int, pipeline_parallel: int) -> tuple[int, ...]:
    """Layers per PP stage as vLLM 0.33 splits them (``get_pp_indices`` without
    VLLM_PP_LAYER_PARTITION): even shares, the remainder one each to the stages before the
    last, counting back from it."""
    shares = [num_layers // pipeline_parallel] * pipeline_parallel
    for i in range(2, num_layers % pipeline_parallel + 2):
        shares[-i] += 1
    return tuple(shares)


@dataclass(frozen=True, slots=True)
class PipelineStage:
    """One PP stage of an engine, per GPU: its layers and its weights."""

    layers: int
    weights_bytes: int


def pipeline_stages(model: ModelArchitecture, weights_dtype: str, layout: ParallelLayout
                    ) -> tuple[PipelineStage, ...]:
    """Each stage's layers and weights per GPU (module docstring): the body (everything but
    the embedding table and lm_head, at the layout's TP x DP split) by the stage's share of the
    layers, plus one 16-bit vocab x hidden table / TP on the first and on the last stage."""
    whole = weights_bytes_per_gpu(model, weights_dtype, layout.tensor_parallel,
                                  data_parallel=layout.data_parallel)
    pp = layout.pipeline_parallel
    shares = pipeline_stage_layers(model.num_hidden_layers, pp)
    if pp == 1:
        return (PipelineStage(shares[0], whole),)
    table = -(-model.vocab_size * model.hidden_size * TABLE_BYTES_PER_PARAM
              // layout.tensor_parallel)
    tables = 1 if model.tie_word_embeddings else 2
    body = max(0, whole - tables * table)
    return tuple(
        PipelineStage(n, -(-body * n // model.num_hidden_layers)
                      + (table if i == 0 else 0) + (table if i == pp - 1 else 0))
        for i, n in enumerate(shares))

