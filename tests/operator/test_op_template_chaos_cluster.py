"""Issue 11 items 4 and 5 on the real control plane: one tenant's templates that try to
exhaust the operator's CPU and memory, or ask for a privileged hostPath pod, make that
tenant's InferenceDeployments Degraded, each naming its own problem, while another tenant's
InferenceDeployment, created after them, is reconciled to Ready; then SIGTERM stops the
operator promptly. And fairness: a tenant with many slow templates renders one at a time
within its CPU budget per minute (operator/render/render_fairness.py), so another tenant's object
is Ready long before the first tenant's templates are all rendered."""

from __future__ import annotations

import copy
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from op_cluster_helpers import (
    OperatorProcess,
    condition,
    create_infd,
    get_infd,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ATTACKER, VICTIM = "op-chaos-tenant-a", "op-chaos-tenant-b"
HEAD = ("spec:\n  containers:\n    - name: vllm\n      image: {{ image | tojson }}\n"
        "      args: {{ args | tojson }}\n")
# (object name, template, what its Degraded message must say: a regex). A loop stops at its
# CPU budget, or at the wall-clock one first when the machine is busy.
TEMPLATES = [
    ("cpu-loop", "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}"
     "{% endfor %}" + HEAD, "CPU|wall clock"),
    ("cpu-loop-2", "{% for i in range(99991) %}{% for j in range(99999) %}{% endfor %}"
     "{% endfor %}" + HEAD, "CPU|wall clock"),
    ("memory", "{% set x = 'x' * 4000000000 %}" + HEAD, "MiB of memory"),
    ("hostpath", HEAD + "      securityContext: {privileged: true}\n  volumes: [{name: root, "
     "hostPath: {path: /}}]\n", r"refused by the pod policy \(baseline\)"),
]


def _spec() -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec.pop("rollout")
    return spec


def test_one_tenants_templates_starve_no_one(local_cluster: Any, tmp_path: Path) -> None:
    api = prepare_namespaces(local_cluster, ATTACKER, VICTIM)
    core = client.CoreV1Api(api)
    operator = OperatorProcess(Path(local_cluster.kubeconfig_path), [ATTACKER, VICTIM],
                               tmp_path / "operator.log")
    operator.start()
    try:
        for name, template, _ in TEMPLATES:
            core.create_namespaced_config_map(ATTACKER, {
                "metadata": {"name": name}, "data": {"pod.yaml.j2": template}})
            spec = _spec()
            spec["runtime"] = {"podTemplate": {"configMapRef": {"name": name}}}
            create_infd(api, ATTACKER, name, spec)
        create_infd(api, VICTIM, "chat", _spec())

        def ready() -> bool:
            c = condition(get_infd(api, VICTIM, "chat"), "Ready")
            return bool(c and c["status"] == "True")

        wait_for(ready, "the other tenant's object Ready meanwhile", 180, operator.log)
        for name, _, says in TEMPLATES:
            def degraded(name: str = name) -> dict[str, Any] | None:
                c = condition(get_infd(api, ATTACKER, name), "Degraded")
                # Deferred while another of the tenant's templates renders: not the end.
                settled = c and c["status"] == "True" and c["reason"] != "TemplateRenderDeferred"
                return c if settled else None

            c = wait_for(degraded, f"{ATTACKER}/{name} Degraded", 180, operator.log)
            assert c["reason"] == "InvalidPodTemplate", c
            assert re.search(says, c["message"]), c
            assert "spec.runtime.podTemplate" in c["message"], c
        # Nothing of the attacker's was applied.
        assert client.AppsV1Api(api).list_namespaced_deployment(ATTACKER).items == []
    finally:
        assert operator.proc is not None
        started = time.monotonic()
        operator.proc.send_signal(signal.SIGTERM)
        code = operator.proc.wait(timeout=60)
        stopped_in = time.monotonic() - started
        operator.proc = None
    assert stopped_in < 30, f"SIGTERM took {stopped_in:.1f}s to stop the operator"
    assert code == 0
    for name, _, _ in TEMPLATES:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            "kvtune.io", "v1alpha1", ATTACKER, "inferencedeployments", name)


def test_many_slow_templates_of_one_tenant_do_not_queue_another(
        local_cluster: Any, tmp_path: Path) -> None:
    """Tenant A: ten objects whose shared template loops to its CPU limit (about 20 s of
    renderer CPU in all, three windows of A's budget at least). Tenant B, created after them,
    is Ready while A's renders are still being deferred: B did not queue behind A. Decisions,
    not durations, are asserted: the operator's log and the objects' conditions."""
    slow_ns, other_ns, count = "op-fair-tenant-a", "op-fair-tenant-b", 10
    api = prepare_namespaces(local_cluster, slow_ns, other_ns)
    custom = client.CustomObjectsApi(api)
    operator = OperatorProcess(Path(local_cluster.kubeconfig_path), [slow_ns, other_ns],
                               tmp_path / "operator.log")
    operator.start()
    try:
        client.CoreV1Api(api).create_namespaced_config_map(slow_ns, {
            "metadata": {"name": "slow"}, "data": {"pod.yaml.j2": TEMPLATES[0][1]}})
        for i in range(count):  # one template, ten objects: ten renders (the name differs)
            spec = _spec()
            spec["runtime"] = {"podTemplate": {"configMapRef": {"name": "slow"}}}
            create_infd(api, slow_ns, f"slow-{i}", spec)
        create_infd(api, other_ns, "chat", _spec())

        def ready() -> bool:
            c = condition(get_infd(api, other_ns, "chat"), "Ready")
            return bool(c and c["status"] == "True")

        wait_for(ready, "tenant B's object Ready", 180, operator.log)
        reasons = []
        for i in range(count):
            c = condition(get_infd(api, slow_ns, f"slow-{i}"), "Degraded")
            reasons.append(c["reason"] if c and c["status"] == "True" else None)
        log = operator.log.read_text()
        # A's renders were deferred (one at a time, then its CPU budget), B's never.
        assert f"render for namespace {slow_ns} deferred" in log, reasons
        assert f"render for namespace {other_ns} deferred" not in log
        # When B was Ready, A's ten renders were not all done: B did not wait for them.
        assert reasons.count("InvalidPodTemplate") < count, reasons
        deferred = [c for i in range(count)
                    if (c := condition(get_infd(api, slow_ns, f"slow-{i}"), "Degraded"))
                    and c["reason"] == "TemplateRenderDeferred"]
        assert deferred, reasons
        assert f"namespace {slow_ns}" in deferred[0]["message"], deferred[0]
        assert "spec.runtime.podTemplate" in deferred[0]["message"], deferred[0]
        assert client.AppsV1Api(api).list_namespaced_deployment(slow_ns).items == []
    finally:
        operator.stop()
        for i in range(count):
            custom.delete_namespaced_custom_object(
                "kvtune.io", "v1alpha1", slow_ns, "inferencedeployments", f"slow-{i}")
