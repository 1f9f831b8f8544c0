"""The local demo, step by step: control plane with fake GPU pools, kvtune's CRDs, the operator
(``kvtune operator`` as a subprocess), an example InferenceDeployment, and then what kvtune
decided per pool and the pods Running on the fake GPU nodes.

Every process (control plane and operator) belongs to one :class:`LocalCluster` supervisor, so
they are all stopped at the end, on Ctrl-C, and on any error.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kvtune.e2e.cluster import LocalCluster
from kvtune.e2e.errors import ClusterError, log_tail

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"
EXAMPLE = REPO / "examples" / "support-bot.yaml"
GROUP, VERSION, PLURAL = "kvtune.io", "v1alpha1", "inferencedeployments"
T = TypeVar("T")


@dataclass
class PodRow:
    name: str
    node: str
    gpu_product: str
    gpus: str
    phase: str
    ready: bool


@dataclass
class DemoReport:
    """What the demo found, also for its test."""

    name: str
    namespace: str
    ready_condition: dict[str, Any]
    pools: list[dict[str, Any]]
    pods: list[PodRow]
    timings_seconds: dict[str, float] = field(default_factory=dict)


class Demo:
    def __init__(
        self,
        cluster: LocalCluster,
        example: Path = EXAMPLE,
        echo: Callable[[str], None] = print,
        timeout_seconds: float = 180.0,
    ) -> None:
        self.cluster, self.example, self.echo = cluster, example, echo
        self.timeout_seconds = timeout_seconds
        self.manifest: dict[str, Any] = yaml.safe_load(example.read_text())
        self.name = self.manifest["metadata"]["name"]
        self.namespace = self.manifest["metadata"].get("namespace", "default")
        self.operator_log = cluster.log_path("kvtune-operator")

    def run(self) -> DemoReport:
        timings: dict[str, float] = {}
        start = time.monotonic()
        self.echo("[1/5] control plane: etcd, kube-apiserver, kube-controller-manager, "
                  "kube-scheduler, kwok with fake GPU nodes (127.0.0.1 only) ...")
        self.cluster.up()
        timings["cluster_up"] = time.monotonic() - start
        self.echo(f"      up in {timings['cluster_up']:.1f}s; "
                  f"export KUBECONFIG={self.cluster.kubeconfig_path}")
        for pool, ready in self.cluster.nodes_ready_by_pool().items():
            self.echo(f"      pool {pool:<5} {ready} nodes Ready")
        api = self.cluster.api_client()

        self.echo(f"[2/5] CRDs from {CRD_DIR} ...")
        names = self._install_crds(api)
        self.echo(f"      established: {', '.join(names)}")

        self.echo(f"[3/5] operator: kvtune operator (log: {self.operator_log}) ...")
        self._start_operator()

        example = self.example
        shown = example.relative_to(REPO) if example.is_relative_to(REPO) else example
        self.echo(f"[4/5] applying {shown} (InferenceDeployment {self.namespace}/{self.name}) ...")
        t = time.monotonic()
        self._apply_example(api)
        ready = self._wait_ready(api)
        pods = self._wait_pods(api)
        timings["ready"] = time.monotonic() - t
        obj = self._get(api)
        report = DemoReport(
            name=self.name, namespace=self.namespace, ready_condition=ready,
            pools=list((obj.get("status") or {}).get("pools", [])), pods=pods,
            timings_seconds=timings,
        )
        self.echo(f"[5/5] Ready after {timings['ready']:.1f}s: {ready.get('message', '')}")
        self._print_report(report)
        return report

    # -- steps -----------------------------------------------------------------------------

    def _install_crds(self, api: Any) -> list[str]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        ext = client.ApiextensionsV1Api(api)
        files = sorted(CRD_DIR.glob("*.yaml"))
        if not files:
            raise ClusterError("demo", f"no CRD manifests in {CRD_DIR}; run `make crds`")
        names = []
        for path in files:
            for crd in yaml.safe_load_all(path.read_text()):
                if not crd:
                    continue
                name = crd["metadata"]["name"]
                try:
                    ext.create_custom_resource_definition(crd)
                except ApiException as error:
                    if error.status != 409:
                        raise
                names.append(name)

        def established() -> bool:
            for name in names:
                got = ext.read_custom_resource_definition(name)
                conditions = got.status.conditions or []
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return False
            return True

        self._wait("the CRDs to be Established", established, "kube-apiserver")
        return names

    def _start_operator(self) -> None:
        kvtune = Path(sys.executable).parent / "kvtune"
        self.cluster.supervisor.start("kvtune-operator", [
            str(kvtune), "operator", "--kubeconfig", str(self.cluster.kubeconfig_path),
            "--standalone", "--metrics-port", "0", "--namespace", self.namespace,
        ], env={"PYTHONUNBUFFERED": "1"})

    def _apply_example(self, api: Any) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": self.namespace}})
        except ApiException as error:
            if error.status != 409:
                raise
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.manifest
        )

    def _get(self, api: Any) -> dict[str, Any]:
        from kubernetes import client

        obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        return obj

    def _wait_ready(self, api: Any) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            for cond in (self._get(api).get("status") or {}).get("conditions", []):
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    return dict(cond)
            return None

        return self._wait(f"InferenceDeployment {self.name} to be Ready", ready, "kvtune-operator")

    def _wait_pods(self, api: Any) -> list[PodRow]:
        from kubernetes import client

        core = client.CoreV1Api(api)
        products = {
            n.metadata.name: n.metadata.labels.get("nvidia.com/gpu.product", "-")
            for n in core.list_node().items
        }
        wanted = sum(int(p.get("replicas", 1)) for p in self.manifest["spec"]["pools"])

        def running() -> list[PodRow] | None:
            rows = []
            for pod in core.list_namespaced_pod(self.namespace).items:
                if pod.metadata.deletion_timestamp is not None:
                    continue
                conditions = pod.status.conditions or []
                limits = [
                    (c.resources.limits or {}).get("nvidia.com/gpu", "0")
                    for c in pod.spec.containers if c.resources is not None
                ]
                rows.append(PodRow(
                    name=pod.metadata.name, node=pod.spec.node_name or "-",
                    gpu_product=products.get(pod.spec.node_name or "", "-"),
                    gpus="+".join(limits) or "0", phase=pod.status.phase or "-",
                    ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
                ))
            done = len(rows) >= wanted and all(r.phase == "Running" and r.ready for r in rows)
            return sorted(rows, key=lambda r: r.name) if done else None

        return self._wait(f"{wanted} runtime pods Running and Ready", running, "kwok")

    def _wait(self, what: str, probe: Callable[[], T | None], component: str) -> T:
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            self.cluster.supervisor.raise_if_exited()
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                log = self.cluster.log_path(component)
                raise ClusterError(
                    component,
                    f"timed out after {self.timeout_seconds:.0f}s waiting for {what}: "
                    f"{log_tail(log, 6)}",
                    log,
                )
            time.sleep(0.25)  # poll interval

    # -- output ----------------------------------------------------------------------------

    def _print_report(self, report: DemoReport) -> None:
        echo = self.echo
        echo("")
        echo(f"What kvtune decided for {report.namespace}/{report.name}:")
        for pool in report.pools:
            plan = pool.get("plan") or {}
            echo(f"  pool {pool.get('name', pool.get('gpuClass'))} ({pool.get('gpuClass')}, "
                 f"{pool.get('replicas')} replica(s), "
                 f"tensor-parallel {pool.get('tensorParallel')}, "
                 f"{pool.get('phase')}, revision {pool.get('revision')}):")
            if plan:
                echo("    plan: " + ", ".join(f"{k}={v}" for k, v in plan.items() if v is not None))
            expected = pool.get("expected") or {}
            if expected:
                echo("    expected: " + ", ".join(
                    f"{k}={v}" for k, v in expected.items() if v is not None))
            for reason in pool.get("reasons", []):
                echo(f"    - {reason}")
            if pool.get("vllmArgs"):
                echo("    vllm " + " ".join(pool["vllmArgs"]))
        echo("")
        echo("Runtime pods on the fake GPU nodes:")
        echo(f"  {'POD':<44} {'NODE':<8} {'GPU':<22} {'GPUS':<5} {'PHASE':<8} READY")
        for row in report.pods:
            echo(f"  {row.name:<44} {row.node:<8} {row.gpu_product:<22} {row.gpus:<5} "
                 f"{row.phase:<8} {row.ready}")
