"""Render the Kubernetes objects of one pool: Deployment, Service, PodDisruptionBudget.

A ``RenderInput`` in, plain dicts out. Templates are Jinja2 in a sandbox with
``StrictUndefined`` (a misspelt variable is an error, not an empty string), so a user's pod
template (from a ConfigMap) can read the plan but cannot reach Python. kvtune's own templates
render in this process; a user's renders in a child process with bounded CPU, memory, time
and output (``operator/render/template_sandbox.py``). Every pod, kvtune's or the user's, must then
meet the pod policy the chart chose (``operator/render/pod_policy.py``). A template that fails,
breaks a limit, yields something that is not a pod template, or asks for what the policy
refuses raises ``RenderError`` naming what is wrong; the caller reports it in status (that
object alone is Degraded) and applies nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from kvtune.operator.api import spec_bounds

# The objects' names and labels (operator/api/names.py), re-exported: the renderer's readers
# (the rollout, the reports, the tests) keep reading them here.
from kvtune.operator.api.names import (
    ANNOTATION_PLAN_HASH as ANNOTATION_PLAN_HASH,
)
from kvtune.operator.api.names import FIELD_MANAGER as FIELD_MANAGER
from kvtune.operator.api.names import LABEL_DEPLOYMENT as LABEL_DEPLOYMENT
from kvtune.operator.api.names import LABEL_GPU_CLASS as LABEL_GPU_CLASS
from kvtune.operator.api.names import LABEL_LLM_D_ROLE as LABEL_LLM_D_ROLE
from kvtune.operator.api.names import LABEL_METRICS as LABEL_METRICS
from kvtune.operator.api.names import LABEL_PLAN_REVISION as LABEL_PLAN_REVISION
from kvtune.operator.api.names import LABEL_POOL as LABEL_POOL
from kvtune.operator.api.names import LABEL_ROLE as LABEL_ROLE
from kvtune.operator.api.names import VLLM_PORT as VLLM_PORT
from kvtune.operator.api.names import object_name as object_name
from kvtune.operator.prometheus import reuse_window, slo_buckets
from kvtune.operator.render import leader_worker_set as lws
from kvtune.operator.render import (
    pod_policy,
    runtime_access,
    template_sandbox,
    tenant_reach,
    workload_pods,
)
from kvtune.operator.routing import endpoint_picker
from kvtune.tuner import plan_tier
from kvtune.tuner.facts import host_resources, kv_tiers
from kvtune.tuner.kv_transfer import Role, kv_transfer_args
from kvtune.tuner.plan import PoolPlan

PLAN_ENV = "KVTUNE_PLAN"
DEFAULT_COMMAND = ("vllm", "serve")


class RenderError(Exception):
    """A template produced no valid object; the message says which template and why."""


class ReachError(RenderError):
    """The pod would run an image or read a Secret its spec may not reach
    (operator/render/tenant_reach.py): an invalid spec, whichever template rendered it."""


@dataclass(frozen=True)
class RenderInput:
    name: str  # the InferenceDeployment's name
    namespace: str
    pool: str  # pool name (DNS label)
    pool_plan: PoolPlan
    model_name: str
    image: str
    replicas: int
    revision: int
    affinity: dict[str, Any] | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    command: tuple[str, ...] = DEFAULT_COMMAND
    pod_template: str | None = None  # the user's Jinja2 pod template, if any
    # spec.runtime.secrets: the Secrets the pod may reference (operator/render/tenant_reach.py).
    secrets: tuple[str, ...] = ()
    progress_deadline_seconds: int = 1800
    # "kvtune": the container runs kvtune's runtime entrypoint (which execs vllm) as the
    # ServiceAccount that may write the namespace's reports ConfigMap; ``command`` is then
    # ignored.
    entrypoint: str = "vllm"
    # The spec's SLO targets: each becomes a bound of vLLM's latency histograms
    # (operator/prometheus/slo_buckets.py), so alerts, canary and observed attainment read it
    # exactly.
    ttft_slo_seconds: float | None = None
    tpot_slo_seconds: float | None = None
    # spec.pools[].role: the pool's phase of a prefill/decode pair (its --kv-transfer-config
    # and role labels); None: both phases.
    role: Role | None = None
    # spec.pools[].nodesPerReplica: above 1, the replicas are a LeaderWorkerSet's groups
    # (operator/render/leader_worker_set.py), one pod per node.
    nodes_per_replica: int = 1
    # The running pods' KVTUNE_PLAN when their plan hash is this one's (render_stage): a new
    # prediction for the same knobs (a re-search, the closed loop's calibration) is status,
    # not a reason to restart every pod.
    running_plan_json: str | None = None


def model_server(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The pool's vLLM Deployment (or LeaderWorkerSet) among its rendered objects (with
    spec.routing the pool also has its endpoint picker's Deployment)."""
    return next(o for o in objects if o.get("kind") in ("Deployment", lws.KIND)
                and endpoint_picker.LABEL_PICKER not in (o["metadata"].get("labels") or {}))


