"""kvtune's sizing of hybrid attention/Mamba and sliding-window models against vLLM 0.33's
own KV-cache configuration code, run on CPU, for six architectures (synthetic config.json
files shaped like the published ones: tests/tuner/facts/hybrid_configs.py).

Per architecture, vLLM's pieces are called at their lowest level that takes shapes:

- the Mamba state: the model class's ``get_mamba_state_shape_from_config`` /
  ``get_mamba_state_dtype_from_config`` on a config object holding the config.json's fields
  (Nemotron-H's config class first sets its float32 SSM dtype), against
  ``kvtune.facts.mamba.state_shapes``;
- the block size and padded Mamba page: ``Platform._align_hybrid_block_size`` with
  FlashAttention's kernel block sizes (the one model-level lookup, the attention backends
  of the built model, answered with FlashAttention);
- the groups and num_blocks: ``get_kv_cache_groups`` and ``get_kv_cache_config_from_groups``
  on one ``MambaSpec`` / ``FullAttentionSpec`` / ``SlidingWindowSpec`` per layer, for a
  given KV budget.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuner" / "facts"))

from hybrid_configs import HYBRID_CONFIGS

from kvtune.tuner.facts.hf_config import _merged_text_config
from kvtune.tuner.facts.kvmemory import (
    block_bytes,
    hybrid_block_size,
    kv_cache_groups,
    layer_kv_bytes_per_token,
    mamba_state_bytes,
    num_gpu_blocks,
)
from kvtune.tuner.facts.mamba import state_shapes
from kvtune.tuner.facts.models import ModelArchitecture

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# A KV budget that is not a whole number of any page (so the floor division is exercised).
BUDGET_BYTES = 37 * 2**30 + 12_345


class _ModelConfig(SimpleNamespace):
    def get_num_kv_heads(self, parallel_config: Any) -> int:
        return max(1, int(self.hf_config.num_key_value_heads)
                   // parallel_config.tensor_parallel_size)

    def get_head_size(self) -> int:
        return int(self.head_size)


def _vllm_config(cfg: dict[str, Any], model: ModelArchitecture, tp: int, cache: Any) -> Any:
    import torch

    hf = SimpleNamespace(**_merged_text_config(cfg))
    model_config = _ModelConfig(
        hf_config=hf, hf_text_config=hf, dtype=torch.bfloat16, use_mla=False,
        architecture=cfg["architectures"][0], architectures=cfg["architectures"],
        model_impl="auto", convert_type="none", runner_type="generate",
        head_size=model.head_dim)
    return SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=tp),
                           model_config=model_config, cache_config=cache,
                           num_speculative_tokens=0, speculative_config=None)


def _vllm_mamba(cfg: dict[str, Any], fake: Any) -> tuple[Any, Any]:
    from vllm.model_executor.models.config import NemotronHForCausalLMConfig
    from vllm.model_executor.models.registry import ModelRegistry

    if cfg["model_type"] == "nemotron_h":
        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(
            cache_config=fake.cache_config, hf_config=fake.model_config.hf_config)
    model_cls, _ = ModelRegistry.resolve_model_cls(
        fake.model_config.architecture, model_config=fake.model_config)
    return (model_cls.get_mamba_state_shape_from_config(fake),
            model_cls.get_mamba_state_dtype_from_config(fake))


def _align(fake: Any) -> None:
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    class _FlashAttentionOnly(Platform):
        @classmethod
        def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
            return [FlashAttentionBackend]

    _FlashAttentionOnly._align_hybrid_block_size(fake, FlashAttentionBackend)


def _layer_specs(cfg: dict[str, Any], model: ModelArchitecture, tp: int, block: int,
                 mamba: Any) -> dict[str, Any]:
    """One spec per cache-keeping layer, in the model's layer order."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    from kvtune.tuner.facts.mamba import layer_kinds

    text = _merged_text_config(cfg)
    n = model.num_hidden_layers
    found = layer_kinds(text, n, model.model_type)
    if found is not None:
        kinds, parallel = found
    else:  # Gemma 3: 5 sliding then 1 global.
        kinds, parallel = ["full" if (i + 1) % 6 == 0 else "sliding_window"
                           for i in range(n)], False
    heads = max(1, model.num_kv_heads // tp)
    specs: dict[str, Any] = {}
    for i, kind in enumerate(kinds):
        if kind == "full":
            specs[f"layers.{i}.attn"] = FullAttentionSpec(
                block_size=block, num_kv_heads=heads, head_size=model.head_dim,
                dtype=torch.bfloat16)
        elif kind == "sliding_window":
            specs[f"layers.{i}.attn"] = SlidingWindowSpec(
                block_size=block, num_kv_heads=heads, head_size=model.head_dim,
                dtype=torch.bfloat16, sliding_window=text["sliding_window"])
        if kind == "mamba" or parallel:
            shapes, dtypes, padded = mamba
            specs[f"layers.{i}.mamba"] = MambaSpec(
                shapes=shapes, dtypes=dtypes, block_size=block, page_size_padded=padded)
    return specs


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", sorted(HYBRID_CONFIGS))
def test_kvtune_sizes_hybrid_models_as_vllm_does(vllm: object, name: str, tp: int) -> None:
    from vllm.config import CacheConfig, DeviceConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.kv_cache_planning import (
        _get_kv_cache_bytes_per_block,
        get_kv_cache_config_from_groups,
        get_kv_cache_groups,
    )

    cfg = HYBRID_CONFIGS[name]
    model = ModelArchitecture.from_hf_config(cfg, name)
    cache = CacheConfig(block_size=16)
    fake = _vllm_config(cfg, model, tp, cache)
    mamba: tuple[Any, Any, int | None] | None = None
    if model.mamba is not None:
        shapes, dtypes = _vllm_mamba(cfg, fake)
        assert tuple(tuple(s) for s in shapes) == state_shapes(model.mamba, tp)
        _align(fake)
        mamba = (shapes, dtypes, cache.mamba_page_size_padded)
    # vLLM's block size (raised for Mamba, 16 otherwise) and its padded Mamba page.
    assert hybrid_block_size(model, "auto", tp, 16) == cache.block_size
    if mamba is not None:
        from vllm.v1.kv_cache_interface import MambaSpec

        unpadded = MambaSpec(shapes=mamba[0], dtypes=mamba[1], block_size=-1)
        assert mamba_state_bytes(model, tp) == unpadded.page_size_bytes
        page = cache.block_size * layer_kv_bytes_per_token(model, "auto", tp)
        assert (cache.mamba_page_size_padded or page) == page
    specs = _layer_specs(cfg, model, tp, cache.block_size, mamba)
    vllm_config = VllmConfig(
        device_config=DeviceConfig(device="cpu"), cache_config=CacheConfig(block_size=16),
        scheduler_config=SchedulerConfig(
            max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=8192,
            enable_chunked_prefill=True, is_encoder_decoder=False))
    # Without a model vLLM leaves its hybrid manager off; with one of these models it is on.
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False
    # The engine core's layout resolution, for a worker running FlashAttention.
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )

    layouts = [x.name for x in get_supported_kv_cache_layouts([FlashAttentionBackend])]
    resolve_kv_cache_layout(vllm_config, [layouts], specs.values())
    groups = get_kv_cache_groups(vllm_config, specs)
    config = get_kv_cache_config_from_groups(vllm_config, groups, BUDGET_BYTES)
    ours = kv_cache_groups(model)
    assert len(groups) == sum(g.count for g in ours)
    assert {len(g.layer_names) for g in groups} == {ours[0].layers_per_group}
    assert num_gpu_blocks(model, "auto", tp, 16, BUDGET_BYTES) == config.num_blocks
    layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    assert block_bytes(model, "auto", tp, 16) == _get_kv_cache_bytes_per_block(groups, layout)
