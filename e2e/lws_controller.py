"""The LeaderWorkerSet controller manager (``sigs.k8s.io/lws`` ``cmd/``) against the local
control plane, so that a multi-node pool's groups are made by the real controller.

The binary is built by ``e2e/build-binaries.sh lws`` from the version ``e2e/gomod/lws/go.mod``
pins (the one kvtune renders for, ``operator/render/leader_worker_set.py: LWS_VERSION``) and
cached like the control plane's own. It runs on loopback only: leader election off, health
probes and (authenticated) metrics on free 127.0.0.1 ports, and its admission webhooks served
on 127.0.0.1 with a self-signed certificate instead of its internal cert management (which
writes a Secret for an in-cluster Service the API server could not reach here).

The webhooks matter: LWS's pod webhook is what labels each pod with its group and worker
index and puts ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX`` into its
containers (``pkg/webhooks/pod_webhook.go``), and kvtune's rendered command line relies on
those. They are registered from the release's own ``config/webhook/manifests.yaml``, with the
pod webhooks' object selector of its kustomize patches, each pointed at the local server by
URL and limited to the given namespaces (other tests on the shared cluster never meet a
webhook whose server is gone), and removed when the controller stops.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvtune.e2e.binaries import COMPONENTS, ensure_built, required_version
from kvtune.e2e.cluster import free_ports
from kvtune.e2e.errors import ClusterError
from kvtune.e2e.inference_extension import module_dir
from kvtune.e2e.processes import Supervisor
from kvtune.operator.render.leader_worker_set import LWS_MODULE

COMPONENT = "lws"
EXECUTABLE = "lws-controller"
WEBHOOK_MANIFESTS = Path("config") / "webhook" / "manifests.yaml"
# The label the controller puts on every pod of a set; the release's kustomize patches
# (config/webhook/*-patch.yaml) select the pod webhooks' objects by it.
SET_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# Prefixed so that a left-over registration is recognisably the tests'.
CONFIG_NAME_PREFIX = "kvtune-test-lws-"
_CERT_VALIDITY = datetime.timedelta(days=2)


def pinned_version() -> str:
    """The LWS release e2e/gomod/lws pins."""
    return required_version(COMPONENTS[COMPONENT])


def controller_binary() -> Path:
    """The controller manager, built by e2e/build-binaries.sh on first use."""
    return ensure_built([COMPONENT])[EXECUTABLE]


def write_serving_cert(directory: Path) -> bytes:
    """A self-signed certificate for 127.0.0.1 (``tls.crt``/``tls.key``, the names
    controller-runtime's webhook server reads from its cert dir); returns its PEM, which is
    also the CA bundle the API server verifies the webhook with."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lws-webhook-127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(now + _CERT_VALIDITY)
        # Its own trust anchor, so a CA certificate (Go refuses a non-CA root's leaf).
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (directory / "tls.crt").write_bytes(pem)
    key_path = directory / "tls.key"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return pem


def configuration(webhook_port: int, cert_dir: Path, health_port: int, metrics_port: int
                  ) -> dict[str, Any]:
    """LWS's own Configuration file (``api/config/v1alpha1``) for a loopback-only manager."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
    }


def webhook_configurations(manifests: str, base_url: str, ca_bundle: bytes,
                           namespaces: list[str]) -> list[dict[str, Any]]:
    """The release's webhook configurations, each webhook served at ``base_url`` + its path
    and limited to ``namespaces``; the pod webhooks only for pods of a set (as the release's
    kustomize patches select them)."""
    bundle = base64.b64encode(ca_bundle).decode()
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        doc["metadata"] = {"name": CONFIG_NAME_PREFIX + doc["metadata"]["name"]}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url + path, "caBundle": bundle}
            hook["namespaceSelector"] = {"matchExpressions": [{
                "key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(namespaces)}]}
            if any("pods" in rule.get("resources", []) for rule in hook["rules"]):
                hook["objectSelector"] = {"matchExpressions": [{
                    "key": SET_NAME_LABEL, "operator": "Exists"}]}
        out.append(doc)
    return out


def _tls_answers(port: int, ca_pem: bytes) -> bool:
    """Whether a TLS server on 127.0.0.1:``port`` presents the certificate we wrote."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1"):
            return True
    except OSError:
        return False


