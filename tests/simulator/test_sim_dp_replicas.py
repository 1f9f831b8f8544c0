"""A replica under data parallel is TP x DP GPUs running DP engines (issue 26): the capacity
search replays one engine on its share of the traffic, and what it reports per replica, and
the replicas the traffic needs, count replicas, not engines; the operator's pinned
``dataParallel`` pool is searched as the CLI and ``gpusPerReplica`` search it."""

from __future__ import annotations

import copy
import math

import pytest
from op_samples import SAMPLE_SPEC

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.prices import GPUPrice
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.cost import priced
from kvtune.tuner.planner.layout_replica import per_replica
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.search import SearchSettings
from kvtune.tuner.simulator.goodput_search import plan_by_goodput

QUICK = SearchSettings(rungs=(30, 80), batched_tokens=(2048, 8192))
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RATE = 30.0  # RAG on H100: more than one engine sustains at this SLO
PRICE = GPUPrice(gpu_class="H100", usd_per_gpu_hour=2.0, source="test")


def _request(data_parallel: int) -> PlanRequest:
    profile = preset_profile("rag").model_copy(update={"request_rate_per_second": RATE})
    return PlanRequest(model=get_model(MODEL), gpu=get_gpu_class("H100"), profile=profile,
                       policy=PlanPolicy(slo=SLO(ttft_p95_seconds=1.0, tpot_p95_seconds=0.03)),
                       data_parallel=data_parallel)


def _searched(data_parallel: int, replicas: int) -> PoolPlan:
    # As the CLI and the operator call it: each DP rank of each replica takes a share.
    # The search replays one engine; the replica's figures are DP engines'.
    pool = per_replica(plan_by_goodput(_request(data_parallel), settings=QUICK,
                                       replicas=replicas * data_parallel))
    return priced(pool, PRICE)


def test_a_dp2_replica_is_two_engines_and_the_traffic_needs_replicas_not_engines() -> None:
    # 2 replicas of one engine and 1 replica of two engines: the same engine on the same share
    # of the same traffic (a dense model: DP changes no engine's weights or step), so the same
    # plan; the DP2 replica serves twice one engine's capacity on twice its GPUs.
    engines = _searched(1, 2)
    dp2 = _searched(2, 1)
    e, s = engines.search, dp2.search
    assert e is not None and s is not None
    assert dp2.plan == engines.plan
    assert s.observed_rate_per_second == pytest.approx(e.observed_rate_per_second)
    assert (e.replicas, s.replicas) == (2, 1)
    assert s.rate_per_replica_per_second == pytest.approx(2 * e.rate_per_replica_per_second)
    assert s.capacity_requests_per_second == pytest.approx(2 * e.capacity_requests_per_second)
    assert e.replicas_needed is not None and e.replicas_needed >= 2
    assert s.replicas_needed == math.ceil(e.replicas_needed / 2)
    # Exactly the replicas the observed rate needs at a replica's capacity.
    assert s.replicas_needed * s.capacity_requests_per_second >= s.observed_rate_per_second
    assert (s.replicas_needed - 1) * s.capacity_requests_per_second < (
        s.observed_rate_per_second)
    assert dp2.expected.replicas_needed == s.replicas_needed
    assert dp2.expected.capacity_requests_per_second == s.capacity_requests_per_second
    assert s.output_tokens_per_second == pytest.approx(2 * e.output_tokens_per_second)
    assert all(a.capacity_requests_per_second == pytest.approx(
        2 * b.capacity_requests_per_second) for a, b in zip(s.alternatives, e.alternatives,
                                                            strict=True))
    # A replica's GPUs are TP x DP, and a good request costs the same on either shape.
    assert e.cost is not None and s.cost is not None
    assert (e.cost.gpus_per_replica, s.cost.gpus_per_replica) == (1, 2)
    assert s.cost.cost_per_million_good_requests_usd == pytest.approx(
        e.cost.cost_per_million_good_requests_usd)
    assert s.cost.cost_per_million_output_tokens_usd == pytest.approx(
        e.cost.cost_per_million_output_tokens_usd)


@pytest.mark.slow
def test_the_operator_searches_a_pinned_data_parallel_pool_per_engine() -> None:
    """``dataParallel: 2`` pinned, 1 replica: each engine replays half the pool's traffic,
    as ``kvtune plan --dp 2`` and ``gpusPerReplica`` plan it; the status's replicas needed
    are replicas of 2 engines."""
    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.rollout import plan as rec

    body = copy.deepcopy(SAMPLE_SPEC)
    body["model"] = {"name": MODEL}
    body["pools"] = [{"gpuClass": "H100", "replicas": 1, "tensorParallel": 1,
                      "dataParallel": 2}]
    spec = InferenceDeploymentSpec.model_validate(body)
    (pool,) = spec.pools
    policy = rec.policy_for(spec).model_copy(update={
        "slo": SLO(ttft_p95_seconds=1.0, tpot_p95_seconds=0.03)})
    observed = preset_profile("rag").model_copy(update={
        "source": "prometheus", "request_rate_per_second": RATE})
    got = rec.plan_one_pool(spec, pool, rec.resolve_model(spec, "llm", None), observed,
                            policy, pool_field="spec.pools[0]", scope="pool")
    request = rec.plan_request(spec, pool, get_model(MODEL), observed, policy)
    assert request.data_parallel == 2
    # The search's default settings; restated per replica as the operator restates it.
    per_engine = per_replica(plan_by_goodput(request, replicas=2))
    assert got.search is not None and per_engine.search is not None
    assert got.plan == per_engine.plan
    assert got.search.rate_per_replica_per_second == pytest.approx(
        got.search.observed_rate_per_second)  # one replica takes all of it
    assert got.search.replicas == 1
    assert got.search.capacity_requests_per_second == pytest.approx(
        per_engine.search.capacity_requests_per_second)
    _, expected, _ = rec.plan_status(got)
    assert expected.replicas_needed == got.search.replicas_needed


def test_a_search_job_counts_engines_and_leaves_a_layout_choice_in_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``search.mode: job``: a pinned DP2 pool's document shares the rate among its engines
    (as in-process); a ``gpusPerReplica`` pool weighs several layouts, which one Job's single
    request cannot, so it is searched in the operator."""
    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.rollout import plan as rec
    from kvtune.operator.rollout import search_job_stage
    from kvtune.operator.search import search_jobs

    monkeypatch.setenv(search_jobs.ENV_MODE, "job")
    observed = preset_profile("rag").model_copy(update={
        "source": "prometheus", "request_rate_per_second": RATE})

    def document(pool: dict[str, object]) -> object:
        body = copy.deepcopy(SAMPLE_SPEC)
        body["model"] = {"name": MODEL}
        body["pools"] = [pool]
        spec = InferenceDeploymentSpec.model_validate(body)
        return search_job_stage._document(
            spec, spec.pools[0], get_model(MODEL), observed, rec.policy_for(spec), None, None,
            "pool")

    pinned = document({"gpuClass": "H100", "replicas": 3, "tensorParallel": 1,
                       "dataParallel": 2})
    assert pinned is not None
    _, doc = pinned
    assert doc.replicas == 6 and doc.request.data_parallel == 2
    assert document({"gpuClass": "H100", "replicas": 1, "gpusPerReplica": 2}) is None
