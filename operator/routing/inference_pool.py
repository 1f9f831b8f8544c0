"""Routing that knows the plan: the Gateway API Inference Extension objects of one pool. Pure.

With ``spec.routing.enabled`` (and the chart's ``routing.enabled``, which says the cluster has
the Inference Extension CRDs), each pool gets:

- an ``InferencePool`` (``inference.networking.k8s.io/v1``) selecting the pool's pods (stable
  and canary), on vLLM's port, pointing at the pool's endpoint picker (EPP) Service. Its labels
  carry the plan's ``max-model-len`` and block size, so a router or a person can see which
  pool holds which requests;
- the endpoint picker's Deployment and Service (``operator/routing/endpoint_picker.py``);
- the endpoint picker's configuration (``EndpointPickerConfig``, in a ConfigMap the EPP reads
  with ``--config-file``), in which the prefix-cache-aware scorer hashes prompts in blocks of
  **the plan's block size** with auto-tuning off, matches at most the plan's ``max-model-len``
  tokens and sizes its per-server LRU index to the plan's number of KV blocks. A scorer whose
  block size differs from vLLM's hashes different boundaries than vLLM caches: its hit
  predictions, and so the prefix cache's use, are wasted. All are rendered from the same
  plan in the same reconcile, so a plan change moves the scorer's block size in the same
  rollout (and restarts the EPP, which reads its configuration only at start).

The plugin names and parameters are those of gateway-api-inference-extension v1.5.0
(``pkg/epp/framework/plugins``: ``approx-prefix-cache-producer``'s ``blockSizeTokens``,
``autoTune``, ``maxPrefixTokensToMatch``, ``lruCapacityPerServer``; ``prefix-cache-scorer``,
``queue-scorer``, ``kv-cache-utilization-scorer``, ``max-score-picker``).
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from kvtune.operator.api.names import LABEL_DEPLOYMENT, LABEL_POOL, VLLM_PORT, object_name
from kvtune.operator.routing import endpoint_picker
from kvtune.tuner.plan import PoolPlan

GIE_VERSION = endpoint_picker.GIE_VERSION
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"
EPP_CONFIG_API = "inference.networking.x-k8s.io/v1alpha1"
EPP_PORT = endpoint_picker.GRPC_PORT
EPP_CONFIG_KEY = "epp-config.yaml"
LABEL_MAX_MODEL_LEN = "kvtune.io/max-model-len"
LABEL_BLOCK_SIZE = "kvtune.io/block-size"
ANNOTATION_SCORER_WEIGHTS = "kvtune.io/scorer-weights"

# The Inference Extension's default weights (its chart): prefix 3, queue 2, KV usage 2. With
# little prefix reuse in the traffic, the prefix scorer only adds noise to load balancing.
_PREFIX_WEIGHT_SHARED = 3
_PREFIX_WEIGHT_LOW_REUSE = 1
_LOW_REUSE_HIT_RATE = 0.1


# Multi-turn traffic: keep a request on the pods holding at least 80% of its prefix (the
# filter's default threshold), exploring elsewhere 1% of the time so other pods warm up
# (pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity, v1.5.0).
AFFINITY_FILTER = "prefix-cache-affinity-filter"
AFFINITY_PARAMETERS = {"affinityThreshold": 0.8, "explorationProbability": 0.01}


# Set by the chart's routing.enabled: the cluster serves the Inference Extension's CRDs.
ROUTING_ENV = "KVTUNE_ROUTING"


def operator_enabled() -> bool:
    return os.environ.get(ROUTING_ENV, "").lower() in ("1", "true", "yes")


def epp_name(name: str, pool: str) -> str:
    """The pool's endpoint picker (its Service and its configuration ConfigMap)."""
    return object_name(name, f"{pool}-epp")


def prefix_weight(prefix_hit_rate: float | None) -> tuple[int, str]:
    """The prefix-cache scorer's weight and why."""
    if prefix_hit_rate is not None and prefix_hit_rate < _LOW_REUSE_HIT_RATE:
        return _PREFIX_WEIGHT_LOW_REUSE, (
            f"prefix hit rate {prefix_hit_rate:.0%} < {_LOW_REUSE_HIT_RATE:.0%}: prefix "
            f"weight {_PREFIX_WEIGHT_LOW_REUSE} (load balancing matters more)")
    seen = "unknown" if prefix_hit_rate is None else f"{prefix_hit_rate:.0%}"
    return _PREFIX_WEIGHT_SHARED, (f"prefix hit rate {seen}: prefix weight "
                                   f"{_PREFIX_WEIGHT_SHARED}, the Inference Extension's default")


