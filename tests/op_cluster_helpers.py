"""Helpers of the operator's integration tests: the operator as a real subprocess
(`kvtune operator`), CRD installation, and waiting for a condition (never a fixed sleep)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from waiting import wait_for

from kvtune.e2e.operator_command import operator_executable
from kvtune.e2e.prometheus import free_port

REPO = Path(__file__).resolve().parents[1]
CRD_PATH = REPO / "crds" / "inferencedeployments.kvtune.io.yaml"
GROUP, VERSION, PLURAL = "kvtune.io", "v1alpha1", "inferencedeployments"


def install_crd(api_client: Any, path: Path = CRD_PATH) -> None:
    """Create (or replace) the CRD in ``path`` and wait until it is established."""
    ext = client.ApiextensionsV1Api(api_client)
    crd = yaml.safe_load(path.read_text())
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(crd["metadata"]["name"])
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)

    def established() -> bool:
        got = ext.read_custom_resource_definition(crd["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True"
                   for c in got.status.conditions or [])

    wait_for(established, f"the CRD {crd['metadata']['name']} to be established", 30)


def ensure_namespace(api_client: Any, name: str) -> None:
    core = client.CoreV1Api(api_client)
    try:
        core.create_namespace({"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise


class OperatorProcess:
    """`kvtune operator` in a subprocess, serving only the given namespaces (other tests may
    run their own operator on the same cluster)."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.kubeconfig, self.namespaces, self.log = kubeconfig, namespaces, log
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = free_port()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> None:
        self.starts += 1
        argv = [str(operator_executable()), "operator",
                "--kubeconfig", str(self.kubeconfig), "--standalone",
                "--metrics-port", str(self.metrics_port)]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        with self.log.open("a") as out:
            out.write(f"\n=== start #{self.starts} ===\n")
        self.proc = subprocess.Popen(argv, stdout=self.log.open("a"), stderr=subprocess.STDOUT,
                                     cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                    "KVTUNE_CONFIGMAP_RESYNC_SECONDS": "2",
                                                    # Prometheus on loopback only.
                                                    "KVTUNE_PROMETHEUS_ALLOWED_URLS":
                                                        "http://127.0.0.1:*", **self.env})

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """kill -9: no cleanup, no kopf shutdown (what a node failure or an OOM kill does)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def current_log(self) -> str:
        """The log since the last start."""
        return self.log_text().rsplit(f"=== start #{self.starts} ===", 1)[-1]


def get_infd(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name)
    return got


def create_infd(api_client: Any, namespace: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
         "metadata": {"name": name, "namespace": namespace}, "spec": spec})


def patch_spec(api_client: Any, namespace: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": spec},
        _content_type="application/merge-patch+json")


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return None


def create_runtime_access(api_client: Any, namespace: str) -> None:
    """What the chart creates in a runtime namespace (spec.runtime.entrypoint: kvtune): the
    ServiceAccount kvtune-runtime, the reports ConfigMap, its Role and RoleBinding
    (operator/render/runtime_access.py); the runtime pods cannot start without them."""
    from kvtune.operator.render import runtime_access

    create_objects(api_client, runtime_access.namespace_objects(namespace))


def service_account_token(api_client: Any, namespace: str, sa: str) -> str:
    """A short-lived token of ServiceAccount ``namespace/sa`` (the TokenRequest API), as the
    kubelet mounts it into the account's pods."""
    got = client.CoreV1Api(api_client).create_namespaced_service_account_token(
        sa, namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)))
    return str(got.status.token)


def service_account_config(api_client: Any, kubeconfig: Path, namespace: str,
                           sa: str) -> dict[str, Any]:
    """A kubeconfig (as a dict) that authenticates as ServiceAccount ``namespace/sa`` by a
    TokenRequest token, on ``kubeconfig``'s cluster."""
    cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": sa, "user": {"token": service_account_token(
            api_client, namespace, sa)}}],
        "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa}}],
        "current-context": sa,
    }


