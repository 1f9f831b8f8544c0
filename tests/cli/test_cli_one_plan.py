"""One plan everywhere (issue 22 item 6): for the same inputs, ``kvtune plan``, ``kvtune
simulate``'s ``planned`` configuration and the operator give the same plan, because all three
call one function (``plan_by_goodput``) with the same request. Each search runs from an empty
cache, so agreement is not a cache hit hiding two different inputs."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner
from op_samples import SAMPLE_SPEC

from kvtune.cli.main import cli
from kvtune.e2e.traces import AZURE_TRACE
from kvtune.tuner.simulator import goodput_search

pytestmark = pytest.mark.slow
MODEL, GPU = "meta-llama/Llama-3.1-8B-Instruct", "H100"
SLO_FLAGS = ["--ttft-p95", "2", "--tpot-p95", "0.08"]


def _json(args: list[str]) -> dict[str, object]:
    goodput_search._cache.clear()
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out: dict[str, object] = json.loads(result.stdout)
    return out


def _plan_args(plan: dict[str, object]) -> list[str]:
    """``kvtune plan -o json``'s plan as the vLLM flags simulate prints (TP first)."""
    from kvtune.tuner.plan import KVPlan

    return ["--tensor-parallel-size=1", *KVPlan.model_validate(plan).vllm_args()]


def test_plan_and_simulate_give_one_plan_for_one_trace() -> None:
    common = ["-m", MODEL, "-g", GPU, "--trace", str(AZURE_TRACE), *SLO_FLAGS, "-o", "json"]
    planned = _json(["plan", *common])
    # --limit shortens the replay only, never what is planned.
    simulated = _json(["simulate", *common, "--compare", "planned", "--limit", "50"])
    (row,) = simulated["configurations"]  # type: ignore[misc]
    assert row["vllm_args"] == _plan_args(planned["plan"])  # type: ignore[index,arg-type]


def test_simulate_plans_for_the_trace_at_its_speed() -> None:
    """--speed replays the trace faster, and 'planned' is planned for that traffic and meets
    the SLO there. (Under capacity at SLO the same plan may win at both speeds: on these 50
    requests its capacity, ~44 req/s, is far above both rates, and a tie keeps the rules'
    knobs; the goodput objective chose fewer sequences at 1x.)"""
    common = ["-m", MODEL, "-g", GPU, "--trace", str(AZURE_TRACE), *SLO_FLAGS,
              "--compare", "planned", "--limit", "50", "-o", "json"]
    slow = _json(["simulate", *common])["configurations"][0]  # type: ignore[index]
    fast = _json(["simulate", *common, "--speed", "40"])["configurations"][0]  # type: ignore[index]
    assert fast["throughput_requests_per_second"] > 5 * slow["throughput_requests_per_second"]
    assert fast["slo_attainment"] >= 0.95 and slow["slo_attainment"] >= 0.95


def test_plan_and_the_operator_give_one_plan_for_one_declared_workload(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.api.workloads import declared_profile
    from kvtune.operator.rollout import plan as plan_stage
    from kvtune.operator.search import search_budget

    body = copy.deepcopy(SAMPLE_SPEC)
    body["pools"] = [{"gpuClass": GPU, "replicas": 1}]
    body["workload"] = {"profile": "rag", "requestRatePerSecond": 6}
    body["slo"] = {"ttftP95": "2s", "tpotP95": "80ms"}
    body["tuning"] = {"mode": "auto"}
    spec = InferenceDeploymentSpec.model_validate(body)
    (pool,) = spec.pools
    goodput_search._cache.clear()
    # Both searches run to the end: a search the CPU budget stops keeps what it had scored by
    # then, which moves with the machine's speed, so two stopped searches may differ.
    monkeypatch.setattr(search_budget.CONFIG, "cpu_seconds", 600.0)
    operator = plan_stage.plan_one_pool(
        spec, pool, plan_stage.resolve_model(spec, "llm", None),
        declared_profile(spec.workload), plan_stage.policy_for(spec))
    cli_plan = _json(["plan", "-m", MODEL, "-g", GPU, "--workload", "rag",
                      "--request-rate", "6", *SLO_FLAGS, "--search-cpu-seconds", "600",
                      "-o", "json"])
    assert operator.search is not None and operator.search.stopped_by is None
    assert operator.plan.model_dump(mode="json") == cli_plan["plan"]
