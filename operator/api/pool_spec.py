"""A pool of the spec: its GPU class (or a custom GPU), replicas, tensor parallelism,
node placement, and its role when prefill and decode run on separate pools.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from kvtune.operator.api.schema_base import _CEL, _DNS_LABEL, _Model, _rules
from kvtune.operator.api.spec_bounds import LabelValue, check_labels, label_rules
from kvtune.operator.api.tuning_spec import PinSpec
from kvtune.tuner.planner.layout_choice import MAX_GPUS_PER_REPLICA

_POOL_KEY = "(has({v}.name) ? {v}.name : {v}.gpuClass.lowerAscii())"


class Toleration(_Model):
    key: str | None = Field(default=None, max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0, le=31_536_000)  # a year


_QUANTITY = r"^[0-9]+(\.[0-9]+)?\s*[A-Za-z/]+$"


class CustomGPUSpec(_Model):
    """A GPU kvtune has no data for, declared by its facts; label its nodes
    ``kvtune.io/gpu-class: <gpuClass>``."""

    memory: str = Field(pattern=_QUANTITY, max_length=32, description=(
        "Memory as the CUDA runtime reports it (torch.cuda.mem_get_info total), e.g. 47.4GiB."))
    bandwidth: str = Field(pattern=_QUANTITY, max_length=32,
                           description="Memory bandwidth, e.g. 960GB/s or 3.35TB/s.")
    bf16: str = Field(pattern=_QUANTITY, max_length=32,
                      description="Dense BF16 tensor FLOPs, e.g. 364TFLOPS.")
    fp8: str | None = Field(default=None, pattern=_QUANTITY, max_length=32,
                            description="Dense FP8 tensor FLOPs (compute capability 8.9+).")
    compute_capability: str = Field(pattern=r"^[0-9]+\.[0-9]$", max_length=8,
                                    description="e.g. 8.9 (nvidia-smi --query-gpu=compute_cap).")

    def declaration(self, name: str) -> str:
        """The tuner's custom-GPU declaration (``tuner.gpus.parse_gpu_spec``)."""
        fp8 = f",fp8={self.fp8}" if self.fp8 else ""
        return (f"{name}:memory={self.memory},bandwidth={self.bandwidth},bf16={self.bf16}"
                f"{fp8},cc={self.compute_capability}")


# spec.pools[].tensorParallel: GPUs per replica, or "auto" (kvtune chooses the degree and the
# replicas, tuner/planner/tp_choice.py). An int-or-string in the CRD (pydantic's mixed enum has
# no structural form), checked there by CEL and here by the Literal.
_TP_VALUES = "1, 2, 4, 8 or auto"
TensorParallel = Annotated[Literal[1, 2, 4, 8, "auto"], WithJsonSchema({
    "x-kubernetes-int-or-string": True, "default": 1,
    "description": "GPUs per replica (tensor parallel): 1, 2, 4 or 8; auto: kvtune chooses the "
                   "degree and the replicas for the lowest cost per good request, with "
                   "replicas as the most it may run.",
    _CEL: [{"rule": "type(self) == string ? self == 'auto' : self in [1, 2, 4, 8]",
            "message": f"tensorParallel must be {_TP_VALUES}; set one of them"}]})]


# Prefill/decode disaggregation (docs/disaggregation.md): a pool with a role runs one phase;
# a decode pool names the prefill pool that hands it each request's KV cache (one pair per
# prefill pool: kvtune plans and checks the two together). The cross-pool rules (the peer
# exists and is a prefill pool) are the deployment's (operator/api/pool_roles.py).
Role = Literal["prefill", "decode"]
_ROLE_RULES = (
    ("!has(self.prefillPool) || (has(self.role) && self.role == 'decode')",
     "pools[].prefillPool is for a pool with role: decode; set role: decode or drop "
     "prefillPool"),
    ("!has(self.role) || self.role != 'decode' || has(self.prefillPool)",
     "a pool with role: decode needs pools[].prefillPool, the name of the prefill pool that "
     "hands it the KV cache; set it"),
    ("!has(self.pin) || has(self.role)",
     "pools[].pin holds one role's own pins; set pools[].role or move the pins to "
     "tuning.pin"),
    ("!has(self.role) || !has(self.tensorParallel) || type(self.tensorParallel) != string",
     "a pool with a role needs a pinned tensorParallel (1, 2, 4 or 8): kvtune plans the two "
     "roles of a pair together at their degrees; set pools[].tensorParallel"),
)

