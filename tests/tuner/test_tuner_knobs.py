"""The knob table (kvtune.tuner.knobs) is the one vocabulary: KVPlan and Pins have exactly its
fields, the flags render by its rules, and the retune's margins come from it."""

from __future__ import annotations

import pytest

from kvtune.tuner import knobs
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.policy import Pins

BASE = KVPlan(block_size=16, kv_cache_dtype="fp8", gpu_memory_utilization=0.9,
              max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=8192,
              enable_prefix_caching=True)


def test_kvplan_and_pins_have_exactly_the_tables_fields() -> None:
    assert set(KVPlan.model_fields) == {k.name for k in knobs.KNOBS}
    assert set(Pins.model_fields) == {k.name for k in knobs.PINNABLE}
    assert len({k.flag for k in knobs.KNOBS}) == len(knobs.KNOBS)


def test_flags_render_in_table_order_by_the_tables_rules() -> None:
    assert BASE.vllm_args() == [
        "--block-size=16", "--kv-cache-dtype=fp8", "--gpu-memory-utilization=0.9",
        "--max-model-len=8192", "--max-num-seqs=64", "--max-num-batched-tokens=8192",
        "--enable-prefix-caching"]
    plan = BASE.model_copy(update={
        "kv_cache_memory_bytes": 2**34, "enable_prefix_caching": False,
        "kv_offloading_backend": "native", "quantization": "fp8_per_tensor",
        "allow_deprecated_quantization": True})
    args = plan.vllm_args()
    assert args[:2] == ["--quantization=fp8_per_tensor", "--allow-deprecated-quantization"]
    assert "--kv-cache-memory-bytes=17179869184" in args
    assert not any(a.startswith("--gpu-memory-utilization") for a in args)  # yields to bytes
    assert "--no-enable-prefix-caching" in args
    assert not any(a.startswith("--kv-offloading-backend") for a in args)  # needs a size
    with_size = plan.model_copy(update={"kv_offloading_size_gib": 32.0}).vllm_args()
    assert with_size[-2:] == ["--kv-offloading-size=32", "--kv-offloading-backend=native"]


def test_serve_args_put_tensor_parallel_first() -> None:
    assert knobs.serve_args(4, BASE.model_dump())[:2] == ["--tensor-parallel-size=4",
                                                          "--block-size=16"]


def test_every_flag_maps_back_to_its_knob() -> None:
    for knob in knobs.KNOBS:
        assert knobs.FLAG_TO_NAME[knob.flag] == knob.name
    assert knobs.FLAG_TO_NAME["no-enable-prefix-caching"] == "enable_prefix_caching"
    assert "no-allow-deprecated-quantization" not in knobs.FLAG_TO_NAME  # a switch


@pytest.mark.parametrize(("update", "material"), [
    ({"max_model_len": 8704}, False),  # +6 %: within the 10 % margin
    ({"max_model_len": 16384}, True),
    ({"max_num_seqs": 72}, False),  # +12.5 % < 20 %
    ({"gpu_memory_utilization": 0.91}, False),  # 0.01 < 0.02
    ({"gpu_memory_utilization": 0.95}, True),
    ({"block_size": 32}, True),
    ({"quantization": "fp8_per_tensor"}, True),
    ({"kv_cache_memory_bytes": 2**34}, True),  # None -> a value always counts
])
def test_material_changes_use_each_knobs_margin(update: dict[str, object],
                                                material: bool) -> None:
    found, noise = knobs.material_changes(BASE.model_dump(),
                                          BASE.model_copy(update=update).model_dump())
    assert bool(found) is material and bool(noise) is not material, (found, noise)
    name = next(iter(update))
    assert (found or noise)[0].startswith(f"{name} ")


def test_camel_names_follow_the_crd() -> None:
    assert knobs.camel_name(knobs.BY_NAME["kv_offloading_size_gib"]) == "kvOffloadingSizeGiB"
    assert knobs.camel_name(knobs.BY_NAME["max_num_batched_tokens"]) == "maxNumBatchedTokens"
