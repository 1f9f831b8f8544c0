"""Rendering one pool: the Deployment carries the plan, the pods land on the class's nodes,
a plan hash that changes only with the plan, and user templates that fail cleanly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from op_samples import make_pool_plan

from kvtune.operator.render.objects import (
    ANNOTATION_PLAN_HASH,
    LABEL_PLAN_REVISION,
    RenderError,
    RenderInput,
    object_name,
    plan_hash,
    render_pool,
)
from kvtune.tuner.plan import PoolPlan

AFFINITY = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                           "values": ["NVIDIA-H200"]}]}]}}


def _input(pool_plan: PoolPlan, **kw: Any) -> RenderInput:
    base: dict[str, Any] = dict(
        name="support-bot", namespace="llm", pool="h200", pool_plan=pool_plan,
        model_name="meta-llama/Llama-3.1-8B-Instruct", image="vllm/vllm-openai:v0.33.0",
        replicas=2, revision=3, affinity=AFFINITY,
    )
    base.update(kw)
    return RenderInput(**base)


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(("knobs", "tp", "expected_flags", "absent"), [
    ({}, 1, ["--block-size=32", "--kv-cache-dtype=fp8", "--gpu-memory-utilization=0.93",
             "--max-model-len=32768", "--max-num-seqs=192", "--max-num-batched-tokens=8192",
             "--enable-prefix-caching", "--tensor-parallel-size=1"],
     ["--kv-cache-memory-bytes", "--kv-offloading-size"]),
    ({"kv_cache_memory_bytes": 64 * 2**30, "enable_prefix_caching": False}, 2,
     ["--kv-cache-memory-bytes=68719476736", "--no-enable-prefix-caching",
      "--tensor-parallel-size=2"], ["--gpu-memory-utilization"]),
    ({"kv_offloading_size_gib": 64.0, "kv_offloading_backend": "native",
      "attention_backend": "FLASHINFER", "kv_cache_dtype": "auto", "block_size": 16}, 4,
     ["--kv-offloading-size=64", "--kv-offloading-backend=native",
      "--attention-backend=FLASHINFER", "--kv-cache-dtype=auto", "--block-size=16"], []),
])
def test_deployment_carries_the_plan(
    knobs: dict[str, Any], tp: int, expected_flags: list[str], absent: list[str]
) -> None:
    pool_plan = make_pool_plan(**knobs).model_copy(update={"tensor_parallel": tp})
    objects = _by_kind(render_pool(_input(pool_plan)))
    assert sorted(objects) == ["Deployment", "PodDisruptionBudget", "Service"]
    dep = objects["Deployment"]
    container = _container(dep)
    args = container["args"]
    assert container["command"] == ["vllm", "serve"]
    assert args[0] == "meta-llama/Llama-3.1-8B-Instruct"
    for flag in expected_flags:
        assert flag in args
    for prefix in absent:
        assert not any(a.startswith(prefix) for a in args)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(tp)
    assert container["resources"]["requests"]["nvidia.com/gpu"] == str(tp)
    plan_env = next(e for e in container["env"] if e["name"] == "KVTUNE_PLAN")
    plan = json.loads(plan_env["value"])
    assert plan["plan"]["block_size"] == pool_plan.plan.block_size
    assert plan["tensor_parallel"] == tp and plan["gpu_class"] == "H200"
    assert "reasons" not in plan and plan["revision"] == 3


# (TP, CPU KV offload GiB) -> memory request = limit, CPU request, /dev/shm sizeLimit; the
# figures of tuner/facts/data/vllm_host.json worked out by hand (host_resources' docstring):
# processes x 1,228.8 MiB + 512 + 512 MiB + TP x 1,024 MiB, rounded up to a MiB, + /dev/shm.
@pytest.mark.parametrize(("tp", "offload_gib", "memory", "cpu", "shm"), [
    # 2 x 1,228.8 + 1,024 + 1,024 = 4,505.6 -> 4,506 MiB; /dev/shm 256 MiB.
    (1, None, "4762Mi", "2000m", "256Mi"),
    # The CPU tier is a /dev/shm file: 100 GiB + 256 MiB, all of it in the memory request.
    (1, 100.0, f"{4506 + 102400 + 256}Mi", "2000m", f"{102400 + 256}Mi"),
    # 4 processes: 4,915.2 + 1,024 + 2,048 = 7,988 MiB; /dev/shm 160 + 2 x 240 + 24 + 1,024.
    (2, None, f"{7988 + 1688}Mi", "4000m", "1688Mi"),
    (2, 64.0, f"{7988 + 65536 + 1688}Mi", "4000m", f"{65536 + 1688}Mi"),
    # 10 processes: 12,288 + 1,024 + 8,192 = 21,504 MiB; /dev/shm 160 + 8 x 240 + 24 + 1,024.
    (8, None, f"{21504 + 3128}Mi", "10000m", "3128Mi"),
])
def test_resources_and_shm_are_sized_from_the_plan(
    tp: int, offload_gib: float | None, memory: str, cpu: str, shm: str
) -> None:
    pool_plan = make_pool_plan().model_copy(update={"tensor_parallel": tp})
    pool_plan = pool_plan.model_copy(update={"plan": pool_plan.plan.with_offload(offload_gib)})
    dep = _by_kind(render_pool(_input(pool_plan)))["Deployment"]
    container = _container(dep)
    gpus = str(tp)
    # Memory limit = request; no CPU limit (docs/pod-resources.md).
    assert container["resources"] == {
        "requests": {"nvidia.com/gpu": gpus, "cpu": cpu, "memory": memory},
        "limits": {"nvidia.com/gpu": gpus, "memory": memory}}
    pod = dep["spec"]["template"]["spec"]
    (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert dshm == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert any(a.startswith("--kv-offloading-size=") for a in container["args"]) \
        == (offload_gib is not None)


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_both_pod_policy_levels_accept_the_sized_pod(
    level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # render_pool checks the pod against the chart's level and raises RenderError otherwise.
    from kvtune.operator.render import pod_policy
    monkeypatch.setattr(pod_policy.CONFIG, "level", level)
    pool_plan = make_pool_plan().model_copy(update={"tensor_parallel": 4})
    pool_plan = pool_plan.model_copy(update={"plan": pool_plan.plan.with_offload(32.0)})
    dep = _by_kind(render_pool(_input(pool_plan)))["Deployment"]
    assert pod_policy.violations(dep["spec"]["template"], level) == []  # type: ignore[arg-type]
    assert dep["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] \
        == f"{32768 + 160 + 4 * 240 + 24 + 1024}Mi"


def test_pod_shape_scheduling_probes_and_scraping(pool_plan: PoolPlan) -> None:
    objects = _by_kind(render_pool(_input(
        pool_plan, node_selector={"pool": "a"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "llm",
                      "effect": "NoSchedule"}])))
    dep, svc, pdb = objects["Deployment"], objects["Service"], objects["PodDisruptionBudget"]
    assert dep["metadata"]["name"] == svc["metadata"]["name"] == "support-bot-h200"
    assert dep["metadata"]["namespace"] == "llm" and dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector == {"kvtune.io/deployment": "support-bot", "kvtune.io/pool": "h200"}
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["selector"] == selector == pdb["spec"]["selector"]["matchLabels"]
    assert pod["metadata"]["labels"][LABEL_PLAN_REVISION] == "3"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    assert svc["metadata"]["labels"]["kvtune.io/metrics"] == "true"
    spec = pod["spec"]
    assert spec["affinity"] == {"nodeAffinity": AFFINITY}
    assert spec["nodeSelector"] == {"pool": "a"}
    assert {"key": "dedicated", "operator": "Equal", "value": "llm",
            "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["terminationGracePeriodSeconds"] >= 60
    container = spec["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert "--port=8000" in container["args"]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_node_affinity_is_a_valid_pod_affinity(pool_plan: PoolPlan) -> None:
    spec = _by_kind(render_pool(_input(pool_plan)))["Deployment"]["spec"]["template"]["spec"]
    # Pod.spec.affinity has nodeAffinity/podAffinity/podAntiAffinity at its top.
    assert set(spec["affinity"]) <= {"nodeAffinity", "podAffinity", "podAntiAffinity"}


def test_plan_hash_changes_with_the_plan_only(pool_plan: PoolPlan) -> None:
    same = make_pool_plan()
    reworded = same.model_copy(update={"reasons": ()})
    assert plan_hash(pool_plan, "img:1") == plan_hash(same, "img:1") == plan_hash(reworded,
                                                                                 "img:1")
    assert plan_hash(pool_plan, "img:1") != plan_hash(make_pool_plan(max_num_seqs=128), "img:1")
    assert plan_hash(pool_plan, "img:1") != plan_hash(pool_plan, "img:2")
    a = _by_kind(render_pool(_input(pool_plan)))["Deployment"]
    b = _by_kind(render_pool(_input(same)))["Deployment"]
    assert a == b  # rendering is deterministic: re-applying it is a no-op
    assert a["spec"]["template"]["metadata"]["annotations"][ANNOTATION_PLAN_HASH] == plan_hash(
        pool_plan, "vllm/vllm-openai:v0.33.0")


def test_long_names_are_cut_to_a_dns_label() -> None:
    name = object_name("a" * 60, "h200")
    assert len(name) == 63 and name.startswith("a" * 54)
    assert object_name("a" * 60, "h200") != object_name("a" * 60, "h100")


GOOD_TEMPLATE = """
metadata:
  labels: {team: search}
