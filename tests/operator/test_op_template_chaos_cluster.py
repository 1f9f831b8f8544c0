"""Issue 11 items 4 and 5 on the real control plane: one tenant's templates that try to
exhaust the operator's CPU and memory, or ask for a privileged hostPath pod, make that
tenant's InferenceDeployments Degraded, each naming its own problem, while another tenant's
InferenceDeployment, created after them, is reconciled to Ready; then SIGTERM stops the
operator promptly."""

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
    ensure_namespace,
    get_infd,
    install_crd,
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
    api = local_cluster.api_client()
    install_crd(api)
    for ns in (ATTACKER, VICTIM):
        ensure_namespace(api, ns)
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
                return c if c and c["status"] == "True" else None

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