def pod_gpus(pool_plan: PoolPlan, nodes_per_replica: int = 1) -> int:
    """GPUs of one pod: the replica's (TP x DP of its layout) over the nodes it spans."""
    gpus = pool_plan.layout.gpus if pool_plan.layout is not None else pool_plan.tensor_parallel
    return gpus // nodes_per_replica


def plan_hash(pool_plan: PoolPlan, image: str, role: Role | None = None) -> str:
    """Identity of what the pods run: the knobs, TP, model, version and image (and the role
    of a prefill/decode pool). Reasons and expected figures are left out on purpose:
    rewording a reason must not restart pods."""
    payload: dict[str, Any] = {
        "plan": pool_plan.plan.model_dump(mode="json"),
        "model": pool_plan.model_id,
        "tp": pool_plan.tensor_parallel,
        "vllm": pool_plan.vllm_version,
        "gpu": pool_plan.gpu_class,
        "image": image,
    }
    if role is not None:  # left out without a role: the hashes of running pools stay
        payload["role"] = role
    if pool_plan.kv_tier is not None:  # an LMCache tier: its kind and sizes (as the role)
        payload["kv_tier"] = pool_plan.kv_tier.model_dump(mode="json")
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def plan_env_json(pool_plan: PoolPlan, *, plan_hash_: str, revision: int) -> str:
    """What the runtime entrypoint reads from KVTUNE_PLAN: the plan without its reasons (nor
    the degrees ``tensorParallel: auto`` weighed: the pod runs the one chosen)."""
    data = pool_plan.model_dump(mode="json", exclude={"reasons", "warnings", "tp_choice"})
    data["plan_hash"] = plan_hash_
    data["revision"] = revision
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def vllm_args(inp: RenderInput) -> list[str]:
    """The full argument list after ``vllm serve``: model, server, TP, then the plan."""
    return [
        inp.model_name,
        "--host=0.0.0.0",
        f"--port={VLLM_PORT}",
        f"--served-model-name={inp.model_name}",
        *inp.pool_plan.vllm_args(),
        *slo_buckets.vllm_flag(inp.ttft_slo_seconds, inp.tpot_slo_seconds),
        *(kv_transfer_args(inp.role) if inp.role is not None else []),
        # The block residency histograms the profiling reads (reuse gaps, idle before evict).
        *reuse_window.vllm_flags(),
    ]


def container_resources(pool_plan: PoolPlan, nodes_per_replica: int = 1
                        ) -> tuple[dict[str, Any], str]:
    """(the vLLM container's ``resources``, the ``/dev/shm`` emptyDir's ``sizeLimit``) sized
    from the plan (``tuner/facts/host_resources.py``). The policy (docs/pod-resources.md):
    requests for the GPUs, the host memory and the CPU the engine's processes use; a memory
    limit equal to the request (a pod that outgrows its plan is OOM-killed in its own cgroup,
    never pushing the node into evicting its neighbours); no CPU limit (CFS throttling of the
    EngineCore's busy loop would stall every GPU step)."""
    per_pod = pod_gpus(pool_plan, nodes_per_replica)
    tier = pool_plan.kv_tier
    # LMCache pins its memory per rank: a pod of a replica that spans nodes holds its share.
    pinned_gib = (tier.cpu_gib() * per_pod / pod_gpus(pool_plan)) if tier is not None else 0.0
    host = host_resources.host_resources(per_pod, pool_plan.plan.kv_offloading_size_gib,
                                         pinned_gib)
    gpus = str(per_pod)
    memory = host_resources.quantity_mib(host.memory_bytes)
    resources_: dict[str, Any] = {
        "requests": {"nvidia.com/gpu": gpus, "cpu": f"{host.cpu_millicores}m",
                     "memory": memory},
        "limits": {"nvidia.com/gpu": gpus, "memory": memory},
    }
    disk = lmcache_disk_size_limit(pool_plan)
    if disk is not None:
        # The disk tier's emptyDir is node-local storage: the scheduler places the pod only
        # where that much is free, and the kubelet evicts a pod that writes past it.
        resources_["requests"]["ephemeral-storage"] = disk
        resources_["limits"]["ephemeral-storage"] = disk
    return resources_, host_resources.quantity_mib(host.shm_bytes)


