"""A replica that spans nodes as a LeaderWorkerSet (sigs.k8s.io/lws), running vLLM's
multi-node data parallel (docs/multi-node.md).

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

The LWS's pods carry the pool's labels, so the pool's Service (leader pods only: the workers
serve no HTTP) and monitoring find them. The leader's address resolves through a headless
Service per group that the controller makes (``subdomainPolicy: UniquePerReplica``), never
through the pool's Service, which has the LWS's name. Its rollout replaces one group at a time
with no surge (GPU nodes rarely have a spare group), and a failed pod restarts its whole group
(``RecreateGroupOnPodRestart``: the ranks of one replica start together or not at all).
"""

from __future__ import annotations

import copy
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
DATA_PARALLEL_SIZE_LOCAL_FLAG = "--data-parallel-size-local"
DATA_PARALLEL_ADDRESS_FLAG = "--data-parallel-address"
DATA_PARALLEL_RPC_PORT_FLAG = "--data-parallel-rpc-port"
DATA_PARALLEL_START_RANK_FLAG = "--data-parallel-start-rank"
HEADLESS_FLAG = "--headless"
_START_RANK_SCRIPT = ('exec "$@" ' + DATA_PARALLEL_START_RANK_FLAG
                      + '="$((' + ENV_WORKER_INDEX + ' * {local}))"')


def node_args(local_engines: int) -> list[str]:
    """The flags every pod of a group adds to the replica's line."""
    return [f"{DATA_PARALLEL_SIZE_LOCAL_FLAG}={local_engines}",
            f"{DATA_PARALLEL_ADDRESS_FLAG}=$({ENV_LEADER_ADDRESS})",
            f"{DATA_PARALLEL_RPC_PORT_FLAG}={DP_RPC_PORT}"]


def worker_container(container: dict[str, Any], local_engines: int) -> dict[str, Any]:
    """The leader's container made a worker's: headless, its start rank from its index;
    no HTTP port nor probes (a headless engine serves none)."""
    worker = copy.deepcopy(container)
    line = [*(container.get("command") or []), *(container.get("args") or [])]
    worker["command"] = ["/bin/sh", "-c", _START_RANK_SCRIPT.format(local=local_engines), "sh"]
    worker["args"] = [*line, HEADLESS_FLAG]
    for key in ("ports", "readinessProbe", "livenessProbe", "startupProbe"):
        worker.pop(key, None)
    return worker


def leader_worker_set(deployment: dict[str, Any], nodes: int, local_engines: int
                      ) -> dict[str, Any]:
    """The LWS that runs ``deployment``'s replicas (its pod template, the leader's) as groups
    of ``nodes`` pods with ``local_engines`` data-parallel engines each."""
    leader = copy.deepcopy(deployment["spec"]["template"])
    container = leader["spec"]["containers"][0]
    container["args"] = [*(container.get("args") or []), *node_args(local_engines)]
    worker = copy.deepcopy(leader)
    worker["spec"]["containers"][0] = worker_container(container, local_engines)
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