spec:
  serviceAccountName: vllm
  containers:
    - name: vllm
      image: {{ image | tojson }}
      command: {{ command | tojson }}
      args: {{ args | tojson }}
      env: [{name: KVTUNE_PLAN, value: {{ plan_json | tojson }}}]
      resources: {limits: {{ {"nvidia.com/gpu": gpus | string} | tojson }}}
"""


def test_user_pod_template_keeps_selector_labels_and_hash(
        pool_plan: PoolPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtune.operator.render import pod_policy

    # The chart's podPolicy.allowedServiceAccounts lets this namespace's "vllm" account in.
    monkeypatch.setattr(pod_policy.CONFIG, "service_accounts", ("vllm",))
    dep = _by_kind(render_pool(_input(pool_plan, pod_template=GOOD_TEMPLATE)))["Deployment"]
    pod = dep["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "vllm"
    assert pod["metadata"]["labels"]["team"] == "search"
    assert pod["metadata"]["labels"]["kvtune.io/pool"] == "h200"
    assert ANNOTATION_PLAN_HASH in pod["metadata"]["annotations"]
    assert "--block-size=32" in pod["spec"]["containers"][0]["args"]


@pytest.mark.parametrize(("template", "needle"), [
    ("spec: {containers: [{name: vllm, image: {{ imag }}}]}", "template error"),  # StrictUndefined
    ("spec: {containers: [{name: x, image: y}]\n  bad: [", "not valid YAML"),
    ("- just\n- a list", "must render a mapping"),
    ("metadata: {}", "no 'spec'"),
    ("spec: {containers: []}", "non-empty list"),
    ("spec: {containers: [{name: vllm}]}", "'name' and an 'image'"),
    ("kind: Pod\nspec: {containers: [{name: a, image: b}]}", "unexpected top-level keys"),
    # The sandbox refuses Python internals.
    ("spec: {containers: [{name: a, image: {{ ''.__class__.__mro__ }}}]}", "template error"),
])
def test_bad_user_templates_raise_render_error(
    pool_plan: PoolPlan, template: str, needle: str
) -> None:
    with pytest.raises(RenderError, match=r"spec\.runtime\.podTemplate") as info:
        render_pool(_input(pool_plan, pod_template=template))
    assert needle in str(info.value)


RUNTIME_TEMPLATE = Path(__file__).resolve().parents[2] / "runtime_images" / "pod-template.yaml.j2"


def test_plan_env_is_what_the_runtime_entrypoint_reads(pool_plan: PoolPlan) -> None:
    from kvtune.runtime.runtime_plan import parse_plan

    dep = _by_kind(render_pool(_input(pool_plan)))["Deployment"]
    env = {e["name"]: e["value"] for e in _container(dep)["env"]}
    runtime_plan = parse_plan(env["KVTUNE_PLAN"])
    assert runtime_plan.gpu_class == "H200" and runtime_plan.tensor_parallel == 1
    assert runtime_plan.plan.vllm_args() == pool_plan.plan.vllm_args()


def test_the_runtime_images_pod_template_renders(pool_plan: PoolPlan) -> None:
    dep = _by_kind(render_pool(_input(
        pool_plan, pod_template=RUNTIME_TEMPLATE.read_text())))["Deployment"]
    container = _container(dep)
    assert container["command"] == ["python3", "-m", "kvtune.runtime"]
    assert container["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert dep["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": AFFINITY}
    assert "kvtune.io/pool" in dep["spec"]["template"]["metadata"]["labels"]


def test_slo_targets_are_rendered_as_histogram_bounds(pool_plan: PoolPlan) -> None:
    """issue 22 item 8: each SLO target is a bound of vLLM's latency histograms, added to
    vLLM's default bounds, so alerts, canary and observed attainment read it exactly."""
    from kvtune.operator.prometheus import slo_buckets
    from kvtune.operator.prometheus import vllm_metrics as vm

    args = _container(_by_kind(render_pool(_input(
        pool_plan, ttft_slo_seconds=2.0, tpot_slo_seconds=0.08)))["Deployment"])["args"]
    flags = [a for a in args if a.startswith(slo_buckets.FLAG + "=")]
    assert len(flags) == 1
    buckets = json.loads(flags[0].split("=", 1)[1])
    assert set(buckets) == {"time_to_first_token", "inter_token_latency"}
    assert buckets["time_to_first_token"] == sorted([*vm.TIME_TO_FIRST_TOKEN_BUCKETS, 2.0])
    assert buckets["inter_token_latency"] == sorted([*vm.INTER_TOKEN_LATENCY_BUCKETS, 0.08])
    # A target already a default bound is not repeated (vLLM refuses equal bounds).
    one = slo_buckets.custom_buckets(1.0, None)
    assert one == {"time_to_first_token": list(vm.TIME_TO_FIRST_TOKEN_BUCKETS)}
    # Without an SLO nothing is added.
    plain = _container(_by_kind(render_pool(_input(pool_plan)))["Deployment"])["args"]
    assert not any(a.startswith(slo_buckets.FLAG) for a in plain)


def test_every_pool_turns_on_vllms_kv_cache_metrics(pool_plan: PoolPlan) -> None:
    """issue 27: the residency histograms the profiling reads (reuse gaps, idle before evict)
    are on in every rendered pool, at vLLM's own 1 % sample, after the plan's flags."""
    args = _container(_by_kind(render_pool(_input(pool_plan)))["Deployment"])["args"]
    assert args[-2:] == ["--kv-cache-metrics", "--kv-cache-metrics-sample=0.01"]
    assert not any(a.startswith("--disable-log-stats") for a in args)  # vLLM needs log stats