# A replica's layout beyond TP (tuner/layout.py) and the nodes it spans (docs/multi-node.md):
# dataParallel engines per replica, their experts split with expertParallel; a replica over
# nodesPerReplica nodes renders a LeaderWorkerSet (one pod per node, dataParallel /
# nodesPerReplica engines each, vLLM's multi-node data parallel; or, under pipelineParallel,
# whole stages each: _PIPELINE_RULES).
_LAYOUT_RULES = (
    ("!has(self.nodesPerReplica) || !has(self.dataParallel) || has(self.gpusPerReplica) || "
     "(has(self.pipelineParallel) && self.pipelineParallel > 1) || "
     "self.dataParallel % self.nodesPerReplica == 0",
     "pools[].dataParallel must be a multiple of nodesPerReplica: a replica spans nodes by "
     "its data-parallel engines, the same number on each node; raise dataParallel or lower "
     "nodesPerReplica"),
    ("(!has(self.dataParallel) || self.dataParallel == 1) || !has(self.tensorParallel) || "
     "type(self.tensorParallel) != string",
     "pools[].dataParallel needs a pinned tensorParallel (1, 2, 4 or 8); set it"),
    ("!has(self.role) || ((!has(self.dataParallel) || self.dataParallel == 1) && "
     "(!has(self.nodesPerReplica) || self.nodesPerReplica == 1))",
     "a pool with a role runs one engine per replica on one node; drop dataParallel and "
     "nodesPerReplica from it"),
)

# gpusPerReplica: the layout of that many GPUs is chosen by the planner (as `kvtune plan
# --gpus-per-replica N`), so no part of it is pinned beside it. (The API server defaults the
# layout fields, so a pin is told apart from the default by its value.)
_CHOSEN_LAYOUT_RULES = (
    ("!has(self.gpusPerReplica) || ((!has(self.tensorParallel) || "
     "(type(self.tensorParallel) != string && self.tensorParallel == 1)) && "
     "(!has(self.dataParallel) || self.dataParallel == 1) && "
     "(!has(self.expertParallel) || !self.expertParallel))",
     "pools[].gpusPerReplica has kvtune choose the whole layout (tensorParallel x "
     "dataParallel, expertParallel); drop tensorParallel, dataParallel and expertParallel "
     "from the pool, or drop gpusPerReplica to pin them"),
    ("!has(self.gpusPerReplica) || !has(self.nodesPerReplica) || "
     "self.gpusPerReplica % self.nodesPerReplica == 0",
     "pools[].gpusPerReplica must be a multiple of nodesPerReplica (the same GPUs on each "
     "node of a replica); raise gpusPerReplica or lower nodesPerReplica"),
    ("!has(self.gpusPerReplica) || !has(self.role)",
     "a pool with a role is planned with its pair at a pinned tensorParallel; drop "
     "gpusPerReplica from it"),
)


