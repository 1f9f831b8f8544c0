"""The pod policy on a LeaderWorkerSet's two pod templates (issue 26, multi-node): a tenant's
``spec.runtime.podTemplate`` rendered into an LWS is refused as it is in a Deployment, and the
templates the operator would apply (the leader's, and the worker's, a changed copy) are
checked as they are, the leader's path read from the workerTemplate when LWS has none."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
from test_op_leader_worker_set import TWO_NODES, planned, spec_for
from test_op_pod_policy import BASE, REFUSED

from kvtune.operator.render import leader_worker_set as lws
from kvtune.operator.render import pod_policy, workload_pods
from kvtune.operator.render.objects import ReachError, RenderError, RenderInput, render_pool
from kvtune.tuner.plan import PoolPlan

LEADER = "spec.leaderWorkerTemplate.leaderTemplate"
WORKER = "spec.leaderWorkerTemplate.workerTemplate"


@functools.cache
def _two_node_plan() -> PoolPlan:
    return planned(spec_for(TWO_NODES))


def _render(template: str | None) -> list[dict[str, Any]]:
    return render_pool(RenderInput(
        name="dsv3", namespace="llm", pool="h100", pool_plan=_two_node_plan(),
        model_name="deepseek-ai/DeepSeek-V3", image="vllm/vllm-openai:v0.33.0", replicas=2,
        revision=1, nodes_per_replica=2, pod_template=template))


def _group() -> dict[str, Any]:
    objects = _render(BASE)
    assert [o["kind"] for o in objects] == [lws.KIND, "Service", "PodDisruptionBudget"]
    return copy.deepcopy(objects[0])


@pytest.mark.parametrize(("template", "field"), [(t, f) for _, t, f in REFUSED],
                         ids=[i for i, _, _ in REFUSED])
def test_a_tenant_template_rendered_into_a_leader_worker_set_is_refused(
        template: str, field: str) -> None:
    with pytest.raises(RenderError) as err:
        _render(template)
    message = str(err.value)
    assert message.startswith("spec.runtime.podTemplate (ConfigMap template): ")
    assert f"{field}=" in message and "refused by the pod policy (baseline)" in message
    assert "\n" not in message


def test_the_good_template_and_kvtunes_own_render_a_leader_worker_set() -> None:
    for template in (BASE, None):
        group = _render(template)[0]
        assert group["kind"] == lws.KIND
        assert [w for w, _ in workload_pods.pod_templates(group)] == [LEADER, WORKER]
        workload_pods.check(group)


@pytest.mark.parametrize("key", ["leaderTemplate", "workerTemplate"])
@pytest.mark.parametrize(("change", "field"), [
    (lambda s: s.update(nodeName="control-plane-0"), "spec.nodeName"),
    (lambda s: s["volumes"].append({"name": "db", "secret": {"secretName": "db"}}),
     "spec.volumes[1].secret"),
    (lambda s: s["containers"][0].setdefault("envFrom", []).append(
        {"secretRef": {"name": "db"}}), "spec.containers[0].envFrom[0].secretRef"),
    (lambda s: s.update(tolerations=[{"operator": "Exists"}]), "spec.tolerations[0]"),
    (lambda s: s.update(priorityClassName="system-node-critical"), "spec.priorityClassName"),
    (lambda s: s.update(serviceAccount="kube-proxy"), "spec.serviceAccount"),
    (lambda s: s["containers"][0].update(securityContext={"runAsUser": 0}),
     "spec.containers[0].securityContext.runAsUser"),
    (lambda s: s["containers"][0].update(securityContext={"allowPrivilegeEscalation": True}),
     "spec.containers[0].securityContext.allowPrivilegeEscalation"),
], ids=["nodeName", "secret-volume", "secret-envFrom", "tolerate-all", "system-priority",
        "service-account-alias", "root", "privilege-escalation"])
def test_each_template_of_a_leader_worker_set_is_checked(key: str, change: Any,
                                                        field: str) -> None:
    group = _group()
    change(group["spec"]["leaderWorkerTemplate"][key]["spec"])
    with pytest.raises(pod_policy.PolicyViolation) as err:
        workload_pods.check(group)
    assert str(err.value).startswith(
        f"LeaderWorkerSet dsv3-h100 spec.leaderWorkerTemplate.{key}: {field}=")


def test_without_a_leader_template_the_worker_template_is_the_leaders() -> None:
    group = _group()
    del group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    assert [w for w, _ in workload_pods.pod_templates(group)] == [WORKER]
    workload_pods.check(group)
    group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["nodeName"] = "n1"
    with pytest.raises(pod_policy.PolicyViolation, match=f"{WORKER}: spec.nodeName='n1'"):
        workload_pods.check(group)


def test_restricted_holds_on_both_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's podPolicy.level: restricted, on the worker's changed copy as well."""
    group = _group()
    monkeypatch.setattr(pod_policy.CONFIG, "level", "restricted")
    with pytest.raises(pod_policy.PolicyViolation, match=f"{LEADER}: .*restricted"):
        workload_pods.check(group)
    del group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    with pytest.raises(pod_policy.PolicyViolation, match=f"{WORKER}: .*restricted"):
        workload_pods.check(group)


def test_the_workers_changed_copy_is_checked_as_applied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The renderer checks the pod before it makes the worker's copy; what the copy adds is
    checked too, before anything is applied (pod policy, then the tenant's reach)."""
    made = lws.worker_container

    def with_secret(container: dict[str, Any], local: lws.NodeLaunch) -> dict[str, Any]:
        worker = made(container, local)
        worker.setdefault("env", []).append(
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "db", "key": "t"}}})
        return worker

    monkeypatch.setattr(lws, "worker_container", with_secret)
    with pytest.raises(RenderError, match=f"LeaderWorkerSet dsv3-h100 {WORKER}: "
                       r"spec.containers\[0\].env\[\d+\].valueFrom.secretKeyRef='db'"):
        _render(BASE)

    def foreign_image(container: dict[str, Any], local: lws.NodeLaunch) -> dict[str, Any]:
        return {**made(container, local), "image": "evil/image:latest"}

    monkeypatch.setattr(lws, "worker_container", foreign_image)
    with pytest.raises(ReachError, match=f"{WORKER}: spec.containers\\[0\\].image="
                       "'evil/image:latest' is not an allowed image"):
        _render(BASE)


def test_kinds_without_pods_have_no_templates() -> None:
    service = _render(BASE)[1]
    assert workload_pods.pod_templates(service) == []
    workload_pods.check(service)