def _ready(port: int) -> bool:
    """Whether the manager's health endpoint answers ``/readyz`` with 200 (no proxy: loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


class LwsController:
    """The controller manager as a child process (killed with its parent), its webhooks
    registered for ``namespaces`` while it runs. ``with LwsController(...) as c:``."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], state_dir: Path,
                 start_timeout_seconds: float = 60.0) -> None:
        self.kubeconfig, self.namespaces = kubeconfig, list(namespaces)
        self.state_dir = state_dir
        self.start_timeout_seconds = start_timeout_seconds
        self.supervisor = Supervisor(state_dir / "logs", die_with_parent=True)
        self.registered: list[tuple[str, str]] = []  # (kind, name)

    @property
    def log_path(self) -> Path:
        return self.state_dir / "logs" / f"{COMPONENT}.log"

    def __enter__(self) -> LwsController:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start the manager, wait until its webhook server and health endpoint answer, then
        register its webhooks (so no admission waits on a server that is not up yet)."""
        webhook_port, health_port, metrics_port = free_ports(3)
        cert_dir = self.state_dir / "webhook-certs"
        ca_pem = write_serving_cert(cert_dir)
        config = self.state_dir / "lws-configuration.yaml"
        config.write_text(yaml.safe_dump(configuration(webhook_port, cert_dir, health_port,
                                                       metrics_port)))
        self.supervisor.start(COMPONENT, [
            str(controller_binary()), f"--config={config}", "--zap-log-level=info"],
            env={"KUBECONFIG": str(self.kubeconfig)})
        self._wait("its webhook server and /readyz",
                   lambda: _tls_answers(webhook_port, ca_pem) and _ready(health_port))
        manifests = (module_dir(pinned_version(), LWS_MODULE) / WEBHOOK_MANIFESTS).read_text()
        self._register(webhook_configurations(manifests, f"https://127.0.0.1:{webhook_port}",
                                              ca_pem, self.namespaces))

    def stop(self) -> None:
        """Remove the webhook registrations first (a pod create must never wait on a gone
        server), then stop the manager."""
        try:
            self._deregister()
        finally:
            self.supervisor.stop_all(grace_seconds=10.0)

    def _register(self, configs: list[dict[str, Any]]) -> None:
        from kubernetes import client
        from kubernetes import config as kube_config

        with kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(self.kubeconfig)) as api:
            admission = client.AdmissionregistrationV1Api(api)
            # The client's stubs want its model classes; a dict is sent as is.
            for doc in configs:
                name = doc["metadata"]["name"]
                if doc["kind"] == "MutatingWebhookConfiguration":
                    admission.create_mutating_webhook_configuration(doc)  # type: ignore[arg-type]
                else:
                    admission.create_validating_webhook_configuration(doc)  # type: ignore[arg-type]
                self.registered.append((doc["kind"], name))

    def _deregister(self) -> None:
        from kubernetes import client
        from kubernetes import config as kube_config
        from kubernetes.client.exceptions import ApiException

        if not self.registered:
            return
        with kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(self.kubeconfig)) as api:
            admission = client.AdmissionregistrationV1Api(api)
            for kind, name in reversed(self.registered):
                try:
                    if kind == "MutatingWebhookConfiguration":
                        admission.delete_mutating_webhook_configuration(name)
                    else:
                        admission.delete_validating_webhook_configuration(name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        self.registered.clear()

    def _wait(self, what: str, probe: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout_seconds
        while not probe():
            self.supervisor.raise_if_exited()
            if time.monotonic() > deadline:
                raise ClusterError(COMPONENT, f"timed out after {self.start_timeout_seconds:.0f}"
                                   f"s waiting for {what}", self.log_path)
            time.sleep(0.2)
