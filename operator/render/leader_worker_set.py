"""A replica that spans nodes as a LeaderWorkerSet (sigs.k8s.io/lws), running vLLM's
multi-node data parallel, or its multi-node pipeline parallel (docs/multi-node.md).

A replica of ``tensorParallel x dataParallel`` GPUs over ``nodesPerReplica`` nodes is one LWS
group of that many pods, one per node: the leader (LWS worker index 0) runs the API server and
data-parallel ranks ``0 .. local-1``; each worker runs ``--headless`` (engines only, no API
server) with ranks from ``index x local``. Every pod names the leader as the data-parallel
coordinator. The flags are vLLM 0.33's (``vllm/engine/arg_utils.py``, the ParallelConfig group;
``--headless`` in ``vllm/entrypoints/common/cli_args.py``):

- ``--data-parallel-size`` (the layout's, from the plan), ``--data-parallel-size-local``: the
  engines of this pod (``dataParallel / nodesPerReplica``);
- ``--data-parallel-address``: the leader's address, ``$(LWS_LEADER_ADDRESS)``, which the LWS
  controller's webhook puts in every container's environment and the kubelet expands in
  ``args``;
- ``--data-parallel-rpc-port``: a fixed port every node reaches the leader on;
- ``--data-parallel-start-rank``: the worker's first rank, ``LWS_WORKER_INDEX x local``. The
  kubelet expands ``$(VAR)`` but does no arithmetic, so a worker's line goes through
  ``/bin/sh -c 'exec "$@" --data-parallel-start-rank=$((LWS_WORKER_INDEX * local))'``; the
  vLLM line itself is passed as the script's arguments, never quoted into it.

A replica of one engine in ``pipelineParallel`` stages (``tensorParallel`` GPUs each) over
``nodesPerReplica`` nodes runs without Ray (vLLM 0.33's multiprocessing executor over nodes,
``vllm/engine/arg_utils.py`` and ``ParallelConfig.nnodes_within_dp``): every pod adds
``--nnodes`` and the leader as the torch.distributed master (``--master-addr``,
``--master-port``); each worker's ``--node-rank`` is its LWS index (the same ``sh -c``
wrapper) and it runs ``--headless`` (``vllm/entrypoints/cli/serve.py`` starts only the
executor's workers where the node rank is above 0). vLLM gives node ``r`` the global ranks
``r x TP x PP / nodes`` onwards, TP fastest, so each node holds whole stages when
``pipelineParallel`` is a multiple of the nodes: a stage's all-reduce stays on NVLink and
only the stage-to-stage sends cross the NIC.

The LWS's pods carry the pool's labels, so the pool's Service (leader pods only: the workers
serve no HTTP) and monitoring find them. The leader's address resolves through a headless
Service per group that the controller makes (``subdomainPolicy: UniquePerReplica``), never
through the pool's Service, which has the LWS's name. Its rollout replaces one group at a time
with no surge (GPU nodes rarely have a spare group), and a failed pod restarts its whole group
(``RecreateGroupOnPodRestart``: the ranks of one replica start together or not at all).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

LWS_MODULE = "sigs.k8s.io/lws"
# The release whose CRD the rendered objects are validated against (e2e/gomod/lws/go.mod).
LWS_VERSION = "v0.9.0"
API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
# The label LWS puts on each pod of a group: 0 on the leader (api/leaderworkerset/v1).
LABEL_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
ENV_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
ENV_WORKER_INDEX = "LWS_WORKER_INDEX"
# The data-parallel coordinator's RPC port on the leader (vLLM picks a free one when unset,
# which the workers could not know).
DP_RPC_PORT = 13345
# The torch.distributed master port on the leader for a pipeline over nodes: vLLM's default
# (ParallelConfig.master_port), stated so every pod names the same one.
MASTER_PORT = 29501
DATA_PARALLEL_SIZE_LOCAL_FLAG = "--data-parallel-size-local"
DATA_PARALLEL_ADDRESS_FLAG = "--data-parallel-address"
DATA_PARALLEL_RPC_PORT_FLAG = "--data-parallel-rpc-port"
DATA_PARALLEL_START_RANK_FLAG = "--data-parallel-start-rank"
NNODES_FLAG = "--nnodes"
NODE_RANK_FLAG = "--node-rank"
MASTER_ADDR_FLAG = "--master-addr"
MASTER_PORT_FLAG = "--master-port"
HEADLESS_FLAG = "--headless"
_RANK_SCRIPT = 'exec "$@" {flag}="$((' + ENV_WORKER_INDEX + ' * {step}))"'


@dataclass(frozen=True)
class NodeLaunch:
    """How the pods of one group join their replica: the flags every pod adds, and the flag
    whose value a worker computes from its LWS index (``index x rank_step``)."""

    args: tuple[str, ...]
    rank_flag: str
    rank_step: int


def data_parallel_launch(local_engines: int) -> NodeLaunch:
    """vLLM's multi-node data parallel: ``local_engines`` engines a pod, the leader the
    coordinator, a worker's first rank ``index x local_engines``."""
    return NodeLaunch((f"{DATA_PARALLEL_SIZE_LOCAL_FLAG}={local_engines}",
                       f"{DATA_PARALLEL_ADDRESS_FLAG}=$({ENV_LEADER_ADDRESS})",
                       f"{DATA_PARALLEL_RPC_PORT_FLAG}={DP_RPC_PORT}"),
                      DATA_PARALLEL_START_RANK_FLAG, local_engines)


