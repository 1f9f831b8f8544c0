"""A real Kubernetes control plane on loopback with fake GPU node pools.

``LocalCluster`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler (all built
from source at pinned versions by ``e2e/build-binaries.sh``) and kwok, which plays the kubelet
for fake nodes: the real scheduler places pods on them and kwok marks the pods Running and
Ready. Nothing runs in the pods (there is no container runtime), so this tests what an
operator does with the API, not what a workload does on a GPU.

    with LocalCluster(state_dir) as cluster:        # up() ... down(), even on error
        core = kubernetes.client.CoreV1Api(cluster.api_client())

Every port is on 127.0.0.1 and, unless given, chosen free by binding it first. Every wait is a
poll for a condition (health endpoints, the default ServiceAccount, Ready nodes) with a
deadline, and a component that exits while we wait fails the wait at once, quoting its log.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from pydantic import BaseModel

from kvtune.e2e import binaries, gpu_nodes, pki
from kvtune.e2e.errors import ClusterError, log_tail
from kvtune.e2e.gpu_nodes import NodePool
from kvtune.e2e.processes import ProcessRecord, Supervisor, is_running

KWOK_STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
STATE_FILE = "cluster.json"
SERVICE_CIDR = "10.0.0.0/24"
# The controller-manager's and scheduler's request rate to the API server (None: their
# defaults, 20 and 50 per second). bench/scale.py raises it: at the default, the Deployment
# and ReplicaSet controllers alone need minutes to create 1,000 ReplicaSets and pods.
CONTROL_PLANE_QPS: int | None = None
POD_CIDR = "10.244.0.0/16"
PORT_NAMES = (
    "etcd-client", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler"
)


# What the kubernetes client raises while the apiserver is still starting (not yet serving a
# resource, connection refused): worth another poll, unlike a bug in our own code.
_START_ATTEMPTS = 3
_PORT_TAKEN = "is already in use by another process"
_TRANSIENT_ERRORS = frozenset({"ApiException", "MaxRetryError", "ProtocolError"})


def default_state_dir() -> Path:
    return binaries.cache_dir() / "cluster"


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now, all distinct (every socket stays bound until all are)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class ClusterState(BaseModel):
    """What ``cluster.json`` in the state directory records, for ``status`` and ``down``."""

    state_dir: Path
    kubeconfig: Path
    server: str
    ports: dict[str, int]
    pools: list[dict[str, Any]]
    processes: list[ProcessRecord]
    started_at: float
    ready_seconds: float | None = None


class ComponentStatus(BaseModel):
    component: str
    pid: int
    running: bool
    log_path: Path


class ClusterStatus(BaseModel):
    state_dir: Path
    kubeconfig: Path | None
    server: str | None
    components: list[ComponentStatus]
    apiserver_ready: bool
    nodes_ready: dict[str, str]  # gpu class -> "ready/total"

    @property
    def running(self) -> bool:
        return bool(self.components) and all(c.running for c in self.components)


def _qps_args() -> list[str]:
    if CONTROL_PLANE_QPS is None:
        return []
    return [f"--kube-api-qps={CONTROL_PLANE_QPS}", f"--kube-api-burst={2 * CONTROL_PLANE_QPS}"]


class LocalCluster:
    def __init__(
        self,
        state_dir: Path | None = None,
        pools: tuple[NodePool, ...] = gpu_nodes.DEFAULT_POOLS,
        *,
        detached: bool = False,
        ports: dict[str, int] | None = None,
        executables: dict[str, Path] | None = None,
        start_timeout_seconds: float = 240.0,
    ) -> None:
        """``detached``: leave the processes running when this Python process exits (the CLI);
        otherwise they are tied to it. ``ports`` and ``executables`` override the free-port
        choice and the built binaries per component (the failure tests use both)."""
        self.state_dir = Path(state_dir or default_state_dir()).resolve()
        self.pools = pools
        self.detached = detached
        self.ports = dict(ports or {})
        self.executables = dict(executables or {})
        self.start_timeout_seconds = start_timeout_seconds
        self.supervisor = Supervisor(self.state_dir / "logs", die_with_parent=not detached)
        self.ready_seconds: float | None = None
        self._started_at = 0.0

    # -- paths -----------------------------------------------------------------------------

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    def log_path(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for the admin user (system:masters)."""
        from kubernetes import config as kube_config

        # kubernetes' config loaders carry no annotations.
        return kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig_path))

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    def up(self) -> LocalCluster:
        """Start everything and return once the fake GPU nodes are Ready; on any failure stop
        what was started and raise :class:`ClusterError` naming the component."""
        self._refuse_if_running()
        self._started_at = time.monotonic()
        given_ports = dict(self.ports)
        exe = self._executables()
        for attempt in range(1, _START_ATTEMPTS + 1):
            # A port found free can be taken by another process before our component binds
            # it; only then, and only for ports we chose ourselves, try again with new ones.
            self.ports = dict(given_ports)
            try:
                self._start_all(exe, first_attempt=attempt == 1)
                break
            except ClusterError as error:
                taken = error.component != "kwok" and _PORT_TAKEN in error.reason
                ours = not any(f":{port}" in error.reason for port in given_ports.values())
                if not (taken and ours) or attempt == _START_ATTEMPTS:
                    raise
        if self.detached:
            self.supervisor.detach()
        return self

    def _start_all(self, exe: dict[str, Path], first_attempt: bool) -> None:
        try:
            self._prepare_state_dir(keep_logs=not first_attempt)
            ports = free_ports(len(PORT_NAMES))
            for name, port in zip(PORT_NAMES, ports, strict=True):
                self.ports.setdefault(name, port)
            certs = pki.generate(self.state_dir / "pki")
            self._write_kubeconfig(certs)
            self._start_etcd(exe["etcd"])
            self._start_apiserver(exe["kube-apiserver"], certs)
            self._start_controller_manager(exe["kube-controller-manager"], certs)
            self._start_scheduler(exe["kube-scheduler"])
            self._start_kwok(exe["kwok"])
            self._create_nodes()
            self.ready_seconds = time.monotonic() - self._started_at
            self._save_state()
        except BaseException:
            self.supervisor.stop_all()
            (self.state_dir / STATE_FILE).unlink(missing_ok=True)
            raise

    def down(self) -> None:
        """Stop every process of this cluster (ours, or those recorded in the state dir)."""
        if not self.supervisor.records:
            state = self._load_state()
            if state is not None:
                self.supervisor = Supervisor.adopt(self.state_dir / "logs", state.processes)
        self.supervisor.stop_all()
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    def restart_apiserver(self) -> None:
        """Stop the API server and start it again on the same port and state; returns once
        it is ready (clients reconnect; watches are re-established by their owners)."""
        self.supervisor.restart("kube-apiserver")
        self._save_state()
        self._wait("kube-apiserver", "ready again (/readyz)", self._apiserver_ready)

    def status(self) -> ClusterStatus:
        state = self._load_state()
        if state is None:
            return ClusterStatus(
                state_dir=self.state_dir, kubeconfig=None, server=None, components=[],
                apiserver_ready=False, nodes_ready={},
            )
        self.ports = dict(state.ports)
        components = [
            ComponentStatus(
                component=r.component, pid=r.pid, running=is_running(r), log_path=r.log_path
            )
            for r in state.processes
        ]
        apiserver_ready = self._apiserver_ready()
        nodes_ready: dict[str, str] = {}
        if apiserver_ready:
            nodes_ready = self.nodes_ready_by_pool()
        return ClusterStatus(
            state_dir=self.state_dir, kubeconfig=state.kubeconfig, server=state.server,
            components=components, apiserver_ready=apiserver_ready, nodes_ready=nodes_ready,
        )

    def nodes_ready_by_pool(self) -> dict[str, str]:
        from kubernetes import client

        with self.api_client() as api:
            nodes = client.CoreV1Api(api).list_node(label_selector=gpu_nodes.POOL_LABEL).items
        counts: dict[str, list[int]] = {}
        for node in nodes:
            labels = (node.metadata.labels if node.metadata else None) or {}
            pool = labels[gpu_nodes.POOL_LABEL]
            conditions = (node.status.conditions if node.status else None) or []
            ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            entry = counts.setdefault(pool, [0, 0])
            entry[0] += int(ready)
            entry[1] += 1
        return {pool: f"{ready}/{total}" for pool, (ready, total) in sorted(counts.items())}

    # -- steps -----------------------------------------------------------------------------

    def _refuse_if_running(self) -> None:
        state = self._load_state()
        if state is not None and any(is_running(r) for r in state.processes):
            raise ClusterError(
                "local cluster",
                f"a cluster is already running from {self.state_dir} (kube-apiserver at "
                f"{state.server}); run `kvtune cluster down --state-dir {self.state_dir}` first "
                "or choose another --state-dir",
                self.state_dir / "logs",
            )

    def _executables(self) -> dict[str, Path]:
        missing = [
            name
            for name, component in binaries.COMPONENTS.items()
            if name != "helm" and not all(exe in self.executables for exe in component.executables)
        ]
        built = binaries.ensure_built(missing) if missing else {}
        return {**built, **self.executables}

    def _prepare_state_dir(self, keep_logs: bool) -> None:
        # A fresh cluster each time: old etcd data would resurrect old nodes and objects.
        # A retry keeps the logs, which then tell both attempts.
        for sub in ("etcd", "pki", "certs") if keep_logs else ("etcd", "logs", "pki", "certs"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)

    def _write_kubeconfig(self, certs: pki.PKI) -> None:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kvtune-local", "cluster": {
                "server": self.server, "certificate-authority-data": b64(certs.ca_cert)}}],
            "users": [{"name": "kvtune-admin", "user": {
                "client-certificate-data": b64(certs.admin_cert),
                "client-key-data": b64(certs.admin_key)}}],
            "contexts": [{"name": "kvtune-local", "context": {
                "cluster": "kvtune-local", "user": "kvtune-admin", "namespace": "default"}}],
            "current-context": "kvtune-local",
        }
        self.kubeconfig_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig_path.chmod(0o600)

    def _start(self, component: str, argv: list[str]) -> None:
        self.supervisor.start(component, argv)
        self._save_state()  # so that `cluster down` can stop a half-started cluster

    def _start_etcd(self, exe: Path) -> None:
        client_url = f"http://127.0.0.1:{self.ports['etcd-client']}"
        peer_url = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._start("etcd", [
            str(exe), "--name=kvtune", f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=kvtune={peer_url}", "--initial-cluster-state=new",
            # A throw-away cluster: durability costs seconds per write on a busy disk.
            "--unsafe-no-fsync", "--log-level=warn",
        ])
        self._wait(
            "etcd", "healthy", lambda: b'"health":"true"' in _http_get(f"{client_url}/health")
        )

    def _start_apiserver(self, exe: Path, certs: pki.PKI) -> None:
        port = self.ports["kube-apiserver"]
        self._start("kube-apiserver", [
            str(exe),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd-client']}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--advertise-address=127.0.0.1",
            # A loopback advertise address breaks the `kubernetes` Endpoints reconciler.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.state_dir / 'certs' / 'kube-apiserver'}",
            f"--tls-cert-file={certs.apiserver_cert}",
            f"--tls-private-key-file={certs.apiserver_key}",
            f"--client-ca-file={certs.ca_cert}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer=https://127.0.0.1:{port}",
            f"--service-account-key-file={certs.service_account_key}",
            f"--service-account-signing-key-file={certs.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true", "--profiling=false",
        ])
        self._wait("kube-apiserver", "ready (/readyz)", self._apiserver_ready)

    def _start_controller_manager(self, exe: Path, certs: pki.PKI) -> None:
        port = self.ports["kube-controller-manager"]
        kubeconfig = str(self.kubeconfig_path)
        self._start("kube-controller-manager", [
            str(exe), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.state_dir / 'certs' / 'kube-controller-manager'}",
            f"--service-account-private-key-file={certs.service_account_key}",
            f"--root-ca-file={certs.ca_cert}", "--use-service-account-credentials=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}", *_qps_args(),
        ])
        self._wait("kube-controller-manager", "healthy (/healthz)",
                   lambda: _https_ok(f"https://127.0.0.1:{port}/healthz"))
        # Pods are refused until their namespace's `default` ServiceAccount exists: the
        # serviceaccount controller creating it is the sign that the controllers really run.
        self._wait("kube-controller-manager", "creating the default ServiceAccount",
                   self._default_service_account_exists)

    def _start_scheduler(self, exe: Path) -> None:
        port = self.ports["kube-scheduler"]
        kubeconfig = str(self.kubeconfig_path)
        self._start("kube-scheduler", [
            str(exe), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.state_dir / 'certs' / 'kube-scheduler'}", *_qps_args(),
        ])
        self._wait("kube-scheduler", "healthy (/healthz)",
                   lambda: _https_ok(f"https://127.0.0.1:{port}/healthz"))

    def _start_kwok(self, exe: Path) -> None:
        config = self.state_dir / "kwok.yaml"
        shutil.copyfile(KWOK_STAGES, config)
        # No --node-port / --server-address: kwok would listen on all addresses.
        self._start("kwok", [
            str(exe), f"--kubeconfig={self.kubeconfig_path}", f"--config={config}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector="
            f"{gpu_nodes.KWOK_ANNOTATION}={gpu_nodes.KWOK_ANNOTATION_VALUE}",
            f"--cidr={POD_CIDR}", "--node-ip=10.0.1.1", "--node-lease-duration-seconds=40",
        ])

    def _create_nodes(self) -> None:
        from kubernetes import client

        manifests = gpu_nodes.manifests(self.pools)
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            for manifest in manifests:
                core.create_node(body=manifest)  # type: ignore[arg-type]  # a dict is sent as is
        total = len(manifests)

        def all_ready() -> bool:
            counts = self.nodes_ready_by_pool()
            return sum(int(v.split("/")[0]) for v in counts.values()) == total

        self._wait("kwok", f"marking the {total} fake GPU nodes Ready", all_ready)

    # -- waiting ---------------------------------------------------------------------------

    def _wait(self, component: str, what: str, probe: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout_seconds
        while True:
            self.supervisor.raise_if_exited()
            try:
                if probe():
                    return
            except (OSError, urllib.error.URLError, ssl.SSLError):
                pass  # not listening yet
            except Exception as error:  # the kubernetes client's ApiException and friends
                if type(error).__name__ not in _TRANSIENT_ERRORS:
                    raise
            if time.monotonic() > deadline:
                log = self.log_path(component)
                raise ClusterError(
                    component,
                    f"not {what} after {self.start_timeout_seconds:.0f}s: {log_tail(log, 6)}",
                    log,
                )
            time.sleep(0.2)  # poll interval, not a wait for time to pass

    def _apiserver_ready(self) -> bool:
        certs = pki.load(self.state_dir / "pki")
        context = ssl.create_default_context(cafile=str(certs.ca_cert))
        context.load_cert_chain(str(certs.admin_cert), str(certs.admin_key))
        try:
            body = _http_get(f"{self.server}/readyz", context)
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False
        return body.strip() == b"ok"

    def _default_service_account_exists(self) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with self.api_client() as api:
            try:
                client.CoreV1Api(api).read_namespaced_service_account("default", "default")
            except ApiException as error:
                if error.status == 404:
                    return False
                raise
        return True

    # -- state file ------------------------------------------------------------------------

    def _save_state(self) -> None:
        state = ClusterState(
            state_dir=self.state_dir,
            kubeconfig=self.kubeconfig_path,
            server=self.server,
            ports=self.ports,
            pools=[vars(pool) for pool in self.pools],
            processes=self.supervisor.records,
            started_at=time.time(),
            ready_seconds=self.ready_seconds,
        )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / STATE_FILE).write_text(state.model_dump_json(indent=2))

    def _load_state(self) -> ClusterState | None:
        path = self.state_dir / STATE_FILE
        if not path.is_file():
            return None
        return ClusterState.model_validate(json.loads(path.read_text()))

    @classmethod
    def from_state_dir(cls, state_dir: Path | None = None) -> LocalCluster:
        """The cluster recorded in ``state_dir`` (started by another process, e.g. the CLI)."""
        cluster = cls(state_dir, detached=True)
        state = cluster._load_state()
        if state is not None:
            cluster.ports = dict(state.ports)
            cluster.pools = tuple(NodePool(**pool) for pool in state.pools)
            cluster.ready_seconds = state.ready_seconds
        return cluster


def _http_get(url: str, context: ssl.SSLContext | None = None) -> bytes:
    with urllib.request.urlopen(url, timeout=5, context=context) as response:
        body: bytes = response.read()
        return body


def _https_ok(url: str) -> bool:
    # The controller-manager and scheduler serve /healthz with a self-signed certificate.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return _http_get(url, context).strip() == b"ok"
