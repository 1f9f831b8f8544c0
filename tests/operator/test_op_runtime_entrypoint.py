"""spec.runtime.entrypoint: kvtune: the pod that runs the entrypoint as the chart's
ServiceAccount kvtune-runtime, what that account may do, and the entrypoint's reports (the
reports ConfigMap's data) read back into status."""

from __future__ import annotations

import json
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC, make_pool_plan

from kvtune.operator.api import InferenceDeploymentSpec
from kvtune.operator.api import conditions as cond
from kvtune.operator.monitoring import runtime_reports
from kvtune.operator.render import runtime_access
from kvtune.operator.render.objects import (
    ANNOTATION_PLAN_HASH,
    RenderInput,
    plan_env_json,
    render_pool,
)
from kvtune.runtime import decisions, gpus
from kvtune.runtime.runtime_plan import parse_plan
from kvtune.tuner.plan import PoolPlan

GIB = 1024**3
USER_TEMPLATE = """
metadata: {labels: {team: a}}
spec:
  containers:
    - name: vllm
      image: {{ image | tojson }}
      command: {{ command | tojson }}
      args: {{ args | tojson }}
      env: [{name: KVTUNE_PLAN, value: {{ plan_json | tojson }}}]
"""


def _render(pool_plan: PoolPlan, **kw: Any) -> dict[str, dict[str, Any]]:
    inp = RenderInput(name="support-bot", namespace="llm", pool="h200", pool_plan=pool_plan,
                      model_name="meta-llama/Llama-3.1-8B-Instruct",
                      image="ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0", replicas=2,
                      revision=1, **kw)
    return {o["kind"]: o for o in render_pool(inp)}


@pytest.mark.parametrize(("entrypoint", "template", "command"), [
    ("vllm", None, ["vllm", "serve"]),
    ("kvtune", None, ["python3", "-m", "kvtune.runtime"]),
    ("kvtune", USER_TEMPLATE, ["python3", "-m", "kvtune.runtime"]),
], ids=["vllm", "kvtune", "kvtune-user-template"])
def test_rendering_per_entrypoint(pool_plan: PoolPlan, entrypoint: str, template: str | None,
                                  command: list[str]) -> None:
    objects = _render(pool_plan, entrypoint=entrypoint, pod_template=template)
    # No ServiceAccount, Role or RoleBinding: the chart creates the runtime's, per namespace.
    assert sorted(objects) == ["Deployment", "PodDisruptionBudget", "Service"]
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == command
    assert container["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    env = {e["name"]: e for e in container["env"]}
    if entrypoint == "vllm":
        assert "serviceAccountName" not in pod
        assert set(env) == {"KVTUNE_PLAN"}
        return
    assert pod["serviceAccountName"] == "kvtune-runtime"
    assert pod["automountServiceAccountToken"] is True
    # What kvtune.runtime.report.publish reads.
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["KVTUNE_REPORT_CONFIGMAP"]["value"] == "kvtune-runtime-reports"
    assert json.loads(env["KVTUNE_PLAN"]["value"])["plan"]["block_size"] == 32


def test_the_runtime_account_may_write_one_config_map_and_nothing_else() -> None:
    sa, cm, role, binding = runtime_access.namespace_objects("llm", {"team": "a"})
    assert [o["kind"] for o in (sa, cm, role, binding)] == [
        "ServiceAccount", "ConfigMap", "Role", "RoleBinding"]
    assert (sa["metadata"]["name"], cm["metadata"]["name"]) == (
        "kvtune-runtime", "kvtune-runtime-reports")
    assert "data" not in cm  # each pod adds its own key; nobody resets them
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["kvtune-runtime-reports"],
                              "verbs": ["get", "patch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "kvtune-runtime-reporter"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kvtune-runtime",
                                    "namespace": "llm"}]


@pytest.mark.parametrize(("runtime", "valid"), [
    ({}, True), ({"entrypoint": "vllm"}, True), ({"entrypoint": "kvtune"}, True),
    ({"entrypoint": "sglang"}, False),
])
def test_spec_entrypoint(runtime: dict[str, Any], valid: bool) -> None:
    raw = {**SAMPLE_SPEC, "runtime": runtime}
    if valid:
        spec = InferenceDeploymentSpec.model_validate(raw)
        assert spec.runtime.entrypoint == runtime.get("entrypoint", "vllm")
    else:
        with pytest.raises(ValueError, match="entrypoint"):
            InferenceDeploymentSpec.model_validate(raw)


# --- reports back: produced by the entrypoint's own decision code ---------------------------