def lmcache_disk_size_limit(pool_plan: PoolPlan) -> str | None:
    """The LMCache disk tier's emptyDir ``sizeLimit`` (its GiB across ranks, whole MiB up);
    None without a disk tier."""
    tier = pool_plan.kv_tier
    if tier is None or tier.disk_gib() <= 0:
        return None
    return host_resources.quantity_mib(-(-int(tier.disk_gib() * 2**30) // 2**20) * 2**20)


def lmcache_env(pool_plan: PoolPlan) -> list[dict[str, str]]:
    """The ``LMCACHE_*`` variables of the pool's LMCache tier (none without one)."""
    tier = pool_plan.kv_tier
    return [] if tier is None else plan_tier.lmcache_env(tier, pool_plan.tensor_parallel)


def _environment() -> SandboxedEnvironment:
    return SandboxedEnvironment(
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True
    )


def _template_text(name: str) -> str:
    return resources.files("kvtune.operator.render").joinpath("templates", name).read_text()


@functools.cache
def _builtin_template(name: str) -> jinja2.Template:
    """kvtune's own templates, compiled once per process (compiling the four took ~30 ms of
    each pool's render: the most of a reconcile's CPU at a thousand objects)."""
    return _environment().from_string(_template_text(name))


# libyaml's loader when PyYAML has it (several times faster on the rendered objects).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _render_yaml(name: str, where: str, context: dict[str, Any]) -> Any:
    """Render kvtune's template ``name`` (a tenant's goes through template_sandbox)."""
    try:
        text = _builtin_template(name).render(**context)
    except jinja2.TemplateError as exc:
        raise RenderError(f"{where}: template error: {exc}") from exc
    try:
        return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader, C or Python
    except yaml.YAMLError as exc:
        raise RenderError(f"{where}: rendered text is not valid YAML: {exc}") from exc


def _check_pod_template(obj: Any, where: str) -> dict[str, Any]:
    """The shape checks the API server would otherwise fail the whole apply on."""
    if not isinstance(obj, dict):
        raise RenderError(f"{where}: must render a mapping (a pod template), got "
                          f"{type(obj).__name__}")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise RenderError(f"{where}: has no 'spec' mapping; a pod template is "
                          f"{{metadata: …, spec: {{containers: […]}}}}")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise RenderError(f"{where}: spec.containers must be a non-empty list")
    for i, container in enumerate(containers):
        if not isinstance(container, dict) or not container.get("name") \
                or not container.get("image"):
            raise RenderError(f"{where}: spec.containers[{i}] needs a 'name' and an 'image'")
    unknown = set(obj) - {"metadata", "spec"}
    if unknown:
        raise RenderError(f"{where}: unexpected top-level keys {sorted(unknown)}; a pod "
                          f"template has only 'metadata' and 'spec'")
    return obj


def render_pool(inp: RenderInput) -> list[dict[str, Any]]:
    """Deployment, Service and PodDisruptionBudget of one pool, in apply order."""
    kvtune_entrypoint = inp.entrypoint == "kvtune"
    name = object_name(inp.name, inp.pool)
    hash_ = plan_hash(inp.pool_plan, inp.image, inp.role)
    selector = {LABEL_DEPLOYMENT: inp.name, LABEL_POOL: inp.pool}
    labels = {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": inp.name,
        "app.kubernetes.io/managed-by": "kvtune",
        **selector,
        LABEL_GPU_CLASS: inp.pool_plan.gpu_class,
        LABEL_PLAN_REVISION: str(inp.revision),
        # kvtune's and llm-d's role labels (llm-d's P/D scheduler selects pods by the latter).
        **({LABEL_ROLE: inp.role, LABEL_LLM_D_ROLE: inp.role} if inp.role is not None else {}),
    }
    context = _pod_context(inp, name, hash_, labels, selector, kvtune_entrypoint)
    if inp.pod_template is not None:
        pod_where = "spec.runtime.podTemplate (ConfigMap template)"
        pod = _tenant_pod(inp, context, labels, hash_, pod_where)
    else:
        pod_where = "pod.yaml.j2"
        pod = _check_pod_template(
            _render_yaml("pod.yaml.j2", "pod.yaml.j2", context), "pod.yaml.j2")
    try:
        pod_policy.check(pod)
    except pod_policy.PolicyViolation as exc:
        raise RenderError(f"{pod_where}: {exc}") from exc
    try:
        tenant_reach.check(pod, spec_image=inp.image, spec_secrets=inp.secrets)
    except tenant_reach.ReachRefused as exc:
        raise ReachError(f"{pod_where}: {exc}") from exc
    if kvtune_entrypoint:
        # The ServiceAccount, its Role and the reports ConfigMap are the chart's, per
        # namespace (operator/render/runtime_access.py): the operator creates no RBAC objects.
        runtime_access.use_runtime_access(pod)
    context["pod_template"] = pod
    objects = [_render_yaml(t, t, context)
               for t in ("deployment.yaml.j2", "service.yaml.j2", "pdb.yaml.j2")]
    if inp.nodes_per_replica > 1:
        objects = _spanning_nodes(inp, objects)
    _check_workloads(inp, objects, pod_where)
    return objects


def _check_workloads(inp: RenderInput, objects: list[dict[str, Any]], pod_where: str) -> None:
    """The pod policy and the tenant's reach again, on each pod template as it is applied:
    a LeaderWorkerSet's two templates are copies of the checked pod, the worker's changed."""
    for obj in objects:
        try:
            workload_pods.check(obj)
        except pod_policy.PolicyViolation as exc:
            raise RenderError(f"{pod_where}: {exc}") from exc
        for where, template in workload_pods.pod_templates(obj):
            try:
                tenant_reach.check(template, spec_image=inp.image, spec_secrets=inp.secrets)
            except tenant_reach.ReachRefused as exc:
                raise ReachError(f"{pod_where}: {obj['kind']} {where}: {exc}") from exc


def _spanning_nodes(inp: RenderInput, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A replica over nodes: the Deployment becomes a LeaderWorkerSet of its pod template
    (render/leader_worker_set.py); the Service selects the leaders (workers serve no HTTP)."""
    deployment, service, pdb = objects
    service["spec"]["selector"] = {**service["spec"]["selector"], lws.LABEL_WORKER_INDEX: "0"}
    group = lws.leader_worker_set(deployment, inp.nodes_per_replica, _node_launch(inp))
    return [group, service, pdb]


def _node_launch(inp: RenderInput) -> lws.NodeLaunch:
    """How a replica spans its nodes: by its pipeline stages (whole stages a node, one engine)
    or by its data-parallel engines (the same number a node); any other split is refused."""
    nodes, layout = inp.nodes_per_replica, inp.pool_plan.layout
    data_parallel = layout.data_parallel if layout is not None else 1
    pipeline = layout.pipeline_parallel if layout is not None else 1
    if pipeline > 1:
        # vLLM gives node r the ranks from r x TP x PP / nodes, TP fastest: a node holds
        # whole stages only when the stages are a multiple of the nodes.
        if pipeline % nodes:
            raise RenderError(f"nodesPerReplica={nodes} does not divide the layout's "
                              f"pipelineParallel={pipeline}; set a multiple of it")
        if data_parallel != 1:
            raise RenderError(f"dataParallel={data_parallel} beside pipelineParallel="
                              f"{pipeline} over nodesPerReplica={nodes}: a staged replica "
                              f"spans nodes as one engine; set dataParallel 1")
        return lws.pipeline_launch(nodes)
    if data_parallel % nodes:
        raise RenderError(f"nodesPerReplica={nodes} does not divide the "
                          f"layout's dataParallel={data_parallel}; set a multiple")
    return lws.data_parallel_launch(data_parallel // nodes)


def _pod_context(inp: RenderInput, name: str, hash_: str, labels: dict[str, str],
                 selector: dict[str, str], kvtune_entrypoint: bool) -> dict[str, Any]:
    """What the templates (kvtune's and a tenant's) read of the pool and its plan."""
    scrape = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(VLLM_PORT),
        "prometheus.io/path": "/metrics",
    }
    # Every GPU pod tolerates the usual GPU taint; the pool's own tolerations come after.
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                   *inp.tolerations]
    resources_, shm_size_limit = container_resources(inp.pool_plan, inp.nodes_per_replica)
    return {
        "name": name,
        "namespace": inp.namespace,
        "pool": inp.pool,
        "gpu_class": inp.pool_plan.gpu_class,
        "model": inp.model_name,
        "image": inp.image,
        "command": list(runtime_access.ENTRYPOINT_COMMAND if kvtune_entrypoint
                        else inp.command),
        "args": vllm_args(inp),
        "plan_args": inp.pool_plan.plan.vllm_args(),
        "plan": inp.pool_plan.plan.model_dump(mode="json"),
        "tensor_parallel": inp.pool_plan.tensor_parallel,
        "gpus": pod_gpus(inp.pool_plan, inp.nodes_per_replica),
        # The container's requests/limits and the /dev/shm size, from the plan.
        "resources": resources_,
        "shm_size_limit": shm_size_limit,
        # The LMCache tier (tuner/plan_tier.py): its variables, and its disk's emptyDir size.
        "lmcache_env": lmcache_env(inp.pool_plan),
        "lmcache_disk_size_limit": lmcache_disk_size_limit(inp.pool_plan),
        "lmcache_disk_path": kv_tiers.LMCACHE_DISK_PATH,
        "port": VLLM_PORT,
        "plan_json": inp.running_plan_json or plan_env_json(inp.pool_plan, plan_hash_=hash_,
                                                             revision=inp.revision),
        "plan_hash": hash_,
        "revision": inp.revision,
        "replicas": inp.replicas,
        "progress_deadline_seconds": inp.progress_deadline_seconds,
        "labels": labels,
        "selector": selector,
        "pod_labels": labels,
        "pod_annotations": {**scrape, ANNOTATION_PLAN_HASH: hash_},
        "scrape_annotations": scrape,
        "service_labels": {**labels, LABEL_METRICS: "true"},
        "node_selector": dict(inp.node_selector),
        "affinity": inp.affinity,
        "tolerations": tolerations,
        # The chart's podPolicy.level: kvtune's own pod template meets it.
        "pod_security": pod_policy.CONFIG.level,
    }


def _tenant_pod(inp: RenderInput, context: dict[str, Any], labels: dict[str, str],
                hash_: str, pod_where: str) -> dict[str, Any]:
    """The pod of a tenant's template (rendered in the sandbox), with kvtune's labels and
    plan hash on it."""
    assert inp.pod_template is not None
    try:
        rendered = template_sandbox.render_yaml(inp.pod_template, context,
                                                tenant=inp.namespace)
    except template_sandbox.SandboxError as exc:
        raise RenderError(f"{pod_where}: {exc}") from exc
    pod = _check_pod_template(rendered, pod_where)
    # The selector's labels must be on the pods whatever the user's template says,
    # or the Deployment is refused; the plan hash too, so a plan change rolls out.
    meta = pod.setdefault("metadata", {}) or {}
    pod["metadata"] = meta
    # kvtune's own labels (its selector, class, revision) are not the template's to change
    # (issue 25): one with another value is refused, loudly; a label the API server would
    # refuse fails here, once, not at each apply.
    own = meta.get("labels") or {}
    for key, value in labels.items():
        if key in own and own[key] != value:
            raise RenderError(f"{pod_where}: metadata.labels[{key!r}]={own[key]!r} "
                              f"overrides kvtune's own ({value!r}), which it selects on; "
                              f"remove it from the template (pod_labels has kvtune's)")
    meta["labels"] = {**own, **labels}
    problem = spec_bounds.label_problem(meta["labels"])
    if problem:
        raise RenderError(f"{pod_where}: metadata.labels{problem}; fix the template")
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_PLAN_HASH: hash_}
    return pod
