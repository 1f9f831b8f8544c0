"""Per-role KV plan compatibility for vLLM 0.33's NixlConnector (planner/disagg_compat.py):
one test per rule, each refusal one line naming the field, both values and a fix; and the
kv-transfer-config flags per role (tuner/kv_transfer.py)."""

from __future__ import annotations

import json

import pytest

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts import catalog
from kvtune.tuner.kv_transfer import kv_transfer_args, kv_transfer_config
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.disagg_compat import RoleKV, check_pair

LLAMA = catalog.get_model("meta-llama/Llama-3.3-70B-Instruct")  # 8 KV heads, GQA
DSV3 = catalog.get_model("deepseek-ai/DeepSeek-V3")  # MLA

PLAN = KVPlan(block_size=16, kv_cache_dtype="fp8", gpu_memory_utilization=0.9,
              max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192,
              enable_prefix_caching=True)


def side(role: str, tp: int = 4, **plan_changes: object) -> RoleKV:
    extra = {k: plan_changes.pop(k) for k in list(plan_changes)
             if k not in KVPlan.model_fields}
    return RoleKV(role=role, plan=PLAN.model_copy(update=plan_changes), tensor_parallel=tp,
                  **extra)


def refused(prefill: RoleKV, decode: RoleKV, model: object = LLAMA) -> str:
    with pytest.raises(InvalidInput) as info:
        check_pair(model, prefill, decode)  # type: ignore[arg-type]
    text = str(info.value)
    assert "\n" not in text
    return text


def test_identical_plans_are_accepted() -> None:
    check_pair(LLAMA, side("prefill"), side("decode"))


@pytest.mark.parametrize(("field", "p", "d"), [
    ("kv_cache_dtype", {"kv_cache_dtype": "fp8"}, {"kv_cache_dtype": "auto"}),
    # vLLM hashes the string: auto and bfloat16 differ even when auto means bfloat16.
    ("kv_cache_dtype", {"kv_cache_dtype": "auto"}, {"kv_cache_dtype": "bfloat16"}),
    ("attention_backend", {"attention_backend": "FLASHINFER"}, {}),
    ("dtype", {"dtype": "float16"}, {}),
    ("hybrid_kv_cache_manager", {"hybrid_kv_cache_manager": False}, {}),
    ("vllm_version", {"vllm_version": "0.32.0"}, {}),
    ("connector", {"connector": "NixlPushConnector"}, {}),
])
def test_compatibility_hash_factors_must_match(field: str, p: dict[str, object],
                                               d: dict[str, object]) -> None:
    text = refused(side("prefill", **p), side("decode", **d))
    assert text.startswith(f"{field}=") and "prefill" in text and "decode" in text
    assert "on both roles" in text


def test_hybrid_manager_auto_equals_enabled_with_nixl() -> None:
    # NIXL implements SupportsHMA: vLLM leaves the manager on when neither side says.
    check_pair(LLAMA, side("prefill", hybrid_kv_cache_manager=True), side("decode"))


@pytest.mark.parametrize(("ptp", "dtp", "ok"), [
    (4, 4, True), (2, 8, True), (8, 2, True), (1, 8, True), (8, 8, True),
    (3, 2, False), (2, 3, False), (4, 6, False),
])
def test_tp_ratio_one_divides_the_other(ptp: int, dtp: int, ok: bool) -> None:
    p, d = side("prefill", tp=ptp), side("decode", tp=dtp)
    if ok:
        check_pair(LLAMA, p, d)
    else:
        text = refused(p, d)
        assert text.startswith("tensor_parallel='prefill") and "divides" in text


def test_prefill_tp_above_kv_heads_cannot_feed_a_smaller_decode_tp() -> None:
    small_heads = LLAMA.model_copy(update={"num_kv_heads": 2})
    text = refused(side("prefill", tp=4), side("decode", tp=2), small_heads)
    assert "KV heads" in text and "tensor_parallel" in text
    check_pair(small_heads, side("prefill", tp=2), side("decode", tp=4))