# pipelineParallel: each engine's layers in stages (vLLM --pipeline-parallel-size), pinned only
# (as `kvtune plan --pp`), at a pinned layout and without a role. Over nodesPerReplica nodes
# (docs/multi-node.md) a replica is one engine whose nodes hold whole stages: vLLM gives node r
# the ranks from r x TP x PP / nodes, TP fastest, so a stage's TP ranks share a node only when
# the stages are a multiple of the nodes.
_PP_SET = "(has(self.pipelineParallel) && self.pipelineParallel > 1)"
_OVER_NODES = "(has(self.nodesPerReplica) && self.nodesPerReplica > 1)"
_PIPELINE_RULES = (
    (f"!{_PP_SET} || !has(self.tensorParallel) || type(self.tensorParallel) != string",
     "pools[].pipelineParallel needs a pinned tensorParallel (1, 2, 4 or 8); set it"),
    (f"!{_PP_SET} || (!has(self.gpusPerReplica) && !has(self.role))",
     "pools[].pipelineParallel runs at a pinned layout, without a role; drop gpusPerReplica "
     "and role from the pool, or drop pipelineParallel"),
    (f"!{_PP_SET} || !{_OVER_NODES} || "
     "self.pipelineParallel % self.nodesPerReplica == 0",
     "pools[].pipelineParallel must be a multiple of nodesPerReplica: each node holds whole "
     "stages (a stage's tensorParallel GPUs on one node); raise pipelineParallel or lower "
     "nodesPerReplica"),
    (f"!{_PP_SET} || !{_OVER_NODES} || !has(self.dataParallel) || self.dataParallel == 1",
     "pools[].pipelineParallel over nodesPerReplica nodes runs one engine per replica; "
     "drop dataParallel from the pool, or drop nodesPerReplica"),
)


# decodeContextParallel: each sequence's KV tokens split among the TP ranks (vLLM
# --decode-context-parallel-size, MLA models: a planner-time check), pinned only, as
# `kvtune plan --dcp`: over a pinned tensorParallel it divides, or beside gpusPerReplica (each
# layout whose TP it divides gets it); not on a role's pool (`--disaggregate` takes no --dcp).
_DCP_RULES = (
    ("!has(self.decodeContextParallel) || self.decodeContextParallel == 1 || "
     "has(self.gpusPerReplica) || (has(self.tensorParallel) && "
     "type(self.tensorParallel) != string && "
     "int(self.tensorParallel) % self.decodeContextParallel == 0)",
     "pools[].decodeContextParallel must divide a pinned tensorParallel (vLLM: tp % dcp == "
     "0); raise tensorParallel to a multiple of it, lower it, or set gpusPerReplica"),
    ("!has(self.decodeContextParallel) || !has(self.gpusPerReplica) || "
     "self.gpusPerReplica % self.decodeContextParallel == 0",
     "pools[].decodeContextParallel must divide gpusPerReplica (it divides the TP of each "
     "layout); lower it or raise gpusPerReplica"),
    ("!has(self.decodeContextParallel) || self.decodeContextParallel == 1 || !has(self.role)",
     "a pool with a role is planned without decode context parallel; drop "
     "decodeContextParallel from it"),
)


class PoolSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        (f"!{_POOL_KEY.format(v='self')}.endsWith('-canary')",
         "a pool name must not end in -canary (kvtune names the canary Deployment of pool "
         "<p> <name>-<p>-canary); set pools[].name"),
        *label_rules("spec.pools[]", "nodeSelector", reserved=False),
        *_ROLE_RULES,
        *_LAYOUT_RULES,
        *_CHOSEN_LAYOUT_RULES,
        *_PIPELINE_RULES,
        *_DCP_RULES,
    ))

    gpu_class: str = Field(
        min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="kvtune GPU class, e.g. H100, H200, B200, L4; or the name of a customGpu.",
    )
    custom_gpu: CustomGPUSpec | None = Field(
        default=None, description="Declares gpuClass as a GPU kvtune has no data for.")
    name: str | None = Field(
        default=None, min_length=1, max_length=20, pattern=_DNS_LABEL,
        description="Pool name in object names; defaults to the lower-cased GPU class.",
    )
    replicas: int = Field(default=1, ge=0, le=512)
    tensor_parallel: TensorParallel = 1
    gpu_price_usd_per_hour: float | None = Field(
        default=None, gt=0, le=100_000,
        description="What one GPU of this pool costs per hour, in USD, for the cost figures in "
        "status (overrides the chart's gpuPrices and kvtune's list prices).")
    node_selector: dict[str, LabelValue] | None = Field(default=None, max_length=16)
    tolerations: list[Toleration] | None = Field(default=None, max_length=16)
    data_parallel: int = Field(default=1, ge=1, le=64, description=(
        "Data-parallel attention engines per replica (vLLM --data-parallel-size), each over "
        "tensorParallel GPUs with its own KV cache: a replica has tensorParallel x "
        "dataParallel GPUs."))
    expert_parallel: bool = Field(default=False, description=(
        "Split a MoE model's experts over the replica's GPUs (vLLM --enable-expert-parallel)."))
    pipeline_parallel: int = Field(default=1, ge=1, le=16, description=(
        "Pipeline-parallel stages per engine (vLLM --pipeline-parallel-size): each stage "
        "holds its own layers' weights and KV cache, a replica has tensorParallel x "
        "dataParallel x pipelineParallel GPUs. Over nodesPerReplica nodes (a multiple of "
        "them, dataParallel 1) each node runs whole stages, the sends between stages over "
        "the RDMA NIC. Pinned only (as `kvtune plan --pp`)."))
    decode_context_parallel: int = Field(default=1, ge=1, le=MAX_GPUS_PER_REPLICA,
                                         description=(
        "Decode context parallel (vLLM --decode-context-parallel-size, MLA models such as "
        "DeepSeek-V3): each sequence's KV tokens split among this many TP ranks, so a "
        "replica holds that many times the tokens. Pinned only (as `kvtune plan --dcp`): it "
        "divides tensorParallel, or with gpusPerReplica each layout whose TP it divides "
        "gets it."))
    nodes_per_replica: int = Field(default=1, ge=1, le=16, description=(
        "Nodes one replica spans; above 1 the replica is a LeaderWorkerSet (sigs.k8s.io/lws) "
        "of one pod per node running dataParallel / nodesPerReplica engines each, or under "
        "pipelineParallel pipelineParallel / nodesPerReplica stages each."))
    gpus_per_replica: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_REPLICA,
                                         description=(
        "GPUs of one replica: kvtune chooses its layout (tensorParallel x dataParallel "
        "attention, expertParallel for MoE) by the plan's objective, as `kvtune plan "
        "--gpus-per-replica` does; over nodesPerReplica nodes, dataParallel a multiple of "
        "them. Unset: the layout is the pinned tensorParallel x dataParallel."))
    role: Role | None = Field(default=None, description=(
        "Prefill/decode disaggregation: prefill runs each request's prompt and hands its KV "
        "cache to a decode pool over vLLM's NixlConnector (--kv-transfer-config kv_producer); "
        "decode (kv_consumer) generates the output. Unset: both phases on this pool."))
    prefill_pool: str | None = Field(default=None, min_length=1, max_length=20,
                                     pattern=_DNS_LABEL, description=(
        "role: decode only: the name of the prefill pool of this spec that hands this pool "
        "its KV cache (pools[].name, else the lower-cased gpuClass)."))
    pin: PinSpec | None = Field(default=None, description=(
        "A role's own pins, over spec.tuning.pin (pools with a role only). The pair's plans "
        "must stay compatible for the NixlConnector handshake; one that cannot is refused."))

    @property
    def pool_name(self) -> str:
        return self.name or self.gpu_class.lower().replace("_", "-")

    @property
    def tp_auto(self) -> bool:
        """``tensorParallel: auto``: the degree and replicas are planned (up to ``replicas``)."""
        return self.tensor_parallel == "auto"

    @property
    def gpu_declaration(self) -> str:
        """What ``tuner.gpus.get_gpu_class`` takes: the class name, or its custom declaration."""
        return self.custom_gpu.declaration(self.gpu_class) if self.custom_gpu else self.gpu_class

    @model_validator(mode="after")
    def _not_a_canary_name(self) -> PoolSpec:
        if self.pool_name.endswith("-canary"):
            raise ValueError(f"pool name {self.pool_name!r} ends in -canary, the suffix of "
                             f"kvtune's canary Deployments; set pools[].name")
        check_labels(self.node_selector, "spec.pools[].nodeSelector", reserved=False)
        _check_role_fields(self)
        return self


