"""RAG (the article's pattern 1): what non-prefix reuse (LMCache's CacheBlend) would save on
a trace of retrieved chunks, an **estimate**, and whether the pinned versions can run it.

A RAG prompt is an instruction, a few retrieved chunks in ranked order, then the question.
vLLM's prefix cache reuses a block only when everything before it is the same, so a popular
chunk is reused only when it comes at the same place after the same chunks; CacheBlend
(LMCache's ``enable_blending``) reuses a chunk's KV wherever it sits and recomputes a share of
its tokens to repair the cross-attention it lacks. Per request, unbounded caches:

- prefix-cached tokens: the instruction and the chunks up to the first (instruction, chunks
  so far) sequence not seen before;
- blendable tokens: every later chunk seen before in any request, times (1 - recompute
  ratio); the ratio is CacheBlend's 15 % (Yao et al., "CacheBlend", EuroSys 2025, its
  default setting); lmcache 0.5.6 has no default (``blend_recompute_ratios`` None; the
  blender asserts one is set).

Both are upper bounds (no cache is unbounded), so the estimate is the gap between two ideals,
labelled as such.

**Not turned on in vLLM 0.33 + lmcache 0.5.6** (``BLEND_UNSUPPORTED``): with
``enable_blending`` the connector's worker builds ``LMCBlenderBuilder.get_or_create``, which
calls ``VLLMModelTracker.get_model("vllm-instance")``; nothing in vLLM 0.33.0 or lmcache
0.5.6 calls ``VLLMModelTracker.register_model``, so it raises "vllm model for vllm-instance
not found" at start. It also knows only Llama, Qwen2 and Qwen3 (``lmcache/v1/compute/
models/utils.py: infer_model_from_vllm``), needs ``use_layerwise`` and the application to
separate chunks with ``blend_special_str`` (" # # ").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RECOMPUTE_RATIO = 0.15
BLEND_UNSUPPORTED = (
    "CacheBlend (LMCache's non-prefix reuse) stays off: on vLLM 0.33.0 with lmcache 0.5.6 "
    "enable_blending fails at start (nothing registers the model its blender needs: "
    "'vllm model for vllm-instance not found'); chunks are reused only as a prefix "
    "(docs/reuse-patterns.md)")


@dataclass(frozen=True, slots=True)
class RagRequest:
    instruction_id: int
    chunk_ids: tuple[int, ...]  # retrieved chunks in prompt order
    question_tokens: int


@dataclass(frozen=True, slots=True)
class BlendEstimate:
    prompt_tokens: int
    prefix_cached_tokens: int
    blendable_tokens: float  # non-prefix chunk tokens reused, less the recomputed share

    @property
    def prefix_share(self) -> float:
        return self.prefix_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def blend_extra_share(self) -> float:
        """Prompt tokens CacheBlend would skip beyond the prefix cache (an estimate)."""
        return self.blendable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def estimate(requests: Sequence[RagRequest], instruction_tokens: int, chunk_tokens: int,
             recompute_ratio: float = RECOMPUTE_RATIO) -> BlendEstimate:
    """Prefix-cache and CacheBlend reuse over ``requests`` in order (module doc)."""
    prefixes: set[tuple[int, ...]] = set()
    chunks: set[int] = set()
    total = prefix = 0
    blend = 0.0
    for r in requests:
        total += instruction_tokens + len(r.chunk_ids) * chunk_tokens + r.question_tokens
        key: tuple[int, ...] = (r.instruction_id,)
        matched = key in prefixes
        prefix += instruction_tokens if matched else 0
        prefixes.add(key)
        for c in r.chunk_ids:
            key = (*key, c)
            if matched and key in prefixes:
                prefix += chunk_tokens
            else:
                matched = False
                if c in chunks:
                    blend += chunk_tokens * (1.0 - recompute_ratio)
            prefixes.add(key)
            chunks.add(c)
    return BlendEstimate(total, prefix, blend)


__all__ = ["BLEND_UNSUPPORTED", "RECOMPUTE_RATIO", "BlendEstimate", "RagRequest", "estimate"]
