"""Issue 11 item 9 on the real control plane: no finalizer, and leader failover.

- With the operator gone (kill -9), an InferenceDeployment and its namespace still delete:
  kvtune sets no finalizer (its timers are not kopf's, operator/kube/periodic.py), and removes the
  one older versions set.
- Two replicas under kopf peering: the active one is killed with SIGKILL (no goodbye to its
  peers) and the standby takes over, reconciling a change, in under 30 s.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    PeeringReplica,
    condition,
    create_infd,
    create_runtime_access,
    get_infd,
    patch_spec,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
PEERING_CRDS = REPO / "charts/kvtune/crds/kopf-peering.yaml"
FINALIZER = "kvtune.io/finalizer"
FAILOVER_LIMIT_SECONDS = 30


def _spec(replicas: int = 1) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H200", "replicas": replicas, "tensorParallel": 1}]
    return spec


def _applied(api: Any, ns: str, name: str, replicas: int) -> dict[str, Any] | None:
    try:
        obj = get_infd(api, ns, name)
    except ApiException:
        return None
    pools = (obj.get("status") or {}).get("pools") or []
    ok = bool(pools) and all(p.get("phase") == "Applied" and p.get("replicas") == replicas
                             for p in pools)
    return obj if ok else None


def _gone(read: Any) -> bool:
    try:
        read()
    except ApiException as exc:
        return exc.status == 404
    return False


def test_with_no_operator_running_objects_and_their_namespace_delete(
        local_cluster: Any, tmp_path: Path) -> None:
    ns, ns_doomed = "op-nofinalizer", "op-nofinalizer-ns"
    api = prepare_namespaces(local_cluster, ns, ns_doomed)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    # An object as an older kvtune left it: with kopf's finalizer.
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
        "metadata": {"name": "legacy", "namespace": ns, "finalizers": [FINALIZER]},
        "spec": _spec()})
    create_infd(api, ns, "chat", _spec())
    entrypoint = _spec()
    entrypoint["runtime"] = {"entrypoint": "kvtune"}  # the runtime-reports timer runs too
    create_runtime_access(api, ns_doomed)  # what the chart would create
    create_infd(api, ns_doomed, "chat", entrypoint)
    operator = OperatorProcess(Path(local_cluster.kubeconfig_path), [ns, ns_doomed],
                               tmp_path / "operator.log")
    operator.start()
    try:
        for n in (ns, ns_doomed):
            # Ready means the rollout timer ran: a kopf timer would have added its finalizer.
            wait_for(lambda n=n: (o := _applied(api, n, "chat", 1)) and (
                (condition(o, "Ready") or {}).get("status") == "True"),
                f"{n}/chat applied and Ready", 180, operator.log)
        wait_for(lambda: not (get_infd(api, ns, "legacy")["metadata"].get("finalizers")),
                 "the operator to remove the finalizer an older kvtune set", 60, operator.log)
        for n in (ns, ns_doomed):
            assert FINALIZER not in (get_infd(api, n, "chat")["metadata"].get("finalizers")
                                     or [])
    finally:
        # Gone without a word, as a crashed or uninstalled operator.
        assert operator.proc is not None
        operator.proc.kill()
        operator.proc.wait()
        operator.proc = None
    for name in ("chat", "legacy"):
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    for name in ("chat", "legacy"):
        wait_for(lambda name=name: _gone(lambda: get_infd(api, ns, name)),
                 f"{ns}/{name} to be deleted with no operator running", 60)
    # The garbage collector (not the operator) removes the children.
    wait_for(lambda: not client.AppsV1Api(api).list_namespaced_deployment(
        ns, label_selector="kvtune.io/deployment=chat").items,
        "the Deployments to be garbage-collected", 120)
    core.delete_namespace(ns_doomed)
    wait_for(lambda: _gone(lambda: core.read_namespace(ns_doomed)),
             f"namespace {ns_doomed} (with an InferenceDeployment) to be deleted", 240)
    core.delete_namespace(ns)


def replica(kubeconfig: Path, ns: str, peering: str, priority: int,
            log: Path) -> PeeringReplica:
    """`kvtune operator --peering` as one pod of the chart's Deployment would run it."""
    return PeeringReplica([str(Path(sys.executable).parent / "kvtune"), "operator",
                           "--kubeconfig", str(kubeconfig), "--namespace", ns, "--peering",
                           peering, "--priority", str(priority), "--metrics-port", "0"], log)


@pytest.fixture
def peering_ns(local_cluster: Any) -> Iterator[tuple[Any, str]]:
    ns = "op-failover"
    api = prepare_namespaces(local_cluster, ns)
    ext = client.ApiextensionsV1Api(api)
    for crd in yaml.safe_load_all(PEERING_CRDS.read_text()):
        with contextlib.suppress(ApiException):  # 409: the chart test installed them
            ext.create_custom_resource_definition(crd)
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in (
        ext.read_custom_resource_definition("kopfpeerings.kopf.dev").status.conditions
        or [])), "the KopfPeering CRD", 30)
    custom = client.CustomObjectsApi(api)
    with contextlib.suppress(ApiException):
        custom.create_namespaced_custom_object("kopf.dev", "v1", ns, "kopfpeerings", {
            "apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
            "metadata": {"name": "kvtune", "namespace": ns}})
    yield api, ns
    with contextlib.suppress(ApiException):
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat")


def test_standby_takes_over_within_30s_after_the_active_replica_is_killed(
        local_cluster: Any, peering_ns: tuple[Any, str], tmp_path: Path) -> None:
    api, ns = peering_ns
    kubeconfig = Path(local_cluster.kubeconfig_path)
    active = replica(kubeconfig, ns, "kvtune", 200, tmp_path / "active.log")
    standby = None
    try:
        wait_for(active.active, "the first replica to become active", 90, active.log)
        standby = replica(kubeconfig, ns, "kvtune", 100, tmp_path / "standby.log")
        wait_for(lambda: len(client.CustomObjectsApi(api).get_namespaced_custom_object(
            "kopf.dev", "v1", ns, "kopfpeerings", "kvtune").get("status") or {}) == 2,
            "both replicas in the KopfPeering", 90, standby.log)
        create_infd(api, ns, "chat", _spec(1))
        wait_for(lambda: _applied(api, ns, "chat", 1), "the active replica to apply chat", 120,
                 active.log)
        assert not standby.active() and "reconciled:" not in standby.text()

        active.proc.kill()  # SIGKILL: no peering goodbye, the standby waits out the lifetime
        killed_at = time.monotonic()
        active.proc.wait()
        patch_spec(api, ns, "chat", {"pools": _spec(2)["pools"]})
        wait_for(lambda: _applied(api, ns, "chat", 2), "the standby to reconcile a change",
                 FAILOVER_LIMIT_SECONDS + 30, standby.log)
        took = time.monotonic() - killed_at
        assert standby.active()
        assert took < FAILOVER_LIMIT_SECONDS, (
            f"the standby took {took:.1f}s to take over:\n{standby.text()[-3000:]}")
        # kvtune's own timers run on the new leader too: the rollout is followed to Ready.
        wait_for(lambda: (condition(get_infd(api, ns, "chat"), "Ready") or {}).get("status")
                 == "True", "the new leader's rollout timer to set Ready", 60, standby.log)
        assert FINALIZER not in (get_infd(api, ns, "chat")["metadata"].get("finalizers") or [])
    finally:
        active.stop()
        if standby is not None:
            standby.stop()
