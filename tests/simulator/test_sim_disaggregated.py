"""Disaggregated serving on the simulator (tuner/simulator/disaggregated.py, disagg_search.py)
and the link facts (tuner/facts/kv_links.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from simhelpers import request

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts import catalog, gpus
from kvtune.tuner.facts.kv_links import FABRICS, KVLink, kv_link
from kvtune.tuner.planner.policy import Pins
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.simulator import disagg_search, disaggregated
from kvtune.tuner.simulator.disagg_search import (
    RolePlan,
    SplitOption,
    SplitPins,
    choose_split,
    plan_roles,
    role_request,
    steady_p95,
)
from kvtune.tuner.simulator.disaggregated import (
    LoadedPromptCost,
    RolePool,
    replay_colocated,
    replay_disaggregated,
    transfer_bytes_per_token,
)
from kvtune.tuner.simulator.engine import simulated_plan
from kvtune.tuner.simulator.scheduler import simulate

LLAMA8 = catalog.get_model("meta-llama/Llama-3.1-8B-Instruct")
H200 = gpus.get_gpu_class("H200")
FAST = KVLink("declared", 1e18, "test: instant")


def plan_request(rate: float = 4.0, model: object = LLAMA8) -> PlanRequest:
    profile = preset_profile("chat").model_copy(update={"request_rate_per_second": rate})
    return PlanRequest(model=model, gpu=H200, profile=profile)  # type: ignore[arg-type]


def pools(tp_p: int = 1, tp_d: int = 1, n_p: int = 1, n_d: int = 1
          ) -> tuple[RolePool, RolePool]:
    req = plan_request()
    prefill, decode = plan_roles(req, tp_p, tp_d)
    out = []
    for role, pool, n in (("prefill", prefill, n_p), ("decode", decode, n_d)):
        r = role_request(req, pool.tensor_parallel, req.policy.pins)
        out.append(RolePool(r, simulated_plan(r, pool.plan, role), n))
    return out[0], out[1]


def test_links_per_fabric() -> None:
    nv = kv_link("H200", 8)
    assert nv.fabric == "NVLink" and nv.bytes_per_second == 450e9
    rdma = kv_link("H200", 16)
    assert rdma.fabric == "RDMA" and rdma.bytes_per_second == 50e9  # 400 Gb/s
    assert kv_link("L40S", 8, declared_gbps=200).bytes_per_second == 25e9
    with pytest.raises(InvalidInput, match="--kv-link-gbps"):
        kv_link("L40S", 8)
    for facts in FABRICS.values():
        assert "https://" in facts.nvlink_source and "https://" in facts.rdma_source


def test_loaded_prompt_costs_one_token_per_sequence() -> None:
    _, decode = pools()
    base = decode.sim.cost
    loaded = LoadedPromptCost(**{f.name: getattr(base, f.name)
                                 for f in dataclasses.fields(base) if f.init})
    # A 4000-token prompt arrived by transfer: one query token over 4000 tokens of KV.
    pairs = 4000 * 4001 / 2
    assert loaded.step_seconds(4000, 4000, pairs, True, 1) == base.step_seconds(
        1, 4000, 4000.0, True, 1)
    assert loaded.step_seconds(4000, 4000, pairs, True, 1) < base.step_seconds(
        4000, 4000, pairs, True, 1)
    # A decode-only step is charged as before.
    assert loaded.step_seconds(8, 8000, 8000.0, True, 8) == base.step_seconds(
        8, 8000, 8000.0, True, 8)


def test_transfer_time_is_prompt_kv_over_the_link() -> None:
    prefill, decode = pools()
    one = [request(0, 0.0, 4000, 20)]
    per_token = transfer_bytes_per_token(decode)
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x (K, V) x the element's bytes.
    element = 1 if decode.sim.plan.kv_cache_dtype.startswith("fp8") else 2
    assert per_token == 32 * 8 * 128 * 2 * element
    slow = KVLink("declared", 1e9, "test: 1 GB/s")
    fast = replay_disaggregated(one, prefill, decode, FAST)
    late = replay_disaggregated(one, prefill, decode, slow)
    shift = late.first_token_seconds[0] - fast.first_token_seconds[0]
    assert math.isclose(shift, 4000 * per_token / 1e9, abs_tol=1e-6)
    # TPOT is the decode engine's: the same whatever the link.
    assert math.isclose(late.finish_seconds[0] - late.first_token_seconds[0],
                        fast.finish_seconds[0] - fast.first_token_seconds[0], abs_tol=1e-6)


def test_ttft_covers_prefill_then_transfer_then_decode() -> None:
    prefill, decode = pools()
    one = [request(0, 1.0, 4000, 20)]
    prefill_only = simulate([dataclasses.replace(one[0], output_tokens=1)],
                            prefill.sim.engine, prefill.sim.cost)
    link = KVLink("declared", 1e10, "test")
    res = replay_disaggregated(one, prefill, decode, link)
    ready = prefill_only.first_token_seconds[0]
    transfer = 4000 * transfer_bytes_per_token(decode) / 1e10
    assert res.first_token_seconds[0] > ready + transfer
    # One decode step after the KV arrives, not a prefill of 4000 tokens.
    assert res.first_token_seconds[0] - (ready + transfer) < 0.05


def test_one_link_queues_transfers_in_order() -> None:
    prefill, decode = pools(n_p=2)
    # Two prompts ready at the same time on two prefill engines, one decode engine.
    two = [request(0, 0.0, 4000, 5), request(1, 0.0, 4000, 5)]
    link = KVLink("declared", 1e8, "test: 100 MB/s")
    res = replay_disaggregated(two, prefill, decode, link)
    transfer = 4000 * transfer_bytes_per_token(decode) / 1e8
    gap = res.first_token_seconds[1] - res.first_token_seconds[0]
    assert math.isclose(gap, transfer, rel_tol=0.02)


def test_colocated_replays_round_robin_shares() -> None:
    _, decode = pools(n_d=2)
    reqs = [request(i, 0.01 * i, 500, 10) for i in range(4)]
    res = replay_colocated(reqs, decode)
    alone = simulate(reqs[0::2], decode.sim.engine, decode.sim.cost)
    assert res.first_token_seconds[0::2] == alone.first_token_seconds


def test_prefill_follows_decode_and_refuses_an_incompatible_pin() -> None:
    req = plan_request()
    prefill, decode = plan_roles(req, 1, 2, decode_pins=Pins(block_size=32,
                                                             kv_cache_dtype="fp8"))
    assert (prefill.plan.block_size, prefill.plan.kv_cache_dtype) == (32, "fp8")
    assert decode.plan.block_size == 32
    # A prefill-only pin holds on decode too.
    prefill, decode = plan_roles(req, 1, 1, prefill_pins=Pins(kv_cache_dtype="fp8"))
    assert decode.plan.kv_cache_dtype == "fp8"
    with pytest.raises(InvalidInput) as info:
        plan_roles(req, 1, 1, prefill_pins=Pins(block_size=32), decode_pins=Pins(block_size=16))
    assert str(info.value).startswith("block_size='prefill 32, decode 16'")


def test_choose_split_weighs_every_split_and_colocated() -> None:
    req = plan_request(rate=8.0)
    choice = choose_split(req, 4, kv_link("H200", 4), num_requests=120)
    labels = [o.label.split(" ")[0] for o in choice.options]
    assert labels[:3] == ["1P:3D", "2P:2D", "3P:1D"]
    assert [o.label for o in choice.options[3:]] == [
        "co-located TP1 x4", "co-located TP2 x2", "co-located TP4 x1"]
    chosen = [o for o in choice.options if o.chosen]
    assert chosen == [choice.chosen]
    assert choice.chosen.capacity_requests_per_second == max(
        o.capacity_requests_per_second for o in choice.options)
    assert all(o.capacity_requests_per_second > 0 for o in choice.options)
    split = choice.options[0]
    assert split.prefill is not None and split.decode is not None
    assert '--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_producer"}' in (
        split.prefill.vllm_args())
    assert ("co-located wins" in choice.message) == choice.colocated_wins
    assert choice.best_colocated is not None


def test_a_pin_no_split_can_honour_is_refused_once() -> None:
    with pytest.raises(InvalidInput, match=r"^kv_cache_dtype="):
        choose_split(plan_request(), 2, FAST, SplitPins(prefill=Pins(kv_cache_dtype="fp8"),
                                                        decode=Pins(kv_cache_dtype="auto")),
                     num_requests=40)


def test_p95_beside_a_capacity_is_over_the_judged_requests() -> None:
    reqs = [request(i, float(i), 100, 3) for i in range(10)]
    first = np.array([r.arrival_seconds + (10.0 if i == 0 else 1.0)
                      for i, r in enumerate(reqs)])
    finish = first + 0.1
    res = disaggregated._result(reqs, first, finish, "t")
    ttft, tpot = steady_p95(res)
    # The first request arrived in the warm-up (the first tenth): not judged, not counted.
    assert ttft == pytest.approx(1.0) and tpot == pytest.approx(0.05)
    assert res.summary()["ttft_p95_seconds"] > 1.0


@pytest.mark.parametrize(("split_rate", "chosen", "verdict"), [
    (10.3, "co-located", "co-located wins on 4 H200: co-located TP1 x4 10.10 req/s at SLO "
     "ties (within 2 %) with the best split 2P:2D 10.30 req/s"),
    (10.4, "2P:2D", "disaggregated 2P:2D 10.40 req/s at SLO on 4 H200, 3.0% over the best "
     "co-located option, co-located TP1 x4 10.10 req/s"),
    (8.0, "co-located", "co-located wins on 4 H200: co-located TP1 x4 10.10 req/s at SLO "
     "beats the best split 2P:2D 8.00 req/s"),
])
def test_a_split_must_beat_colocated_by_more_than_the_resolution(
        split_rate: float, chosen: str, verdict: str) -> None:
    req = plan_request()
    prefill, decode = plan_roles(req, 1, 1)
    options = [
        SplitOption("2P:2D", 2, 2, prefill=RolePlan("prefill", prefill, 2),
                    decode=RolePlan("decode", decode, 2),
                    capacity_requests_per_second=split_rate),
        SplitOption("co-located TP1 x4", 0, 4, colocated=RolePlan("decode", decode, 4),
                    capacity_requests_per_second=10.1),
        SplitOption("1P:3D", 1, 3, refused="test: refused"),
    ]
    choice = disagg_search._choice(req, 4, FAST, options)
    assert choice.chosen.label.startswith(chosen)
    assert choice.message == verdict
    assert choice.colocated_wins == (chosen == "co-located")
    assert sum(o.chosen for o in choice.options) == 1
