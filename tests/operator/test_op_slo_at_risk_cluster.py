"""SLOAtRisk on the real control plane: the operator (``kvtune operator`` subprocess) plans
an InferenceDeployment whose declared traffic (``spec.workload.requestRatePerSecond``) one
H100 cannot serve within the SLO. The condition carries the numbers (the rate one replica
sustains, the replicas the traffic needs) and an Event says it; raising the replicas to that
number, or relaxing the SLO, clears it."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from op_cluster_helpers import (
    OperatorProcess,
    condition,
    create_infd,
    ensure_namespace,
    get_infd,
    install_crd,
    patch_spec,
    wait_for,
)
from op_samples import SAMPLE_SPEC

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NS, NAME = "op-slo-at-risk", "rag"
STRICT = {"ttftP95": "1s", "tpotP95": "30ms"}
RELAXED = {"ttftP95": "10s", "tpotP95": "100ms"}
# A search takes ~10-20 s of CPU on a loaded 2-core machine; one per spec change.
TIMEOUT = 240


@pytest.fixture
def operator(local_cluster: Any, tmp_path: Path) -> Iterator[tuple[Any, OperatorProcess]]:
    api = local_cluster.api_client()
    install_crd(api)
    ensure_namespace(api, NS)
    proc = OperatorProcess(Path(local_cluster.kubeconfig_path), [NS], tmp_path / "op.log")
    proc.start()
    yield api, proc
    proc.stop()


def _at_risk(api: Any, status: str, generation_at_least: int = 1
             ) -> dict[str, Any] | None:
    obj = get_infd(api, NS, NAME)
    if (obj.get("status") or {}).get("observedGeneration", 0) < generation_at_least:
        return None
    c = condition(obj, "SLOAtRisk")
    return obj if c is not None and c["status"] == status else None


def _events(api: Any, reason: str) -> list[str]:
    return [e.message for e in client.CoreV1Api(api).list_namespaced_event(NS).items
            if e.involved_object.name == NAME and e.reason == reason]


def test_an_slo_the_traffic_cannot_get_is_at_risk_until_replicas_or_the_slo_change(
    operator: tuple[Any, OperatorProcess],
) -> None:
    api, proc = operator
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec.update({
        "pools": [{"gpuClass": "H100", "replicas": 1}],
        "workload": {"profile": "rag", "requestRatePerSecond": 12},
        "slo": STRICT,
    })
    spec["tuning"]["mode"] = "recommend"  # plans in status; nothing needs GPUs
    create_infd(api, NS, NAME, spec)

    obj = wait_for(lambda: _at_risk(api, "True"), "SLOAtRisk=True", TIMEOUT, proc.log)
    message = condition(obj, "SLOAtRisk")["message"]  # type: ignore[index]
    found = re.search(r"one replica's capacity at SLO is ([0-9.]+) req/s, so the traffic "
                      r"needs (\d+) replicas", message)
    assert found is not None, message
    sustained, needed = float(found.group(1)), int(found.group(2))
    observed = float(re.search(r"at the observed ([0-9.]+) req/s", message).group(1))  # type: ignore[union-attr]
    assert 0 < sustained < observed and needed >= 2
    assert needed * sustained >= observed * 0.99  # enough replicas for the whole rate
    (pool,) = obj["status"]["pools"]
    assert pool["sloAtRisk"] == message.removeprefix("h100: ")
    assert pool["expected"]["sloAttainment"] < 0.95
    assert wait_for(lambda: _events(api, "SLOAtRisk"), "an SLOAtRisk Event", 30, proc.log)

    # As many replicas as the condition said: each gets its share, and the SLO is met. Not
    # always in one step: the search at the new share may pick another plan, whose capacity
    # the first plan's bisection did not measure; followed, the count moves on, never back
    # (as in test_op_goodput; issue 22 item 1 makes it one step).
    replicas, generation = needed, 1
    for _ in range(3):
        generation += 1
        patch_spec(api, NS, NAME, {"pools": [{"gpuClass": "H100", "replicas": replicas}]})
        obj = wait_for(lambda g=generation: _at_risk(api, "False", g) or _at_risk(api, "True", g),
                       f"SLOAtRisk decided for {replicas} replicas", TIMEOUT, proc.log)
        now = condition(obj, "SLOAtRisk")
        assert now is not None
        if now["status"] == "False":
            break
        more = re.search(r"needs (\d+) replicas", now["message"])
        assert more is not None and int(more.group(1)) > replicas, now["message"]
        replicas = int(more.group(1))
    cleared = condition(obj, "SLOAtRisk")
    assert cleared is not None and cleared["reason"] == "SLOPredictedMet", cleared
    assert replicas <= needed + 2
    (pool,) = obj["status"]["pools"]
    assert "sloAtRisk" not in pool and pool["expected"]["sloAttainment"] >= 0.95

    # Back to one replica: at risk again; then a looser SLO one replica can meet clears it.
    patch_spec(api, NS, NAME, {"pools": [{"gpuClass": "H100", "replicas": 1}]})
    wait_for(lambda: _at_risk(api, "True", generation + 1), "SLOAtRisk=True again", TIMEOUT,
             proc.log)
    patch_spec(api, NS, NAME, {"slo": RELAXED})
    obj = wait_for(lambda: _at_risk(api, "False", generation + 2),
                   "SLOAtRisk=False with a looser SLO", TIMEOUT, proc.log)
    (pool,) = obj["status"]["pools"]
    assert pool["replicas"] == 1 and pool["expected"]["sloAttainment"] >= 0.95
