"""The endpoint picker (EPP) of one pool: its Deployment and Service, and the access it runs with.

The Gateway API Inference Extension's gateway asks a pool's EPP (over Envoy's ext-proc gRPC)
which pod serves each request. kvtune renders, per pool, what the Extension's own
``inferencepool`` chart renders for it (v1.5.0, ``config/charts/epplib``): a Deployment of
the ``epp`` image reading the pool's configuration (``routing.epp_config``, mounted from the
ConfigMap) and watching the pool's InferencePool, and a Service on the ext-proc port that the
InferencePool's ``endpointPickerRef`` names. Choices that differ from that chart, and why:

- The EPP reads its configuration only at start, so the pod template carries the
  configuration's hash: a new plan (a new scorer block size) restarts the EPP in the same
  apply, which the ``Recreate`` strategy (the chart's) makes a replacement, not a second EPP.
- ``--metrics-endpoint-auth=false``: authenticating scrapers needs ``create`` on TokenReviews
  and SubjectAccessReviews, which are cluster-scoped; kvtune grants nothing cluster-wide
  (issue 11). The metrics port serves counters only, inside the cluster.
- The pods carry only the ``kvtune.io/endpoint-picker`` label, never the pool's selector
  labels: the InferencePool, the vLLM Service, the PDB and the PodMonitor select on those,
  and must not take the EPP for a model server.
- The pod meets the ``restricted`` Pod Security level (the image is distroless, non-root).

The EPP runs as the ServiceAccount ``kvtune-endpoint-picker``. Its Role (``namespace_objects``)
is what the Extension's chart grants: get/list/watch on pods, on InferencePools and on the
alpha InferenceObjectives and InferenceModelRewrites it also watches. The Helm chart creates
it in every runtime namespace when ``routing.enabled`` (templates/endpoint-picker-access.yaml,
compared with ``namespace_objects`` by tests/chart/test_chart.py), so the operator creates
no RBAC object and needs no right on pods beyond its own ``list``.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

GIE_VERSION = "v1.5.0"
IMAGE_ENV = "KVTUNE_EPP_IMAGE"  # set by the chart's routing.endpointPicker.image
DEFAULT_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{GIE_VERSION}"
SERVICE_ACCOUNT = "kvtune-endpoint-picker"
ROLE = "kvtune-endpoint-picker"
LABEL_PICKER = "kvtune.io/endpoint-picker"
ANNOTATION_CONFIG_HASH = "kvtune.io/epp-config-hash"
POOL_GROUP = "inference.networking.k8s.io"
GRPC_PORT = 9002  # ext-proc, what the gateway calls
HEALTH_PORT = 9003  # gRPC health: SERVING once the InferencePool is read
METRICS_PORT = 9090
HEALTH_SERVICE = "inference-extension"  # the service name a single-replica EPP answers for
CONFIG_DIR = "/config"
# The Extension's chart: the longest grace period of the pool's pods, so requests in flight
# through this EPP finish before it goes.
TERMINATION_GRACE_SECONDS = 130
# The Extension's chart defaults, validated there by scale tests at high QPS (p90 scheduling
# under 100 ms); no CPU limit so scheduling spikes can burst. The chart's
# routing.endpointPicker.resources (the same default) replaces them.
RESOURCES: dict[str, Any] = {"requests": {"cpu": "4", "memory": "8Gi"},
                             "limits": {"memory": "16Gi"}}
RESOURCES_ENV = "KVTUNE_EPP_RESOURCES"
_RBAC = "rbac.authorization.k8s.io"


def image() -> str:
    return os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def resources() -> dict[str, Any]:
    """The pickers' container resources: the chart's ``routing.endpointPicker.resources``."""
    text = os.environ.get(RESOURCES_ENV)
    if not text:
        return RESOURCES
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{RESOURCES_ENV}={text[:80]!r} is not a JSON object; set the chart "
                         f"value routing.endpointPicker.resources (requests/limits)")
    return value


def config_hash(config_text: str) -> str:
    return hashlib.sha256(config_text.encode()).hexdigest()[:16]


def args(*, pool_name: str, namespace: str, config_key: str) -> list[str]:
    """The EPP's command line (its flags in v1.5.0: pkg/epp/server/options.go)."""
    return [
        "--pool-name", pool_name,
        "--pool-namespace", namespace,
        "--pool-group", POOL_GROUP,
        "--config-file", f"{CONFIG_DIR}/{config_key}",
        "--grpc-port", str(GRPC_PORT),
        "--grpc-health-port", str(HEALTH_PORT),
        "--metrics-port", str(METRICS_PORT),
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--zap-encoder", "json",
    ]


def deployment(*, picker: str, namespace: str, pool_name: str, labels: dict[str, str],
               config_key: str, config_text: str) -> dict[str, Any]:
    """The EPP's Deployment for the InferencePool ``pool_name``, reading ConfigMap ``picker``."""
    pod_labels = {LABEL_PICKER: picker}
    probe = {"grpc": {"port": HEALTH_PORT, "service": HEALTH_SERVICE}}
    container = {
        "name": "epp",
        "image": image(),
        "imagePullPolicy": "IfNotPresent",
        "args": args(pool_name=pool_name, namespace=namespace, config_key=config_key),
        "ports": [{"name": "grpc", "containerPort": GRPC_PORT},
                  {"name": "grpc-health", "containerPort": HEALTH_PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "livenessProbe": {**probe, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**probe, "periodSeconds": 2},
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "resources": resources(),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": picker, "namespace": namespace,
                     "labels": {**labels, LABEL_PICKER: picker}},
        "spec": {
            "replicas": 1,
            # One active EPP: its prefix index is per process. Recreate replaces it at once
            # (a rolling update would run two, each with half the index).
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels,
                             "annotations": {ANNOTATION_CONFIG_HASH: config_hash(config_text)}},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "automountServiceAccountToken": True,
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "securityContext": {"runAsNonRoot": True,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": picker}}],
                },
            },
        },
    }


def service(*, picker: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """The Service the InferencePool's ``endpointPickerRef`` names (ext-proc and metrics)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": picker, "namespace": namespace,
                     "labels": {**labels, LABEL_PICKER: picker}},
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_PICKER: picker},
            "ports": [
                {"name": "grpc-ext-proc", "protocol": "TCP", "port": GRPC_PORT,
                 "targetPort": GRPC_PORT},
                {"name": "http-metrics", "protocol": "TCP", "port": METRICS_PORT,
                 "targetPort": METRICS_PORT},
            ],
        },
    }


def namespace_objects(namespace: str, labels: dict[str, str] | None = None
                      ) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding the EPPs of one namespace run with (created by the
    chart, in this order). Read-only, namespaced: what the Extension's chart grants its EPP
    (config/charts/inferencepool/templates/rbac.yaml and epplib/templates/_rbac.yaml)."""
    def meta(name: str) -> dict[str, Any]:
        return {"name": name, "namespace": namespace, "labels": dict(labels or {})}

    read = ["get", "list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(SERVICE_ACCOUNT),
         "automountServiceAccountToken": True},
        {"apiVersion": f"{_RBAC}/v1", "kind": "Role", "metadata": meta(ROLE),
         "rules": [
             {"apiGroups": [""], "resources": ["pods"], "verbs": read},
             {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
             {"apiGroups": ["inference.networking.x-k8s.io"],
              "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": read},
         ]},
        {"apiVersion": f"{_RBAC}/v1", "kind": "RoleBinding", "metadata": meta(ROLE),
         "roleRef": {"apiGroup": _RBAC, "kind": "Role", "name": ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                       "namespace": namespace}]},
    ]
