"""Where the layout decision is shown (issue 26 item 4) and decode context parallel in the CRD
(item 1): ``status.pools[].layouts`` lists the layouts a ``gpusPerReplica`` pool weighed from
a real plan (the chosen one marked, each with its KV per replica and its ranking figure, and
its cost with the capacity search and a price); ``pools[].decodeContextParallel`` plans and
renders ``--decode-context-parallel-size``, and is refused as ``kvtune plan --dcp`` is."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from test_op_leader_worker_set import spec_for
from test_op_status_round_trip import through_api
from test_op_tp_auto import _planned

from kvtune.operator.api import InferenceDeploymentSpec, LayoutOptionStatus, PoolStatus
from kvtune.operator.api import conditions as cond
from kvtune.operator.api.pool_status import MAX_LAYOUTS_IN_STATUS
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.reconcile import base_status
from kvtune.operator.rollout.layout_status import layouts_status
from kvtune.operator.rollout.outcome import Event, PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import PlanInput, plan, policy_for, resolve_model
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan import LayoutOption

H200_8: dict[str, Any] = {"gpuClass": "H200", "name": "h200", "replicas": 1, "gpusPerReplica": 8}


def test_status_lists_the_layouts_weighed_and_why_dp8_ep_beat_tp8() -> None:
    planned = _planned(spec_for(H200_8))
    rows = planned.status.layouts
    by = {r.layout: r for r in rows}
    # The labels as tuner/layout.py spells them, in the planner's order.
    assert [r.layout for r in rows] == ["TP8", "TP4xDP2+EP", "TP2xDP4+EP", "DP8+EP"]
    assert [r.layout for r in rows if r.chosen] == ["DP8+EP"]
    tp8, dp8 = by["TP8"], by["DP8+EP"]
    # TP8 holds each latent 8 times; DP8+EP once, so 5.7 times the replica's tokens.
    assert (tp8.kv_copies, dp8.kv_copies) == (8, 1)
    assert dp8.kv_cache_tokens_per_replica > 5 * tp8.kv_cache_tokens_per_replica
    # By the rules (no rate): ranked by sequences within the TPOT target, no capacity/cost.
    assert tp8.sequences_within_tpot is not None and dp8.sequences_within_tpot is not None
    assert dp8.sequences_within_tpot > tp8.sequences_within_tpot
    assert all(r.capacity_requests_per_second is None and r.usd_per_replica_hour is None
               for r in rows)
    # The same figures as the plan's own list.
    considered = {o.layout.label: o for o in planned.pool_plan.layouts_considered}
    assert dp8.kv_cache_tokens_per_replica == considered["DP8+EP"].kv_cache_tokens_per_replica
    # Through the API server and back, unchanged.
    dumped = planned.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert "layouts" in dumped and dumped["layouts"][3]["layout"] == "DP8+EP"
    assert PoolStatus.model_validate(through_api(dumped)).layouts == rows


def test_a_pinned_layout_has_no_layouts_in_status() -> None:
    planned = _planned(spec_for({"gpuClass": "H200", "name": "h200", "tensorParallel": 8}))
    assert planned.status.layouts == []


def _option(label_tp: int, score: float, chosen: bool = False) -> LayoutOption:
    return LayoutOption(layout=ParallelLayout(tensor_parallel=label_tp), kv_copies=1,
                        weights_bytes_per_gpu=1, score=score, chosen=chosen)


def test_the_status_list_is_capped_and_keeps_the_chosen_layout() -> None:
    planned = _planned(spec_for(H200_8))
    many = tuple(_option(t, float(t), chosen=t == 1) for t in range(1, 13))
    rows = layouts_status(planned.pool_plan.model_copy(update={"layouts_considered": many}))
    assert len(rows) == MAX_LAYOUTS_IN_STATUS
    assert [r.layout for r in rows if r.chosen] == ["TP1"]  # lowest score, kept: chosen
    assert "TP12" in [r.layout for r in rows] and "TP2" not in [r.layout for r in rows]
    with pytest.raises(ValidationError):
        PoolStatus.model_validate({**planned.status.model_dump(), "layouts": [
            LayoutOptionStatus(layout=f"TP{t}", kv_copies=1, weights_bytes_per_gpu=1)
            for t in range(MAX_LAYOUTS_IN_STATUS + 1)]})


# --- decodeContextParallel ---------------------------------------------------------------


def test_a_pinned_dcp_plans_and_renders_its_flag() -> None:
    planned = _planned(spec_for({"gpuClass": "H200", "name": "h200", "tensorParallel": 8,
                                 "decodeContextParallel": 8}))
    layout = planned.pool_plan.layout
    assert layout is not None and layout.decode_context_parallel == 8
    assert "--decode-context-parallel-size=8" in planned.status.vllm_args
    # Each latent once over the 8 ranks instead of 8 times: more tokens than TP8 alone.
    plain = _planned(spec_for({"gpuClass": "H200", "name": "h200", "tensorParallel": 8}))
    assert planned.pool_plan.expected.kv_cache_tokens > \
        3 * plain.pool_plan.expected.kv_cache_tokens


def test_dcp_beside_gpus_per_replica_goes_to_every_layout_whose_tp_it_divides() -> None:
    planned = _planned(spec_for({**H200_8, "decodeContextParallel": 2}))
    labels = [r.layout for r in planned.status.layouts]
    assert labels == ["TP8+DCP2", "TP4xDP2+EP+DCP2", "TP2xDP4+EP+DCP2"]  # not DP8: TP1
    assert "--decode-context-parallel-size=2" in planned.status.vllm_args


def test_dcp_on_a_model_without_mla_fails_in_one_line_naming_the_field() -> None:
    spec = spec_for({"gpuClass": "H100", "name": "h100", "tensorParallel": 2,
                     "decodeContextParallel": 2}, model="meta-llama/Llama-3.1-8B-Instruct")
    ctx = PoolContext(spec=spec, index=0, pool=spec.pools[0],
                      body={"metadata": {"name": "bot", "namespace": "llm", "uid": "u"}},
                      kube=None, now="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
                      base=base_status(spec, spec.pools[0], None, "bot"), events=list[Event]())
    out = plan(ctx, PlanInput(model=resolve_model(spec, "llm", None),
                              profile=declared_profile(spec.workload), policy=policy_for(spec),
                              profile_used=None))
    assert isinstance(out, PoolOutcome) and out.failure is not None
    reason, message = out.failure
    assert reason == cond.INVALID_SPEC and "\n" not in message
    assert "pools[].decodeContextParallel=2" in message and "MLA" in message
    assert "drop decodeContextParallel" in message


@pytest.mark.parametrize(("pool", "needle"), [
    ({"tensorParallel": 2, "decodeContextParallel": 4}, "must divide a pinned tensorParallel"),
    ({"decodeContextParallel": 2}, "must divide a pinned tensorParallel"),  # TP 1
    ({"tensorParallel": "auto", "decodeContextParallel": 2},
     "must divide a pinned tensorParallel"),
    ({"gpusPerReplica": 8, "decodeContextParallel": 3}, "must divide gpusPerReplica"),
    ({"decodeContextParallel": 0}, "greater than or equal to 1"),
])
def test_the_operator_refuses_a_dcp_the_cli_refuses(pool: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        spec_for({"gpuClass": "H200", "name": "h200", **pool})


def test_dcp_on_a_role_is_refused() -> None:
    pools = [{"gpuClass": "H200", "name": "pre", "role": "prefill", "tensorParallel": 8,
              "decodeContextParallel": 2},
             {"gpuClass": "H200", "name": "dec", "role": "decode", "prefillPool": "pre",
              "tensorParallel": 8}]
    raw = spec_for(H200_8).model_dump(mode="json", by_alias=True, exclude_none=True)
    with pytest.raises(ValidationError, match="planned without decode context parallel"):
        InferenceDeploymentSpec.model_validate({**raw, "pools": pools})


def test_dcp_counts_in_the_planning_digest() -> None:
    from kvtune.operator.rollout.plan import planning_inputs

    model = get_model("deepseek-ai/DeepSeek-V3")
    a = spec_for({"gpuClass": "H200", "name": "h200", "tensorParallel": 8})
    b = spec_for({"gpuClass": "H200", "name": "h200", "tensorParallel": 8,
                  "decodeContextParallel": 2})
    profile = declared_profile(a.workload)
    assert planning_inputs(a, a.pools[0], model, profile, policy_for(a), None) != \
        planning_inputs(b, b.pools[0], model, profile, policy_for(b), None)


# --- with the capacity search (the simulator stood in for: its summary of one engine) -------

ENGINE_CAPACITY = {8: 6.0, 4: 4.0, 2: 2.5, 1: 1.5}  # req/s at SLO of one engine, by its TP
OBSERVED = 40.0


def _fake_search(calls: list[tuple[str, int]]) -> Any:
    """``plan_by_goodput`` as the operator calls it: the rules' plan with a summary of one
    engine on its share of the ``replicas`` (engines) sharing the rate."""
    from kvtune.tuner.plan import PoolPlan, SearchSummary
    from kvtune.tuner.planner.capacity import replicas_needed
    from kvtune.tuner.planner.planning import plan_pool

    def fake(req: Any, *, replicas: int = 1, **_: Any) -> PoolPlan:
        calls.append((req.layout.label, replicas))
        share, capacity = OBSERVED / replicas, ENGINE_CAPACITY[req.tensor_parallel]
        return plan_pool(req).model_copy(update={"search": SearchSummary(
            observed_rate_per_second=OBSERVED, replicas=replicas,
            rate_per_replica_per_second=share, littles_law_sequences=10,
            capacity_requests_per_second=capacity, slo_attainment=0.99,
            ttft_p95_seconds=0.5, tpot_p95_seconds=0.02, slo_met=True, slo_set=True,
            replicas_needed=replicas_needed(replicas, capacity / share), candidates=3,
            simulated_requests=100, requests_per_candidate=50, changed_from="rules' plan")})

    return fake


def _with_rate(pool: dict[str, Any]) -> InferenceDeploymentSpec:
    raw = spec_for(pool).model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["workload"]["requestRatePerSecond"] = OBSERVED
    return InferenceDeploymentSpec.model_validate(raw)


def test_searched_layouts_show_capacity_and_cost_per_replica(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtune.tuner.simulator import goodput_search

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(goodput_search, "plan_by_goodput", _fake_search(calls))
    planned = _planned(_with_rate({**H200_8, "replicas": 2, "gpuPriceUsdPerHour": 4.0}))
    # Each layout's engine searched on its share: 2 replicas x DP engines.
    assert calls == [("TP8", 2), ("TP4xDP2+EP", 4), ("TP2xDP4+EP", 8), ("DP8+EP", 16)]
    by = {r.layout: r for r in planned.status.layouts}
    assert [r.layout for r in planned.status.layouts if r.chosen] == ["DP8+EP"]  # 8 x 1.5
    assert by["DP8+EP"].capacity_requests_per_second == 12.0
    assert by["TP8"].capacity_requests_per_second == 6.0
    assert all(r.sequences_within_tpot is None and r.usd_per_replica_hour == 32.0
               for r in planned.status.layouts)
    assert by["DP8+EP"].cost_per_million_good_requests_usd == pytest.approx(
        32.0 * 1e6 / 3600 / 12.0, rel=1e-3)
    assert by["TP8"].cost_per_million_good_requests_usd == pytest.approx(
        32.0 * 1e6 / 3600 / 6.0, rel=1e-3)
    # The pool's cost and expected figures are the replica's (8 GPUs, 12 req/s), not an
    # engine's; the traffic needs ceil(40 / 12) = 4 replicas, not 27 engines.
    cost, expected = planned.status.cost, planned.status.expected
    assert cost is not None and cost.gpus_per_replica == 8
    assert cost.cost_per_million_good_requests_usd == \
        by["DP8+EP"].cost_per_million_good_requests_usd
    assert expected is not None and expected.capacity_requests_per_second == 12.0
    assert expected.replicas_needed == 4


def test_a_pinned_dp_pool_is_searched_per_engine_and_summed_per_replica(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtune.tuner.simulator import goodput_search

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(goodput_search, "plan_by_goodput", _fake_search(calls))
    planned = _planned(_with_rate({"gpuClass": "H200", "name": "h200", "replicas": 2,
                                   "tensorParallel": 1, "dataParallel": 8,
                                   "expertParallel": True}))
    assert calls == [("DP8+EP", 16)]  # as `kvtune plan --tp 1 --dp 8 --ep`
    s = planned.pool_plan.search
    assert s is not None and s.replicas == 2 and s.capacity_requests_per_second == 12.0
    assert s.replicas_needed == 4
    assert planned.status.layouts == []  # pinned: nothing weighed
