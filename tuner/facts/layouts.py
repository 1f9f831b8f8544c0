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

Worked example, DeepSeek-V3 (61 MLA layers, 576-element fp8 latent: 35,136 bytes per token) on
8 x H200: TP8 keeps 78.4 GiB of weights per GPU and ~51 GiB of KV, 1.56 M tokens per replica
(each copied 8 times); DP8+EP keeps 93.9 GiB of weights (attention copied, experts split) and
~36 GiB of KV per GPU, 8 engines x ~1.1 M = ~8.8 M tokens per replica.
"""

from __future__ import annotations

from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.layout import ParallelLayout


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