def _report_for(pool_plan: PoolPlan, free_bytes: int | None) -> dict[str, Any]:
    """What kvtune.runtime writes into the reports ConfigMap, from its own decide()."""
    plan = parse_plan(plan_env_json(pool_plan, plan_hash_="h1", revision=1))
    total = 143771 * 1024**2
    gpu = gpus.GpuInfo(index=0, name="NVIDIA H200", total_bytes=total,
                       free_bytes=total - GIB // 2 if free_bytes is None else free_bytes,
                       compute_capability=(9, 0))
    try:
        decision = decisions.decide(plan, [gpu])
    except decisions.PlanDoesNotFit as refusal:
        return {"time": "2026-11-30T03:00:00+00:00", "started": False,
                "reason": refusal.reason, "message": refusal.message}
    return {"time": "2026-11-30T03:00:00+00:00", "started": True, **decision.to_report()}


REPORTS: dict[str, str] = {}  # the reports ConfigMap's data, filled by _pod


def _pod(name: str, report: dict[str, Any] | None, plan_hash: str = "h1") -> dict[str, Any]:
    REPORTS.pop(name, None)
    if report is not None:
        REPORTS[name] = json.dumps(report)
    return {"metadata": {"name": name, "annotations": {ANNOTATION_PLAN_HASH: plan_hash}}}


@pytest.mark.parametrize(("free_gib", "finding", "utilization"), [
    (None, None, 0.93),  # the whole GPU is free: as planned
    (125, None, 0.883),  # 4.7 points lower: not material
    (110, cond.GPU_MEMORY_LOWERED, 0.776),
    (20, cond.RUNTIME_REFUSED, None),
], ids=["as-planned", "lowered-a-little", "lowered-materially", "refused"])
def test_reports_become_expected_vs_actual(
    free_gib: int | None, finding: str | None, utilization: float | None
) -> None:
    pool_plan = make_pool_plan()
    free = None if free_gib is None else free_gib * GIB
    pods = [_pod("a", _report_for(pool_plan, free)), _pod("b", None),
            _pod("old", _report_for(pool_plan, 1 * GIB), plan_hash="h0")]
    runtime = runtime_reports.summarize(pods, "h1", {**REPORTS, "gone-pod": "{}"})
    assert runtime is not None
    assert (runtime.pods, runtime.reported_pods) == (2, 1)  # the old plan's pod is left out
    found = runtime_reports.finding("h200", runtime)
    if utilization is None:
        assert runtime.refused_pods == 1 and runtime.refusal_reason == "InsufficientGpuMemory"
        assert found is not None and found[0] == cond.RUNTIME_REFUSED
        assert "pod a:" in found[1] and "Fix:" in found[1]
        return
    assert runtime.gpu_product == "NVIDIA H200"
    assert runtime.gpu_memory_utilization is not None and runtime.kv_cache_tokens is not None
    assert runtime.gpu_memory_utilization.planned == 0.93
    assert runtime.gpu_memory_utilization.actual == pytest.approx(utilization, abs=0.001)
    assert runtime.kv_cache_tokens.expected == 1_638_400
    assert (found[0] if found else None) == finding
    if finding:
        assert found is not None and "0.93 to 0.776" in found[1]
        assert "spec.tuning.pin.gpuMemoryUtilization" in found[1]


def test_condition_over_pools() -> None:
    from kvtune.operator.api import PoolStatus

    pool_plan = make_pool_plan()
    ok = runtime_reports.summarize([_pod("a", _report_for(pool_plan, None))], "h1", REPORTS)
    low = runtime_reports.summarize([_pod("a", _report_for(pool_plan, 110 * GIB))], "h1",
                                    REPORTS)
    none = runtime_reports.summarize([_pod("a", None)], "h1", REPORTS)

    def pool(name: str, runtime: Any) -> PoolStatus:
        return PoolStatus(name=name, gpu_class="H200", tensor_parallel=1, replicas=1,
                          phase="Applied", runtime=runtime)

    assert runtime_reports.runtime_condition([pool("x", none)])[:2] == (
        "Unknown", cond.AWAITING_REPORTS)
    assert runtime_reports.runtime_condition([pool("x", ok)])[:2] == ("True", cond.AS_PLANNED)
    status, reason, message = runtime_reports.runtime_condition([pool("x", ok), pool("y", low)])
    assert (status, reason) == ("False", cond.GPU_MEMORY_LOWERED)
    assert message.startswith("pool y: the runtime lowered gpu-memory-utilization")
