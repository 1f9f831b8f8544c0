"""The layout as a planned decision (planner/layout_choice.py) and the decode step under DP
and EP (planner/decode.py)."""

from __future__ import annotations

import pytest

from kvtune.tuner.errors import InvalidInput, NoFeasiblePlan
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.weights import weights_bytes_per_gpu
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.planner import decode
from kvtune.tuner.planner.checks import CHOSEN, PINNED
from kvtune.tuner.planner.layout_choice import candidate_layouts, choose_layout
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import Pins, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile

DSV3 = get_model("deepseek-ai/DeepSeek-V3")
LLAMA_70B = get_model("meta-llama/Llama-3.3-70B-Instruct")
H200, H100 = get_gpu_class("H200"), get_gpu_class("H100")


def _labels(layouts: list[ParallelLayout]) -> list[str]:
    return [x.label for x in layouts]


def test_candidates_offer_ep_to_moe_models_with_dp_and_honour_pins() -> None:
    assert _labels(candidate_layouts(DSV3, 8)) == ["TP8", "TP4xDP2+EP", "TP2xDP4+EP", "DP8+EP"]
    assert _labels(candidate_layouts(LLAMA_70B, 8)) == ["TP8", "TP4xDP2", "TP2xDP4", "DP8"]
    assert _labels(candidate_layouts(DSV3, 8, tp=2)) == ["TP2xDP4+EP"]
    assert _labels(candidate_layouts(DSV3, 8, dp=8, ep=False)) == ["DP8"]
    assert _labels(candidate_layouts(DSV3, 8, ep=True))[0] == "TP8+EP"
    assert _labels(candidate_layouts(DSV3, 16)) == [
        "TP16", "TP8xDP2+EP", "TP4xDP4+EP", "TP2xDP8+EP", "DP16+EP"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"gpus": 8, "tp": 3}, "tensor_parallel"),
    ({"gpus": 8, "dp": 3}, "data_parallel"),
    ({"gpus": 0}, "gpus_per_replica"),
    ({"gpus": 65}, "gpus_per_replica"),
    ({"gpus": 8, "tp": 4, "dp": 4}, "data_parallel"),
])
def test_impossible_layout_pins_are_refused_naming_the_field(kwargs: dict[str, int],
                                                              field: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        candidate_layouts(DSV3, **kwargs)  # type: ignore[arg-type]
    assert exc.value.field == field


def test_expert_parallel_on_a_dense_model_is_refused() -> None:
    with pytest.raises(InvalidInput, match="dense"):
        candidate_layouts(LLAMA_70B, 8, ep=True)
    req = PlanRequest(model=LLAMA_70B, gpu=H200, weights_dtype="fp8", expert_parallel=True,
                      profile=preset_profile("chat"))
    with pytest.raises(InvalidInput, match="expert_parallel"):
        plan_pool(req)


def test_dcp_is_pinned_only_onto_layouts_whose_tp_it_divides() -> None:
    assert _labels(candidate_layouts(DSV3, 8, dcp=2)) == [
        "TP8+DCP2", "TP4xDP2+EP+DCP2", "TP2xDP4+EP+DCP2"]
    with pytest.raises(InvalidInput) as exc:
        candidate_layouts(DSV3, 8, tp=8, dcp=3)
    assert exc.value.field == "decode_context_parallel"
    for model, tp, dcp in ((LLAMA_70B, 8, 2), (DSV3, 4, 8)):
        req = PlanRequest(model=model, gpu=H200, weights_dtype="auto", tensor_parallel=tp,
                          decode_context_parallel=dcp, profile=preset_profile("chat"))
        with pytest.raises(InvalidInput) as exc:
            plan_pool(req)
        assert exc.value.field == "decode_context_parallel"


def test_dcp_splits_a_sequence_over_the_tp_ranks() -> None:
    """TP8+DCP8 keeps TP8's blocks per GPU (same weights) but 8 tokens per block slot, so
    8 times the tokens, and a request takes 1/8 of the KV on each rank."""
    base = PlanRequest(model=DSV3, gpu=H200, tensor_parallel=8, profile=preset_profile("chat"),
                       policy=PlanPolicy(pins=Pins(kv_cache_dtype="fp8", block_size=64)))
    tp8 = plan_pool(base)
    dcp8 = plan_pool(base.model_copy(update={"decode_context_parallel": 8}))
    assert dcp8.vllm_args()[:2] == ["--tensor-parallel-size=8",
                                    "--decode-context-parallel-size=8"]
    # Blocks per GPU as TP8's (within the activation memory of its larger max-num-seqs).
    assert dcp8.expected.num_gpu_blocks == pytest.approx(tp8.expected.num_gpu_blocks, rel=0.01)
    # vLLM's int(blocks / blocks-per-request x max-model-len) in floats: at times one under.
    assert tp8.expected.kv_cache_tokens == pytest.approx(tp8.expected.num_gpu_blocks * 64, abs=1)
    assert dcp8.expected.kv_cache_tokens == pytest.approx(
        8 * dcp8.expected.num_gpu_blocks * 64, abs=8)
    assert dcp8.expected.concurrent_sequences >= 7 * tp8.expected.concurrent_sequences


def _request(gpu: str = "H200") -> PlanRequest:
    return PlanRequest(model=DSV3, gpu=get_gpu_class(gpu), profile=preset_profile("chat"))


def test_deepseek_v3_on_8_h200_gets_dp8_ep_with_the_layouts_weighed() -> None:
    pool = choose_layout(_request(), 8, plan_pool)
    assert pool.layout == ParallelLayout(tensor_parallel=1, data_parallel=8,
                                         expert_parallel=True)
    assert pool.tensor_parallel == 1
    assert pool.vllm_args()[:3] == [
        "--tensor-parallel-size=1", "--data-parallel-size=8", "--enable-expert-parallel"]
    by_label = {o.layout.label: o for o in pool.layouts_considered}
    assert list(by_label) == ["TP8", "TP4xDP2+EP", "TP2xDP4+EP", "DP8+EP"]
    assert [o.chosen for o in pool.layouts_considered] == [False, False, False, True]
    tp8, dp8 = by_label["TP8"], by_label["DP8+EP"]
    # TP8 copies every latent on 8 ranks: the replica holds one GPU's tokens.
    assert tp8.kv_copies == 8 and tp8.kv_cache_tokens_per_replica == tp8.kv_cache_tokens_per_engine
    assert dp8.kv_copies == 1
    assert dp8.kv_cache_tokens_per_replica == 8 * pool.expected.num_gpu_blocks * 64
    # Less KV per GPU (attention is copied on every rank) but over 5x the replica's tokens.
    assert dp8.kv_cache_tokens_per_engine < tp8.kv_cache_tokens_per_engine
    assert dp8.kv_cache_tokens_per_replica > 5 * tp8.kv_cache_tokens_per_replica
    assert dp8.score > tp8.score
    reason = pool.reasons[0]
    assert (reason.knob, reason.choice, reason.code) == ("layout", "DP8+EP", CHOSEN)
    assert "TP8" in reason.message and f"{dp8.kv_cache_tokens_per_replica:,}" in reason.message


def test_a_pinned_layout_is_planned_alone() -> None:
    pool = choose_layout(_request(), 8, plan_pool, tp=8)
    assert pool.layout is not None and pool.layout.label == "TP8"
    assert len(pool.layouts_considered) == 1 and pool.reasons[0].code == PINNED


def test_deepseek_v3_on_8_h100_names_the_gpu_count_that_fits_and_16_plans() -> None:
    with pytest.raises(NoFeasiblePlan) as exc:
        choose_layout(_request("H100"), 8, plan_pool)
    text = str(exc.value)
    assert "fits no layout of 8 H100" in text and "DP8+EP: needs" in text
    assert exc.value.suggestions == ["--gpus-per-replica 16 (e.g. 2 nodes of 8)"]
    pool = choose_layout(_request("H100"), 16, plan_pool)
    assert pool.layout is not None and pool.layout.label == "DP16+EP"
    assert pool.expected.kv_cache_tokens > 0


def test_tp_alone_decodes_as_before_and_dp_reads_the_replicas_tokens_experts() -> None:
    tp8 = ParallelLayout(tensor_parallel=8)
    w = weights_bytes_per_gpu(DSV3, "auto", 8)
    assert decode.decode_step_seconds(DSV3, H200, 8, w, 64, 1e6) == (
        decode.decode_step_seconds(DSV3, H200, 8, w, 64, 1e6, tp8))
    dp8 = ParallelLayout(tensor_parallel=1, data_parallel=8, expert_parallel=True)
    w8 = weights_bytes_per_gpu(DSV3, "auto", 1, data_parallel=8)
    # 8 own sequences route 8 x 8 tokens: more experts touched than 8 tokens alone would.
    alone = decode.weights_read_bytes(DSV3, w8, 8)
    assert decode.weights_read_bytes(DSV3, w8, 8, dp8) > alone
    # EP's all-to-alls are charged, and grow with the batch.
    small = decode.communication_seconds(DSV3, H200, dp8, 8)
    assert 0 < small < decode.communication_seconds(DSV3, H200, dp8, 512)
    no_ep = ParallelLayout(tensor_parallel=1, data_parallel=8)
    assert decode.communication_seconds(DSV3, H200, no_ep, 64) > 0
    assert decode.communication_seconds(DSV3, H200, ParallelLayout(), 64) == 0


MOE_MODELS = ["Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "mistralai/Mixtral-8x7B-Instruct-v0.1",
              "openai/gpt-oss-120b", "zai-org/GLM-4.5", "moonshotai/Kimi-K2-Instruct",
              "deepseek-ai/DeepSeek-R1"]


@pytest.mark.parametrize("name", MOE_MODELS)
def test_every_moe_model_gets_a_consistent_choice_or_a_named_gpu_count(name: str) -> None:
    """On 8 x H200: the chosen layout has the best score; each fitting layout's replica tokens
    are its DP ranks' together; or, when none fits, the error names a larger GPU count."""
    model = get_model(name)
    request = PlanRequest(model=model, gpu=H200, profile=preset_profile("chat"))
    try:
        pool = choose_layout(request, 8, plan_pool)
    except NoFeasiblePlan as exc:
        assert exc.suggestions and exc.suggestions[0].startswith("--gpus-per-replica 16")
        return
    options = pool.layouts_considered
    chosen = [o for o in options if o.chosen]
    assert len(chosen) == 1 and chosen[0].layout == pool.layout
    assert chosen[0].score == max(o.score for o in options if o.refused is None)
    for o in options:
        if o.refused is not None:
            assert o.kv_cache_tokens_per_replica == 0
            continue
        assert o.kv_cache_tokens_per_replica == o.layout.data_parallel * (
            o.kv_cache_tokens_per_engine)
        assert o.layout.expert_parallel == (o.layout.data_parallel > 1)
        assert o.vllm_args[0] == f"--tensor-parallel-size={o.layout.tensor_parallel}"