def pipeline_launch(nodes: int) -> NodeLaunch:
    """One engine's stages over ``nodes`` nodes: the leader the torch.distributed master, a
    worker's node rank its index (the leader's is vLLM's default, 0)."""
    return NodeLaunch((f"{NNODES_FLAG}={nodes}",
                       f"{MASTER_ADDR_FLAG}=$({ENV_LEADER_ADDRESS})",
                       f"{MASTER_PORT_FLAG}={MASTER_PORT}"),
                      NODE_RANK_FLAG, 1)


def worker_container(container: dict[str, Any], launch: NodeLaunch) -> dict[str, Any]:
    """The leader's container made a worker's: headless, its rank from its index; no HTTP
    port nor probes (a headless engine serves none)."""
    worker = copy.deepcopy(container)
    line = [*(container.get("command") or []), *(container.get("args") or [])]
    script = _RANK_SCRIPT.format(flag=launch.rank_flag, step=launch.rank_step)
    worker["command"] = ["/bin/sh", "-c", script, "sh"]
    worker["args"] = [*line, HEADLESS_FLAG]
    for key in ("ports", "readinessProbe", "livenessProbe", "startupProbe"):
        worker.pop(key, None)
    return worker


def leader_worker_set(deployment: dict[str, Any], nodes: int, launch: NodeLaunch
                      ) -> dict[str, Any]:
    """The LWS that runs ``deployment``'s replicas (its pod template, the leader's) as groups
    of ``nodes`` pods that join their replica as ``launch`` says."""
    leader = copy.deepcopy(deployment["spec"]["template"])
    container = leader["spec"]["containers"][0]
    container["args"] = [*(container.get("args") or []), *launch.args]
    worker = copy.deepcopy(leader)
    worker["spec"]["containers"][0] = worker_container(container, launch)
    meta = deployment["metadata"]
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                     "labels": dict(meta.get("labels") or {}),
                     "annotations": dict(meta.get("annotations") or {})},
        "spec": {
            "replicas": deployment["spec"]["replicas"],
            "startupPolicy": "LeaderCreated",
            # One headless Service per group, named after its leader pod, which the leader's
            # address resolves through. The default (Shared) would name it after the LWS, the
            # name of the pool's own ClusterIP Service: the controller then finds that one,
            # creates none, and LWS_LEADER_ADDRESS names no DNS record (the real controller
            # showed it: tests/operator/test_op_lws_controller_cluster.py).
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxUnavailable": 1, "maxSurge": 0}},
            "leaderWorkerTemplate": {
                "size": nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader, "workerTemplate": worker},
        },
    }
