"""Stage 2, render: place the planned pool on its GPU nodes and render its objects.

In: ``Planned`` and the GPU pools discovered from the nodes. Out: ``Rendered`` (the
objects to apply, the runtime's access objects apart, and the plan hash the running
Deployment carries), or the pool's outcome when it stops here: ``recommend`` mode, no
nodes of its class, nodes too small for its tensor parallelism or too few for its replicas,
a pod template that cannot be read or renders no valid object, or reaches for an image or
Secret its spec may not (operator/render/tenant_reach.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvtune.operator.api import PoolStatus
from kvtune.operator.api import conditions as cond
from kvtune.operator.kube import apply as kapply
from kvtune.operator.kube import leader_worker_sets
from kvtune.operator.kube import pools as gpu_pools
from kvtune.operator.render import template_sandbox, tenant_reach
from kvtune.operator.render.objects import (
    ANNOTATION_PLAN_HASH,
    PLAN_ENV,
    ReachError,
    RenderError,
    RenderInput,
    model_server,
    object_name,
    pod_gpus,
    render_pool,
)
from kvtune.operator.rollout.outcome import PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import Planned
from kvtune.operator.routing import inference_pool as routing

GIB_BYTES = 2**30
# The runtime's ServiceAccount, Role, RoleBinding (spec.runtime.entrypoint: kvtune).
RUNTIME_ACCESS_KINDS = ("ServiceAccount", "Role", "RoleBinding")


@dataclass(frozen=True)
class Rendered:
    render_input: RenderInput  # with the placement and the pod template
    status: PoolStatus  # the planned pool's status with its node count
    # Deployment, Service, PDB (and with spec.routing the InferencePool and its endpoint
    # picker's ConfigMap, Deployment and Service: a new plan moves the scorer's block size
    # in the same apply)
    objects: list[dict[str, Any]]
    access: list[dict[str, Any]]  # the runtime's access objects, applied first
    running_hash: str | None  # the plan hash of the Deployment running now
    # The pool's Deployment (or LeaderWorkerSet) did not exist when it was read here (apply
    # reads it no more)
    deployment_absent: bool = False
    # What runs the pool's replicas: a Deployment, or a LeaderWorkerSet when they span nodes
    model_server_kind: str = "Deployment"


def _capacity_shortfall(ctx: PoolContext, planned: Planned,
                        placed: Sequence[gpu_pools.GPUNode]) -> str | None:
    """The message when the pool's replicas can never all be placed: each replica needs
    tensorParallel GPUs of one node, and the nodes it may use have fewer in all (issue 25
    item 5: 512 replicas on 32 GPUs was Degraded=False until the progress deadline). None
    when they fit, or when a node does not say how many GPUs it has."""
    # GPUs of one pod: the plan's TP (tensorParallel auto's chosen degree) x its DP engines
    # on one node; a replica over nodes is that many pods.
    nodes = planned.render_input.nodes_per_replica
    tp = pod_gpus(planned.pool_plan, nodes)
    replicas = planned.render_input.replicas * nodes
    if not placed or any(n.gpus <= 0 for n in placed):
        return None
    fit = sum(n.gpus // tp for n in placed)
    if replicas <= fit:
        return None
    total = sum(n.gpus for n in placed)
    gpu_class = planned.pool_plan.gpu_class
    shape = f"{replicas} replicas x tensorParallel={tp}" if nodes == 1 else \
        f"{replicas} pods ({nodes} per replica) x {tp} GPUs"
    return (f"{ctx.field}.replicas={planned.render_input.replicas}: {shape} need "
            f"{replicas * tp} {gpu_class} GPUs, but the {len(placed)} schedulable {gpu_class} "
            f"node(s) it may use have {total} in all, room for {fit // nodes} replica(s); "
            f"lower replicas to at most {fit // nodes} or add nodes")


def render(ctx: PoolContext, planned: Planned,
           discovered: Mapping[str, gpu_pools.GPUPool]) -> Rendered | PoolOutcome:
    placement = _place(ctx, planned, discovered)
    if isinstance(placement, PoolOutcome):
        return placement
    status, affinity = placement.status, placement.affinity
    pool = ctx.pool
    template = _tenant_template(ctx)
    if isinstance(template, PoolOutcome):
        return template
    inp = dataclasses.replace(planned.render_input, affinity=affinity, pod_template=template)
    # What the Deployment (or LeaderWorkerSet) runs now (the plan in status may be one only
    # recommended).
    kind = leader_worker_sets.KIND if pool.nodes_per_replica > 1 else "Deployment"
    read = leader_worker_sets.read if pool.nodes_per_replica > 1 else kapply.read_deployment
    running = read(ctx.kube, ctx.namespace, object_name(ctx.name, pool.pool_name))
    running_hash = ((running or {}).get("metadata", {}).get("annotations") or {}).get(
        ANNOTATION_PLAN_HASH)
    if running_hash is not None and running_hash == planned.plan_hash:
        inp = dataclasses.replace(inp, running_plan_json=_running_plan_json(running))
    objects = _render_objects(ctx, inp)
    if isinstance(objects, PoolOutcome):
        return objects
    if ctx.spec.routing.enabled:
        if not routing.operator_enabled():
            return ctx.failed(cond.INVALID_SPEC, "spec.routing.enabled=true, but this operator "
                              "was installed without routing (the chart value routing.enabled, "
                              "which needs the Gateway API Inference Extension's CRDs): set it, "
                              "or set spec.routing.enabled=false")
        deployment = model_server(objects)
        objects = [*objects, *routing.routing_objects(
            name=ctx.name, namespace=ctx.namespace, pool=pool.pool_name,
            pool_plan=planned.pool_plan, labels=dict(deployment["metadata"]["labels"]),
            prefix_hit_rate=planned.pool_plan.expected.prefix_hit_rate,
            multi_turn=planned.multi_turn)]
    return Rendered(
        render_input=inp, status=status,
        objects=[o for o in objects if o["kind"] not in RUNTIME_ACCESS_KINDS],
        access=[o for o in objects if o["kind"] in RUNTIME_ACCESS_KINDS],
        running_hash=running_hash, deployment_absent=running is None, model_server_kind=kind,
    )


def _running_plan_json(running: Mapping[str, Any] | None) -> str | None:
    """The running Deployment's (or LeaderWorkerSet leader's) KVTUNE_PLAN (None: not
    found)."""
    spec = (running or {}).get("spec") or {}
    template = spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get(
        "leaderTemplate") or {}
    containers = (template.get("spec") or {}).get("containers") or []
    for container in containers:
        for env in container.get("env") or []:
            if env.get("name") == PLAN_ENV and isinstance(env.get("value"), str):
                return str(env["value"])
    return None


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where the pool's pods go: its status with the node count, the node affinity."""

    status: PoolStatus
    affinity: dict[str, Any]