def _check_role_fields(pool: PoolSpec) -> None:
    """The pool-level role rules (``_ROLE_RULES``), for a spec that is not applied."""
    if pool.prefill_pool is not None and pool.role != "decode":
        raise ValueError(_ROLE_RULES[0][1])
    if pool.role == "decode" and pool.prefill_pool is None:
        raise ValueError(_ROLE_RULES[1][1])
    if pool.pin is not None and pool.role is None:
        raise ValueError(_ROLE_RULES[2][1])
    if pool.role is not None and pool.tp_auto:
        raise ValueError(_ROLE_RULES[3][1])
    _check_chosen_layout(pool)
    _check_pipeline(pool)
    _check_dcp(pool)
    nodes, dp = pool.nodes_per_replica, pool.data_parallel
    # With gpusPerReplica the DP is chosen, a multiple of the nodes (layout_choice).
    broken = [dp % nodes != 0 and pool.gpus_per_replica is None and pool.pipeline_parallel == 1,
              dp > 1 and pool.tp_auto,
              pool.role is not None and (dp > 1 or nodes > 1)]
    _refuse_first(_LAYOUT_RULES, broken,
                  f"spec.pools[] ({pool.pool_name}): dataParallel={dp}, nodesPerReplica={nodes}")


def _check_pipeline(pool: PoolSpec) -> None:
    """``_PIPELINE_RULES``, for a spec that is not applied."""
    pp, nodes = pool.pipeline_parallel, pool.nodes_per_replica
    if pp == 1:
        return
    broken = [pool.tp_auto, pool.gpus_per_replica is not None or pool.role is not None,
              nodes > 1 and pp % nodes != 0, nodes > 1 and pool.data_parallel != 1]
    _refuse_first(_PIPELINE_RULES, broken, f"spec.pools[] ({pool.pool_name}): "
                  f"pipelineParallel={pp}, nodesPerReplica={nodes}")


def _check_dcp(pool: PoolSpec) -> None:
    """``_DCP_RULES``, for a spec that is not applied (the MLA check is the planner's)."""
    dcp, gpus, tp = pool.decode_context_parallel, pool.gpus_per_replica, pool.tensor_parallel
    if dcp == 1:
        return
    broken = [gpus is None and (isinstance(tp, str) or tp % dcp != 0),
              gpus is not None and gpus % dcp != 0, pool.role is not None]
    _refuse_first(_DCP_RULES, broken,
                  f"spec.pools[] ({pool.pool_name}): decodeContextParallel={dcp}")


def _check_chosen_layout(pool: PoolSpec) -> None:
    """``_CHOSEN_LAYOUT_RULES``, for a spec that is not applied."""
    gpus = pool.gpus_per_replica
    if gpus is None:
        return
    broken = [pool.tensor_parallel != 1 or pool.data_parallel != 1 or pool.expert_parallel,
              gpus % pool.nodes_per_replica != 0, pool.role is not None]
    _refuse_first(_CHOSEN_LAYOUT_RULES, broken,
                  f"spec.pools[] ({pool.pool_name}): gpusPerReplica={gpus}")


def _refuse_first(rules: tuple[tuple[str, str], ...], broken: list[bool], where: str) -> None:
    """The first broken rule's message after ``where`` (the field and its value): the Python
    twin of the CEL rule the API server would have answered with."""
    for (_cel, message), bad in zip(rules, broken, strict=True):
        if bad:
            raise ValueError(f"{where}: {message}")
