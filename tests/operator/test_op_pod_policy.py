"""Issue 11 items 4 and 5: a tenant's pod template cannot starve the operator, nor ask for a
pod the chart's pod policy refuses; either way, the error names what was refused."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from kvtune.operator.render import pod_policy, template_sandbox, tenant_reach
from kvtune.operator.render.objects import RenderError, RenderInput, render_pool
from kvtune.tuner.plan import PoolPlan

BASE = """
metadata: {labels: {team: a}}
spec:
  containers:
    - name: vllm
      image: {{ image | tojson }}
      command: {{ command | tojson }}
      args: {{ args | tojson }}
      resources: {limits: {{ {"nvidia.com/gpu": gpus | string} | tojson }}}
      volumeMounts: [{name: dshm, mountPath: /dev/shm}]
  volumes: [{name: dshm, emptyDir: {medium: Memory}}]
"""
RESTRICTED_OK = BASE.replace(
    "spec:\n", "spec:\n  securityContext: {runAsNonRoot: true, runAsUser: 1000, "
    "seccompProfile: {type: RuntimeDefault}}\n", 1).replace(
    "      volumeMounts:", "      securityContext: {allowPrivilegeEscalation: false, "
    "capabilities: {drop: [ALL]}}\n      volumeMounts:", 1)


def _input(pool_plan: PoolPlan, template: str | None) -> RenderInput:
    return RenderInput(name="chat", namespace="llm", pool="h200", pool_plan=pool_plan,
                       model_name="meta-llama/Llama-3.1-8B-Instruct",
                       image="vllm/vllm-openai:v0.33.0", replicas=1, revision=1,
                       pod_template=template)


def _with(spec_line: str = "", container_line: str = "", template: str = BASE) -> str:
    out = template
    if spec_line:
        out = out.replace("spec:\n", f"spec:\n  {spec_line}\n", 1)
    if container_line:
        out = out.replace("      volumeMounts:", f"      {container_line}\n      volumeMounts:",
                          1)
    return out


# (case id, template, the refused field named in the message)
REFUSED = [
    ("hostPath", BASE.replace("emptyDir: {medium: Memory}", "hostPath: {path: /}"),
     "spec.volumes[0].hostPath"),
    ("privileged", _with(container_line="securityContext: {privileged: true}"),
     "spec.containers[0].securityContext.privileged"),
    ("hostNetwork", _with("hostNetwork: true"), "spec.hostNetwork"),
    ("hostPID", _with("hostPID: true"), "spec.hostPID"),
    ("hostIPC", _with("hostIPC: true"), "spec.hostIPC"),
    ("nodeName", _with("nodeName: control-plane-0"), "spec.nodeName"),
    ("service-account", _with("serviceAccountName: kube-proxy"), "spec.serviceAccountName"),
    ("tolerate-all", _with("tolerations: [{operator: Exists}]"), "spec.tolerations[0]"),
    ("system-priority", _with("priorityClassName: system-node-critical"),
     "spec.priorityClassName"),
    ("hostPort", _with(container_line="ports: [{containerPort: 8000, hostPort: 80}]"),
     "spec.containers[0].ports[0].hostPort"),
    ("cap-sys-admin", _with(container_line="securityContext: {capabilities: {add: [SYS_ADMIN]}}"),
     "spec.containers[0].securityContext.capabilities.add"),
    ("seccomp-unconfined", _with("securityContext: {seccompProfile: {type: Unconfined}}"),
     "spec.securityContext.seccompProfile.type"),
    ("unsafe-sysctl", _with("securityContext: {sysctls: [{name: kernel.msgmax, value: '1'}]}"),
     "spec.securityContext.sysctls[0].name"),
    ("privileged-init", BASE.replace("  containers:\n", "  initContainers: [{name: i, image: x, "
                                     "securityContext: {privileged: true}}]\n  containers:\n",
                                     1), "spec.initContainers[0].securityContext.privileged"),
    # Issue 25: what the operator's token may no longer ask for (the admission policy refuses
    # the same at the API server).
    ("secret-volume", BASE.replace("emptyDir: {medium: Memory}", "secret: {secretName: db}"),
     "spec.volumes[0].secret"),
    ("projected-secret", BASE.replace("emptyDir: {medium: Memory}",
                                      "projected: {sources: [{secret: {name: db}}]}"),
     "spec.volumes[0].projected.sources[0].secret"),
    ("nfs-volume", BASE.replace("emptyDir: {medium: Memory}", "nfs: {server: n, path: /}"),
     "spec.volumes[0].nfs"),
    ("secret-env", _with(container_line="env: [{name: T, valueFrom: {secretKeyRef: "
                                        "{name: db, key: password}}}]"),
     "spec.containers[0].env[0].valueFrom.secretKeyRef"),
    ("secret-envFrom", _with(container_line="envFrom: [{secretRef: {name: db}}]"),
     "spec.containers[0].envFrom[0].secretRef"),
    ("image-pull-secret", _with("imagePullSecrets: [{name: regcred}]"),
     "spec.imagePullSecrets[0]"),
    ("run-as-root", _with(container_line="securityContext: {runAsUser: 0}"),
     "spec.containers[0].securityContext.runAsUser"),
    ("privilege-escalation",
     _with(container_line="securityContext: {allowPrivilegeEscalation: true}"),
     "spec.containers[0].securityContext.allowPrivilegeEscalation"),
    ("init-hostPort", BASE.replace("  containers:\n", "  initContainers: [{name: i, image: x, "
                                   "ports: [{containerPort: 1, hostPort: 22}]}]\n"
                                   "  containers:\n", 1),
     "spec.initContainers[0].ports[0].hostPort"),
]


@pytest.mark.parametrize(("template", "field"), [(t, f) for _, t, f in REFUSED],
                         ids=[i for i, _, _ in REFUSED])
def test_baseline_refuses_and_names_the_field(pool_plan: PoolPlan, template: str,
                                              field: str) -> None:
    with pytest.raises(RenderError) as err:
        render_pool(_input(pool_plan, template))
    message = str(err.value)
    assert message.startswith("spec.runtime.podTemplate (ConfigMap template): ")
    assert f"{field}=" in message and "refused by the pod policy (baseline)" in message
    assert "Fix:" in message and "\n" not in message


def test_baseline_accepts_a_gpu_pod_and_kvtunes_own_template(pool_plan: PoolPlan) -> None:
    for template in (BASE, None):
        objects = render_pool(_input(pool_plan, template))
        assert [o["kind"] for o in objects] == ["Deployment", "Service", "PodDisruptionBudget"]


def test_a_secret_the_chart_allows_may_be_referenced(pool_plan: PoolPlan,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """podPolicy.allowedSecrets (--allowed-secret) names the Secrets a template may use; the
    refusal of any other names the allowed ones."""
    template = _with(container_line="env: [{name: HF_TOKEN, valueFrom: {secretKeyRef: "
                                    "{name: hf-token, key: token}}}]")
    with pytest.raises(RenderError, match=r"secretKeyRef=.*\(allowed: none\)"):
        render_pool(_input(pool_plan, template))
    monkeypatch.setattr(pod_policy.CONFIG, "secrets", ("hf-token",))
    # The spec must also name it, and the API server have checked its writer may read it
    # (operator/render/tenant_reach.py, issue 25): both tested in test_op_tenant_reach.py.
    monkeypatch.setattr(tenant_reach.CONFIG, "secrets_checked_at_admission", True)
    render_pool(dataclasses.replace(_input(pool_plan, template), secrets=("hf-token",)))
    with pytest.raises(RenderError, match=r"envFrom\[0\]\.secretRef=.*allowed: hf-token"):
        render_pool(_input(pool_plan, _with(container_line="envFrom: [{secretRef: {name: db}}]")))


def test_restricted(pool_plan: PoolPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_policy.CONFIG, "level", "restricted")
    with pytest.raises(RenderError, match=r"allowPrivilegeEscalation=None is refused by the "
                       r"pod policy \(restricted\)"):
        render_pool(_input(pool_plan, BASE))
    render_pool(_input(pool_plan, RESTRICTED_OK))
    # kvtune's own template meets "restricted" when the chart chooses it.
    (dep, *_) = render_pool(_input(pool_plan, None))
    pod = dep["spec"]["template"]
    assert pod_policy.violations(pod, "restricted") == []
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    monkeypatch.setattr(pod_policy.CONFIG, "level", "baseline")
    (dep, *_) = render_pool(_input(pool_plan, None))
    assert "securityContext" not in dep["spec"]["template"]["spec"]


def test_every_violation_is_listed(pool_plan: PoolPlan) -> None:
    template = _with("hostNetwork: true\n  nodeName: n1")
    pod = {"spec": {"hostNetwork": True, "nodeName": "n1", "containers": []}}
    assert len(pod_policy.violations(pod, "baseline")) == 2
    with pytest.raises(RenderError, match=r"spec.nodeName='n1'.*\(and 1 more\)"):
        render_pool(_input(pool_plan, template))


# --- templates that try to exhaust the operator ----------------------------------------------

EXHAUSTING = [
    # CPU: a loop of 10^10 iterations, in 88 bytes.
    ("cpu-loop", "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}"
     "{% endfor %}", "CPU"),
    # Memory: a 4 GB string from 20 bytes.
    ("memory", "{{ 'x' * 4000000000 }}", "MiB of memory"),
    # Output: 100 MB of text, each chunk small.
    ("output", "{% for i in range(99999) %}{{ 'y' * 1000 }}{% endfor %}", "exceeds"),
    # YAML anchors: 9^8 list items from 330 bytes of text (a "billion laughs").
    ("yaml-anchors", "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh",
                                                                   strict=True)),
     "exceeds|CPU|MiB of memory"),  # whichever limit the expansion meets first
]


@pytest.mark.slow
@pytest.mark.parametrize(("template", "limit"), [(t, w) for _, t, w in EXHAUSTING],
                         ids=[i for i, _, _ in EXHAUSTING])
def test_exhausting_templates_fail_within_their_limits(
        pool_plan: PoolPlan, template: str, limit: str) -> None:
    started = time.monotonic()
    with pytest.raises(RenderError) as err:
        render_pool(_input(pool_plan, template))
    assert re.search(limit, str(err.value)), err.value
    assert time.monotonic() - started < template_sandbox.WALL_SECONDS + 5
    # Remembered: the same template with the same plan is refused at once next time.
    started = time.monotonic()
    with pytest.raises(RenderError):
        render_pool(_input(pool_plan, template))
    assert time.monotonic() - started < 1.0


@pytest.mark.slow
def test_a_looping_template_holds_no_lock_other_renders_need(pool_plan: PoolPlan) -> None:
    """While one tenant's template burns its CPU budget in its child process, another
    tenant's object renders in this process (no GIL held by the loop)."""
    looping = EXHAUSTING[0][1].replace("99999", "99998")  # not in the cache
    errors: list[Exception] = []

    def render_looping() -> None:
        try:
            render_pool(_input(pool_plan, looping))
        except RenderError as exc:
            errors.append(exc)

    thread = threading.Thread(target=render_looping)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    render_pool(_input(pool_plan, None))  # kvtune's template, in-process
    in_process = time.monotonic() - started
    still_looping = thread.is_alive()
    thread.join(timeout=template_sandbox.WALL_SECONDS + 5)
    assert errors and "CPU" in str(errors[0])
    assert in_process < 2.0 and still_looping, in_process