def _place(ctx: PoolContext, planned: Planned,
           discovered: Mapping[str, gpu_pools.GPUPool]) -> _Placement | PoolOutcome:
    """The pool on its GPU nodes: refused (the pool's outcome) when no node of the class is
    schedulable, its selector matches none, its offload or TP does not fit the nodes, or
    the nodes are too few."""
    pool, status = ctx.pool, planned.status
    gpu_class = planned.pool_plan.gpu_class
    nodes = discovered.get(gpu_class.upper())
    node_count = len(nodes.schedulable_nodes) if nodes else 0
    status = status.model_copy(update={"nodes": node_count})
    if ctx.spec.tuning.mode == "recommend":
        return PoolOutcome(status.model_copy(update={
            "phase": "Recommended", "message": "tuning.mode=recommend: not applied"}))
    affinity = nodes.node_affinity() if nodes is not None else None
    if nodes is None or node_count == 0 or affinity is None:
        return PoolOutcome(status.model_copy(update={
            "phase": "NoNodes",
            "message": f"no schedulable node is labelled as a {gpu_class} GPU; label the "
                       f"nodes (e.g. nvidia.com/gpu.product) or add nodes to the pool"}),
            no_nodes=True)
    selector = dict(pool.node_selector or {})
    placed = [n for n in nodes.schedulable_nodes if n.matches(selector)]
    if selector and not placed:
        shown = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return ctx.failed(cond.INVALID_SPEC, f"{ctx.field}.nodeSelector={shown}: none of the "
                          f"{node_count} schedulable {gpu_class} node(s) has these labels, so "
                          f"no pod could be scheduled; fix the selector or label the nodes")
    offload = planned.pool_plan.plan.kv_offloading_size_gib
    memory = min((n.memory_bytes for n in placed if n.memory_bytes), default=0)
    if offload and memory and offload * GIB_BYTES >= memory:
        return ctx.failed(cond.INVALID_SPEC, f"spec.tuning.pin.kvOffloadingSizeGiB={offload:g}: "
                          f"the {gpu_class} nodes have {memory / GIB_BYTES:.0f} GiB of memory "
                          f"(the smallest); the CPU offload buffer must fit beside the server: "
                          f"lower it")
    tp = pod_gpus(planned.pool_plan, planned.render_input.nodes_per_replica)
    if nodes.max_gpus_per_node and nodes.max_gpus_per_node < tp:
        chosen = f" (auto chose {tp})" if pool.tp_auto else ""
        return ctx.failed(cond.INVALID_SPEC, f"{ctx.field}.tensorParallel="
                          f"{pool.tensor_parallel}{chosen}: {gpu_class} nodes have at most "
                          f"{nodes.max_gpus_per_node} GPUs; lower tensorParallel or add "
                          f"larger nodes")
    short = _capacity_shortfall(ctx, planned, placed if selector else nodes.schedulable_nodes)
    if short is not None:
        return ctx.failed(cond.INVALID_SPEC, short)

    return _Placement(status, affinity)


