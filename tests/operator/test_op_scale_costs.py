"""What keeps a thousand InferenceDeployments cheap (issue 11's scale goal; the figures are
bench/scale.py's): one plan per distinct request, no prune listing while no pool can have
been removed, enough kept connections for every operator thread."""

from __future__ import annotations

from typing import Any

import pytest

from kvtune.operator import handlers
from kvtune.operator.api import InferenceDeploymentSpec, InferenceDeploymentStatus, PoolStatus
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import periodic
from kvtune.operator.reconcile import may_have_removed_pools
from kvtune.operator.rollout import plan as plan_stage

SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "workload": {"profile": "chat"},
    "pools": [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}],
}


def _plan(spec_dict: dict[str, Any]) -> Any:
    spec = InferenceDeploymentSpec.model_validate(spec_dict)
    return plan_stage.plan_one_pool(spec, spec.pools[0], plan_stage.resolve_model(spec, "ns", None),
                                    declared_profile(spec.workload), plan_stage.policy_for(spec))


def test_objects_of_one_shape_plan_once_and_any_planning_input_plans_again() -> None:
    plan_stage._plan_by_rules.cache_clear()
    first = _plan(SPEC)
    assert _plan({**SPEC, "tuning": {"mode": "recommend"}}) is first  # not a planning input
    assert plan_stage._plan_by_rules.cache_info().hits == 1
    pinned = _plan({**SPEC, "tuning": {"pin": {"maxNumSeqs": 96}}})
    assert pinned is not first and pinned.plan.max_num_seqs == 96
    other_gpu = _plan({**SPEC, "pools": [{"gpuClass": "H100"}]})
    assert other_gpu.gpu_class != first.gpu_class
    other_vllm = {**SPEC, "runtime": {"vllmVersion": "0.21.0"}}
    assert _plan(other_vllm) is not first
    assert _plan({**SPEC, "workload": {"profile": "long-context"}}) is not first
    assert _plan({**SPEC, "pools": [{"gpuClass": "H200", "tensorParallel": 2}]}) is not first
    assert plan_stage._plan_by_rules.cache_info().maxsize == plan_stage.PLAN_CACHE_SIZE


def _status(*pools: str) -> InferenceDeploymentStatus:
    return InferenceDeploymentStatus(pools=[
        PoolStatus(name=p, gpu_class="H200", tensor_parallel=1, replicas=1, phase="Applied",
                   deployment=f"x-{p}") for p in pools])


def test_prune_lists_only_when_a_pool_may_have_been_removed() -> None:
    # The first spec: every pool ever applied is in it.
    assert not may_have_removed_pools(1, _status(), {"h200"})
    assert not may_have_removed_pools(1, _status("h200"), {"h200"})
    # Status names a pool the spec lacks (e.g. one an older kvtune named otherwise).
    assert may_have_removed_pools(1, _status("h200", "old"), {"h200"})
    # The spec changed: a pool may have gone, even with status not yet written.
    assert may_have_removed_pools(2, _status(), {"h200"})
    assert may_have_removed_pools(None, _status(), {"h200"})


def test_every_operator_thread_keeps_its_connection() -> None:
    """A connection given back to a full pool is closed: the next call pays a TLS
    handshake, on both sides."""
    assert kapply.CONNECTIONS >= handlers.HANDLER_THREADS + periodic.WORKERS + 1


@pytest.mark.slow
def test_the_operator_calls_the_api_without_the_clients_typed_classes() -> None:
    """The kubernetes client's typed API classes build a pydantic model per Kubernetes kind
    on import (about 95 MB resident: more than the operator's own memory at 1,000 objects);
    the operator calls ``Kube.request``. Loading the operator imports none of them, and no
    operator module reaches for one (``kube.core``, ``client.CoreV1Api`` …; the ``Kube``
    properties stay for the tests and the CLI)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    probe = ("import sys, kvtune.cli.operator_cmd, kvtune.operator.handlers, "
             "kvtune.operator.retune.retune_handlers; "
             "print(sorted(m for m in sys.modules if m.startswith('kubernetes.client.api.')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]", loaded
    root = Path(kapply.__file__).resolve().parent
    typed = re.compile(r"\bkube\.(core|apps|batch|policy|rbac|custom)\b|client\.\w+Api\(")
    offenders = [f"{p.relative_to(root)}:{n}" for p in sorted(root.rglob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if typed.search(line) and not (p.name == "apply.py"
                                               and line.strip().startswith("return client."))]
    assert offenders == []


def test_reconciles_place_pools_from_the_node_watch_once_its_first_listing_settled() -> None:
    """The node watch keeps each GPU node classified; once its first listing has settled a
    reconcile places pools from it (no list of every node per object), before that the
    reconcile lists the nodes itself (None). Node events keep it current: a new label, an
    unschedulable node, a deleted one."""
    import threading

    import kopf

    from kvtune.operator.kube.pools import discover_pools

    def node(name: str, product: str, **spec: Any) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
                "spec": spec, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}

    memo = kopf.Memo(inventory={}, inventory_lock=threading.Lock(),
                     inventory_settled=threading.Event(), node_waits=handlers.NodeWaits())
    nodes = [node("a", "NVIDIA-H200"), node("b", "NVIDIA-H200"), node("c", "NVIDIA-H100-80GB-HBM3"),
             {"metadata": {"name": "cpu", "labels": {}}}]
    for n in nodes:
        handlers.on_node(event={"type": "ADDED", "object": n}, memo=memo)
    assert handlers.known_pools(memo) is None
    memo.inventory_settled.set()
    assert handlers.known_pools(memo) == discover_pools(nodes)
    handlers.on_node(event={"type": "MODIFIED", "object": node("b", "NVIDIA-H200",
                                                               unschedulable=True)}, memo=memo)
    handlers.on_node(event={"type": "DELETED", "object": nodes[2]}, memo=memo)
    pools = handlers.known_pools(memo)
    assert pools is not None and set(pools) == {"H200"}
    assert [n.name for n in pools["H200"].schedulable_nodes] == ["a"]
