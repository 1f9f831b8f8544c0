"""Chaos on the real control plane (issue 11's chaos suite, the operator's part): kill -9 of
the operator at random moments of rollouts, an API server restart, Prometheus returning
garbage and then stopped. Each converges, with exactly one plan revision per plan change
(none spurious), and a monitoring failure never touches the runtime. Bounded: every wait
has a deadline; the random moments come from a printed seed."""

from __future__ import annotations

import copy
import json
import os
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    patch_spec,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
KILLS = 10


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster)


def _spec(max_num_seqs: int) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "name": "h100", "replicas": 1}]
    spec.pop("rollout")
    spec["tuning"] = {"mode": "auto", "pin": {"blockSize": 32, "maxNumSeqs": max_num_seqs}}
    return spec


def _settled(api: Any, ns: str, name: str, max_num_seqs: int) -> dict[str, Any] | None:
    """The object when its status describes its spec, every pool runs the plan, and the
    Deployment carries that plan."""
    obj = get_infd(api, ns, name)
    status = obj.get("status") or {}
    ready = condition(obj, "Ready")
    if status.get("observedGeneration") != obj["metadata"]["generation"] or ready is None \
            or ready["status"] != "True":
        return None
    pool = status["pools"][0]
    if pool["plan"]["maxNumSeqs"] != max_num_seqs:
        return None
    deployment = client.AppsV1Api(api).read_namespaced_deployment(pool["deployment"], ns)
    if deployment.metadata.annotations.get("kvtune.io/plan-hash") != pool["planHash"]:
        return None
    return obj


@pytest.fixture
def operator(local_cluster: Any, tmp_path: Path, request: pytest.FixtureRequest,
             ) -> Iterator[OperatorProcess]:
    ns: str = request.param
    proc = OperatorProcess(Path(local_cluster.kubeconfig_path), [ns], tmp_path / "op.log",
                           env={"KVTUNE_RETUNE_INTERVAL_SECONDS": "2"})
    proc.start()
    yield proc
    proc.stop()


@pytest.mark.parametrize("operator", ["chaos-kill"], indirect=True)
def test_kill_9_during_rollouts_converges_without_spurious_revisions(
    cluster_api: Any, operator: OperatorProcess,
) -> None:
    ns, name = "chaos-kill", "victim"
    ensure_namespace(cluster_api, ns)
    seed = int(os.environ.get("KVTUNE_CHAOS_SEED", random.randrange(2**31)))
    print(f"\nchaos seed {seed} (KVTUNE_CHAOS_SEED to replay)")
    rng = random.Random(seed)
    create_infd(cluster_api, ns, name, _spec(64))
    first = wait_for(lambda: _settled(cluster_api, ns, name, 64), "the first rollout", 120,
                     operator.log)
    revision = first["status"]["pools"][0]["revision"]
    for i in range(KILLS):
        seqs = 96 + 32 * i  # a new plan each time: exactly one new revision
        patch_spec(cluster_api, ns, name, {"tuning": {"pin": {"maxNumSeqs": seqs}}})
        moment = rng.uniform(0.0, 2.5)
        threading.Event().wait(moment)  # somewhere in the reconcile or the rollout
        operator.kill()
        operator.start()
        obj = wait_for(lambda seqs=seqs: _settled(cluster_api, ns, name, seqs),
                       f"convergence after kill #{i + 1} at {moment:.2f}s", 120, operator.log)
        pool = obj["status"]["pools"][0]
        assert pool["revision"] == revision + 1, (i, moment, pool["revision"], revision)
        revision = pool["revision"]
        deployment = client.AppsV1Api(cluster_api).read_namespaced_deployment(
            pool["deployment"], ns)
        assert deployment.metadata.labels["kvtune.io/plan-revision"] == str(revision)
    assert operator.starts == KILLS + 1


@pytest.mark.parametrize("operator", ["chaos-api"], indirect=True)
def test_an_api_server_restart_is_survived(local_cluster: Any, cluster_api: Any,
                                           operator: OperatorProcess) -> None:
    ns, name = "chaos-api", "steady"
    ensure_namespace(cluster_api, ns)
    create_infd(cluster_api, ns, name, _spec(64))
    before = wait_for(lambda: _settled(cluster_api, ns, name, 64), "Ready", 120, operator.log)
    local_cluster.restart_apiserver()
    api = local_cluster.api_client()  # a fresh connection to the restarted server
    # The operator reconnects on its own and serves the next change.
    patch_spec(api, ns, name, {"tuning": {"pin": {"maxNumSeqs": 128}}})
    after = wait_for(lambda: _settled(api, ns, name, 128), "the edit after the restart", 180,
                     operator.log)
    assert after["status"]["pools"][0]["revision"] == \
        before["status"]["pools"][0]["revision"] + 1
    assert operator.proc is not None and operator.proc.poll() is None


class _Garbage(BaseHTTPRequestHandler):
    """Answers like Prometheus, except that every histogram's buckets go backwards."""

    def do_GET(self) -> None:
        from urllib.parse import parse_qs, urlsplit

        promql = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
        samples = [({"le": le}, v) for le, v in (("100", "900"), ("1000", "10"),
                                                  ("+Inf", "5"))] \
            if "_bucket" in promql else [({}, "900")]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": m, "value": [1, v]} for m, v in samples]}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.mark.parametrize("operator", ["chaos-prom"], indirect=True)
def test_prometheus_garbage_then_stopped_keeps_the_plan_and_says_why(
    cluster_api: Any, operator: OperatorProcess,
) -> None:
    ns, name = "chaos-prom", "watched"
    ensure_namespace(cluster_api, ns)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    spec = _spec(64)
    spec["tuning"]["prometheus"] = {"url": url, "window": "1m", "poolSelector": "none"}
    try:
        create_infd(cluster_api, ns, name, spec)
        ready = wait_for(lambda: _settled(cluster_api, ns, name, 64), "Ready", 120,
                         operator.log)

        def stale(reason: str) -> dict[str, Any] | None:
            got = condition(get_infd(cluster_api, ns, name), "ProfileStale")
            return got if got and got["status"] == "True" and got["reason"] == reason else None

        garbage = wait_for(lambda: stale("PrometheusDataInvalid"), "ProfileStale on garbage",
                           90, operator.log)
        assert "go down" in garbage["message"]
    finally:
        server.shutdown()
        server.server_close()
    stopped = wait_for(lambda: stale("PrometheusUnavailable"), "ProfileStale when stopped", 120,
                       operator.log)
    assert "cannot connect" in stopped["message"]
    obj = _settled(cluster_api, ns, name, 64)
    assert obj is not None, "the runtime must stay Ready on its plan"
    assert obj["status"]["pools"][0]["revision"] == ready["status"]["pools"][0]["revision"]