def _tenant_template(ctx: PoolContext) -> str | PoolOutcome | None:
    """The tenant's pod template from its ConfigMap (None: kvtune's own)."""
    template = None
    if ctx.spec.runtime.pod_template is not None:
        ref = ctx.spec.runtime.pod_template.config_map_ref
        try:
            template = kapply.read_config_map_key(ctx.kube, ctx.namespace, ref.name, ref.key,
                                                  field="spec.runtime.podTemplate.configMapRef")
        except LookupError as exc:
            return ctx.failed(cond.INVALID_POD_TEMPLATE, str(exc))
        unpinned = tenant_reach.unpinned_template(ctx.spec.runtime, template)
        if unpinned:
            return ctx.failed(cond.INVALID_SPEC, f"pool {ctx.pool.pool_name}: {unpinned}; nothing "
                              f"was changed")
    return template


def _render_objects(ctx: PoolContext, inp: RenderInput) -> list[dict[str, Any]] | PoolOutcome:
    """The pool's objects, or the pool's outcome when the render fails or is deferred."""
    pool = ctx.pool
    try:
        objects = render_pool(inp)
    except template_sandbox.RenderDeferred as exc:  # the tenant's turn or budget: retried
        outcome = ctx.failed(cond.TEMPLATE_RENDER_DEFERRED, f"pool {pool.pool_name}: "
                             f"spec.runtime.podTemplate: {exc}; nothing was changed")
        return dataclasses.replace(outcome, retry_after=exc.retry_after_seconds)
    except ReachError as exc:  # an image or Secret the spec may not reach: the spec's fault
        return ctx.failed(cond.INVALID_SPEC, f"pool {pool.pool_name}: {exc}; nothing was "
                          f"changed")
    except RenderError as exc:
        return ctx.failed(cond.INVALID_POD_TEMPLATE, f"pool {pool.pool_name}: {exc}; nothing "
                          f"was changed")
    except Exception as exc:  # a template that fails in a way the renderer did not name
        return ctx.failed(cond.INVALID_POD_TEMPLATE, f"pool {pool.pool_name}: the pod template "
                          f"failed ({type(exc).__name__}: {str(exc)[:160]}); fix "
                          f"spec.runtime.podTemplate; nothing was changed")
    return objects