def service_account_kubeconfig(api_client: Any, kubeconfig: Path, namespace: str, sa: str,
                               path: Path) -> Path:
    """``service_account_config`` written to ``path`` (for a `kvtune operator` process)."""
    path.write_text(yaml.safe_dump(service_account_config(api_client, kubeconfig, namespace,
                                                          sa)))
    path.chmod(0o600)
    return path


def service_account_client(api_client: Any, kubeconfig: Path, namespace: str, sa: str) -> Any:
    """An ApiClient authenticated as ServiceAccount ``namespace/sa``, as its pod would be."""
    from kubernetes import config as kube_config

    return kube_config.new_client_from_config_dict(
        service_account_config(api_client, kubeconfig, namespace, sa))


def cluster_ca_pem(kubeconfig: Path) -> bytes:
    """The cluster's CA certificate (PEM) from ``kubeconfig``."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    return base64.b64decode(cfg["clusters"][0]["cluster"]["certificate-authority-data"])


def service_account_dir(api_client: Any, kubeconfig: Path, namespace: str, sa: str,
                        path: Path) -> Path:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount for a pod of
    ServiceAccount ``namespace/sa``: ``token``, ``namespace`` and ``ca.crt``, in ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "token").write_text(service_account_token(api_client, namespace, sa))
    (path / "namespace").write_text(namespace)
    (path / "ca.crt").write_bytes(cluster_ca_pem(kubeconfig))
    return path


def prepare_namespaces(local_cluster: Any, *namespaces: str,
                       runtime_access: tuple[str, ...] = ()) -> Any:
    """The usual module fixture: an admin ApiClient, the InferenceDeployment CRD installed,
    ``namespaces`` created, and in ``runtime_access`` what the chart creates there for
    entrypoint kvtune's pods (``create_runtime_access``)."""
    api = local_cluster.api_client()
    install_crd(api)
    for ns in namespaces:
        ensure_namespace(api, ns)
    for ns in runtime_access:
        create_runtime_access(api, ns)
    return api


class PeeringReplica:
    """One `kvtune operator --peering` process: a stand-in for one pod of the chart's
    Deployment (``argv`` is its whole command line)."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1",
                                              **(env or {})})

    def text(self) -> str:
        return self.log.read_text()

    def active(self) -> bool:
        """kopf starts paused and logs each change: "Resuming operations" when it may
        handle objects, "Pausing operations" when a peer of higher priority appears."""
        state = False
        for line in self.text().splitlines():
            if "Resuming operations" in line:
                state = True
            elif "Pausing operations" in line or "Pausing all operators" in line:
                state = False
        return state

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def create_objects(api_client: Any, objects: list[dict[str, Any]]) -> None:
    """Create ServiceAccounts, Roles and RoleBindings (what a chart would), in order; one that
    exists is left as it is."""
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    create = {"ServiceAccount": core.create_namespaced_service_account,
              "ConfigMap": core.create_namespaced_config_map,
              "Role": rbac.create_namespaced_role,
              "RoleBinding": rbac.create_namespaced_role_binding}
    for obj in objects:
        try:
            create[obj["kind"]](obj["metadata"]["namespace"], obj)
        except ApiException as exc:
            if exc.status != 409:
                raise


def write_termination_message(api_client: Any, namespace: str, pod: str, message: str) -> None:
    """The kubelet's part for a Job's pod under kwok (which runs no container): once kwok has
    ended the pod, its container's termination message is the file the command wrote."""
    core = client.CoreV1Api(api_client)

    def ended() -> Any:
        got = core.read_namespaced_pod(pod, namespace)
        return got if got.status.phase == "Succeeded" else None

    current = wait_for(ended, f"kwok to end pod {namespace}/{pod}", 60)
    statuses = api_client.sanitize_for_serialization(current.status.container_statuses)
    for status in statuses:
        status["state"]["terminated"]["message"] = message
    core.patch_namespaced_pod_status(pod, namespace, {"status": {"containerStatuses": statuses}})