@pytest.mark.parametrize(("pb", "db", "ptp", "dtp", "ok"), [
    (16, 16, 4, 4, True),
    (16, 32, 4, 4, True),   # decode a multiple of prefill
    (32, 16, 4, 4, False),  # decode smaller: not a multiple
    (16, 48, 4, 4, True),
    (16, 24, 4, 4, False),
    (16, 32, 8, 4, False),  # P TP > D TP (non-MLA): equal only
    (16, 32, 4, 8, True),
])
def test_block_size_rules(pb: int, db: int, ptp: int, dtp: int, ok: bool) -> None:
    p, d = side("prefill", tp=ptp, block_size=pb), side("decode", tp=dtp, block_size=db)
    if ok:
        check_pair(LLAMA, p, d)
    else:
        text = refused(p, d)
        assert text.startswith(f"block_size='prefill {pb}, decode {db}'")
        assert "--block-size" in text


def test_block_sizes_differ_only_without_a_host_buffer() -> None:
    text = refused(side("prefill", block_size=16, kv_buffer_device="cpu"),
                   side("decode", block_size=32, kv_buffer_device="cpu"))
    assert "host buffer" in text


def test_mla_block_sizes_may_differ_under_higher_prefill_tp() -> None:
    # MLA's latent is replicated, so the P TP > D TP restriction does not apply.
    check_pair(DSV3, side("prefill", tp=8, block_size=64),
               side("decode", tp=4, block_size=128))


def test_kv_cache_layout_must_match_for_non_mla() -> None:
    text = refused(side("prefill", kv_cache_layout="LBNHC"), side("decode"))
    assert text.startswith("kv_cache_layout='prefill LBNHC, decode LBHNC'")
    assert "VLLM_KV_CACHE_LAYOUT" in text
    # HND is vLLM's alias for LBHNC, the connector's default.
    check_pair(LLAMA, side("prefill", kv_cache_layout="HND"), side("decode"))
    # MLA layouts are not compared.
    check_pair(DSV3, side("prefill", kv_cache_layout="LBNHC"), side("decode"))


def test_permute_local_kv_receives_lbhnc_into_lbnhc() -> None:
    check_pair(LLAMA, side("prefill"),
               side("decode", kv_cache_layout="LBNHC", enable_permute_local_kv=True))


def test_unequal_tp_needs_a_block_contiguous_layout() -> None:
    text = refused(side("prefill", tp=2, kv_cache_layout="LBNHC"),
                   side("decode", tp=4, kv_cache_layout="LBNHC"))
    assert "block-contiguous" in text
    check_pair(LLAMA, side("prefill", tp=4, kv_cache_layout="LBNHC"),
               side("decode", tp=4, kv_cache_layout="LBNHC"))


def test_unknown_layout_is_refused() -> None:
    assert "VLLM_KV_CACHE_LAYOUT" in refused(side("prefill", kv_cache_layout="XYZ"),
                                             side("decode"))


def test_decode_context_parallel_rules() -> None:
    assert "only for MLA" in refused(side("prefill", decode_context_parallel=4),
                                     side("decode"))
    assert "1 or the TP" in refused(side("prefill"), side("decode", decode_context_parallel=2),
                                    DSV3)
    check_pair(DSV3, side("prefill", tp=8, decode_context_parallel=8),
               side("decode", tp=4, decode_context_parallel=4))
    # 8 and 4 divide one another; 4 and 6 would not (and 6 is no TP here).
    check_pair(DSV3, side("prefill", tp=4, decode_context_parallel=4), side("decode", tp=4))


def test_kv_transfer_config_per_role() -> None:
    assert kv_transfer_config("prefill") == {"kv_connector": "NixlConnector",
                                             "kv_role": "kv_producer"}
    assert kv_transfer_config("decode") == {"kv_connector": "NixlConnector",
                                            "kv_role": "kv_consumer"}
    (arg,) = kv_transfer_args("decode", kv_buffer_device="cpu")
    flag, _, value = arg.partition("=")
    assert flag == "--kv-transfer-config"
    assert json.loads(value) == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                                 "kv_buffer_device": "cpu"}
