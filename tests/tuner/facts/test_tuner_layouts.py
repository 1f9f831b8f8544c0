"""Parallel layouts: flags, labels, weights and KV copies per GPU, tokens per replica
(tuner/layout.py, tuner/facts/layouts.py, weights_bytes_per_gpu's data_parallel)."""

from __future__ import annotations

import pytest

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.layouts import kv_copies, replica_kv_tokens
from kvtune.tuner.facts.weights import (
    expert_weights_bytes,
    weights_bytes_per_gpu,
    weights_bytes_total,
)
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan import KVPlan, PoolPlan

DSV3 = get_model("deepseek-ai/DeepSeek-V3")
LLAMA_70B = get_model("meta-llama/Llama-3.3-70B-Instruct")


def test_decode_context_parallel_flag_label_copies_and_tokens() -> None:
    layout = ParallelLayout(tensor_parallel=8, decode_context_parallel=8)
    assert layout.label == "TP8+DCP8"
    assert layout.vllm_args() == ["--tensor-parallel-size=8", "--decode-context-parallel-size=8"]
    assert kv_copies(DSV3, layout) == 1
    assert kv_copies(DSV3, ParallelLayout(tensor_parallel=8, decode_context_parallel=2)) == 4
    # A scheduler block is block_size x DCP tokens.
    assert replica_kv_tokens(layout, 1000, 64) == 512_000
    two = ParallelLayout(tensor_parallel=2, data_parallel=4, expert_parallel=True,
                         decode_context_parallel=2)
    assert two.label == "TP2xDP4+EP+DCP2"
    assert replica_kv_tokens(two, 1000, 64) == 4 * 2 * 64_000


@pytest.mark.parametrize(("tp", "dp", "ep", "label", "args"), [
    (8, 1, False, "TP8", ["--tensor-parallel-size=8"]),
    (1, 8, True, "DP8+EP",
     ["--tensor-parallel-size=1", "--data-parallel-size=8", "--enable-expert-parallel"]),
    (2, 4, True, "TP2xDP4+EP",
     ["--tensor-parallel-size=2", "--data-parallel-size=4", "--enable-expert-parallel"]),
    (1, 1, False, "TP1", ["--tensor-parallel-size=1"]),
    (1, 2, False, "DP2", ["--tensor-parallel-size=1", "--data-parallel-size=2"]),
])
def test_flags_and_labels(tp: int, dp: int, ep: bool, label: str, args: list[str]) -> None:
    layout = ParallelLayout(tensor_parallel=tp, data_parallel=dp, expert_parallel=ep)
    assert layout.label == label
    assert layout.vllm_args() == args
    assert layout.gpus == tp * dp
    assert layout.expert_parallel_size == (tp * dp if ep else 1)


def test_experts_split_over_every_rank_and_attention_copied_per_dp_rank() -> None:
    total = weights_bytes_total(DSV3, "auto")
    experts = expert_weights_bytes(DSV3, "auto")
    # DeepSeek-V3's routed experts: 58 MoE layers x 256 x 3 x 7168 x 2048 at fp8 (+ scales).
    assert experts == int(58 * 256 * 3 * 7168 * 2048 * 1.001)
    assert weights_bytes_per_gpu(DSV3, "auto", 8) == -(-total // 8)
    dp8 = weights_bytes_per_gpu(DSV3, "auto", 1, data_parallel=8)
    assert dp8 == (total - experts) + -(-experts // 8)
    # DP copies attention on every rank: heavier per GPU than TP8, lighter than TP1.
    assert weights_bytes_per_gpu(DSV3, "auto", 8) < dp8 < total
    assert weights_bytes_per_gpu(DSV3, "auto", 2, data_parallel=4) == (
        -(-(total - experts) // 2) + -(-experts // 8))
    # A dense model under DP keeps a full copy per rank.
    assert weights_bytes_per_gpu(LLAMA_70B, "fp8", 1, data_parallel=4) == weights_bytes_total(
        LLAMA_70B, "fp8")
    assert expert_weights_bytes(LLAMA_70B, "fp8") == 0
    with pytest.raises(InvalidInput, match="data_parallel"):
        weights_bytes_per_gpu(DSV3, "auto", 1, data_parallel=0)


def test_mla_is_copied_on_every_tp_rank_and_gqa_split() -> None:
    assert kv_copies(DSV3, ParallelLayout(tensor_parallel=8)) == 8
    assert kv_copies(DSV3, ParallelLayout(tensor_parallel=1, data_parallel=8)) == 1
    assert kv_copies(DSV3, ParallelLayout(tensor_parallel=2, data_parallel=4)) == 2
    assert kv_copies(LLAMA_70B, ParallelLayout(tensor_parallel=8)) == 1  # 8 KV heads
    assert kv_copies(LLAMA_70B, ParallelLayout(tensor_parallel=16)) == 2


def test_replica_tokens_add_up_over_dp_ranks_only() -> None:
    assert replica_kv_tokens(ParallelLayout(tensor_parallel=8), 1000, 64) == 64_000
    assert replica_kv_tokens(ParallelLayout(tensor_parallel=1, data_parallel=8), 1000, 64) == (
        512_000)
    assert replica_kv_tokens(ParallelLayout(tensor_parallel=1, data_parallel=8), -5, 64) == 0


def _pool(layout: ParallelLayout | None) -> PoolPlan:
    from kvtune.tuner.plan import ExpectedFigures

    plan = KVPlan(block_size=64, kv_cache_dtype="fp8", gpu_memory_utilization=0.9,
                  max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=2048,
                  enable_prefix_caching=True)
    figures = ExpectedFigures.model_validate({
        name: 1 for name, f in ExpectedFigures.model_fields.items() if f.is_required()})
    return PoolPlan(model_id="m", gpu_class="H200", tensor_parallel=1, vllm_version="0.33.0",
                    plan=plan, expected=figures, reasons=(), layout=layout)


def test_pool_plan_renders_the_layout_flags_and_drops_an_unset_layout_from_its_dump() -> None:
    plain = _pool(None)
    assert "layout" not in plain.model_dump() and "layouts_considered" not in plain.model_dump()
    assert plain.vllm_args()[0] == "--tensor-parallel-size=1"
    dp = _pool(ParallelLayout(tensor_parallel=1, data_parallel=8, expert_parallel=True))
    assert dp.vllm_args()[:3] == [
        "--tensor-parallel-size=1", "--data-parallel-size=8", "--enable-expert-parallel"]
    assert dp.vllm_args()[3:] == plain.vllm_args()[1:]
    assert PoolPlan.model_validate(dp.model_dump()) == dp