@pytest.mark.slow
def test_sigterm_stops_a_process_whose_template_loops(tmp_path: Any) -> None:
    """The operator's SIGTERM handling is never starved by a template: the render waits on a
    pipe, so the main thread runs its signal handler at once."""
    script = (
        "import signal, sys, threading\n"
        "from kvtune.operator.render import template_sandbox as ts\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
        "t = threading.Thread(target=lambda: ts.render_yaml("
        "'{% for i in range(99997) %}{% for j in range(99999) %}{% endfor %}{% endfor %}', {},"
        " tenant='llm'),"
        " daemon=True)\n"
        "t.start()\n"
        "print('rendering', flush=True)\n"
        "t.join()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None and proc.stdout.readline() == b"rendering\n"
    time.sleep(0.5)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 7
    assert time.monotonic() - started < 5


def test_sandbox_results_are_copies(pool_plan: PoolPlan) -> None:
    context = {"image": "i", "command": ["c"], "args": ["a"], "gpus": 1}
    first = template_sandbox.render_yaml(BASE, copy.deepcopy(context), tenant="llm")
    first["spec"]["containers"].clear()
    again = template_sandbox.render_yaml(BASE, copy.deepcopy(context), tenant="llm")
    assert again["spec"]["containers"][0]["name"] == "vllm"