def epp_config(pool_plan: PoolPlan, *, prefix_hit_rate: float | None = None,
               multi_turn: bool = False) -> dict[str, Any]:
    """The endpoint picker's configuration for one pool's plan. With multi-turn traffic the
    ``prefix-cache-affinity-filter`` first narrows the candidates to the pods that hold most
    of the request's prefix (a conversation's history is its prefix, so a session stays where
    its KV blocks are), then the load scorers pick among them; with none above the threshold
    it keeps all (v1.5.0 has no scorer keyed on a session header: see ``http_route``)."""
    plan = pool_plan.plan
    weight, _ = prefix_weight(prefix_hit_rate)
    producer: dict[str, Any] = {
        "autoTune": False,
        "blockSizeTokens": plan.block_size,
        "maxPrefixTokensToMatch": plan.max_model_len,
    }
    blocks = pool_plan.expected.num_gpu_blocks
    if blocks > 0:
        producer["lruCapacityPerServer"] = blocks
    plugins: list[dict[str, Any]] = [
        {"type": "approx-prefix-cache-producer", "parameters": producer},
        {"type": "prefix-cache-scorer"},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "max-score-picker"},
    ]
    profile: list[dict[str, Any]] = [
        {"pluginRef": "prefix-cache-scorer", "weight": weight},
        {"pluginRef": "queue-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "max-score-picker"},
    ]
    if multi_turn:
        plugins.insert(1, {"type": AFFINITY_FILTER, "parameters": AFFINITY_PARAMETERS})
        profile.insert(0, {"pluginRef": AFFINITY_FILTER})
    return {
        "apiVersion": EPP_CONFIG_API,
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}],
    }


def routing_objects(*, name: str, namespace: str, pool: str, pool_plan: PoolPlan,
                    labels: dict[str, str], prefix_hit_rate: float | None = None,
                    multi_turn: bool = False) -> list[dict[str, Any]]:
    """The pool's InferencePool, its endpoint picker's ConfigMap, Deployment and Service."""
    plan = pool_plan.plan
    pool_name = object_name(name, pool)
    picker = epp_name(name, pool)
    meta_labels = {**labels, LABEL_MAX_MODEL_LEN: str(plan.max_model_len),
                   LABEL_BLOCK_SIZE: str(plan.block_size)}
    _, why = prefix_weight(prefix_hit_rate)
    inference_pool = {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": {"name": pool_name, "namespace": namespace, "labels": meta_labels},
        "spec": {
            # Stable and canary pods alike: both serve the pool's traffic.
            "selector": {"matchLabels": {LABEL_DEPLOYMENT: name, LABEL_POOL: pool}},
            "targetPorts": [{"number": VLLM_PORT}],
            # The CRD's defaults, written out: what the server holds equals what kvtune
            # renders, so Argo CD and kvtune's own diff see no drift.
            "appProtocol": "http",
            "endpointPickerRef": {"group": "", "kind": "Service", "name": picker,
                                  "port": {"number": EPP_PORT}, "failureMode": "FailOpen"},
        },
    }
    config_text = yaml.safe_dump(epp_config(pool_plan, prefix_hit_rate=prefix_hit_rate,
                                            multi_turn=multi_turn), sort_keys=False)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": picker, "namespace": namespace, "labels": meta_labels,
                     "annotations": {ANNOTATION_SCORER_WEIGHTS: why}},
        "data": {EPP_CONFIG_KEY: config_text},
    }
    return [inference_pool, config_map,
            endpoint_picker.deployment(picker=picker, namespace=namespace, pool_name=pool_name,
                                       labels=meta_labels, config_key=EPP_CONFIG_KEY,
                                       config_text=config_text),
            endpoint_picker.service(picker=picker, namespace=namespace, labels=meta_labels)]
