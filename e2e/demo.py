"""The local demo, step by step: control plane with fake GPU pools, kvtune's CRDs, the operator
(``kvtune operator`` as a subprocess), an example InferenceDeployment, and then what kvtune
decided per pool and the pods Running on the fake GPU nodes.

Every process (control plane and operator) belongs to one :class:`LocalCluster` supervisor, so
they are all stopped at the end, on Ctrl-C, and on any error.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kvtune.e2e.cluster import LocalCluster
from kvtune.e2e.errors import ClusterError, log_tail
from kvtune.e2e.operator_command import operator_executable
from kvtune.e2e.traces import AZURE_TRACE

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"
EXAMPLE = REPO / "examples" / "support-bot.yaml"
# A real conversation trace (Azure, CC BY 4.0; see examples/traces/SOURCES.md) for the traffic
# step, shipped in the repository so the demo needs nothing beside it.
DEFAULT_TRACE = Path(os.environ.get("KVTUNE_DEMO_TRACE", AZURE_TRACE))
TRAFFIC_SPEED = 10.0  # trace seconds per wall second
PROFILE_WINDOW_SECONDS = 30
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
    declared_pools: list[dict[str, Any]] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    traffic: str | None = None  # why there was none, or what it was


class Demo:
    def __init__(
        self,
        cluster: LocalCluster,
        example: Path = EXAMPLE,
        echo: Callable[[str], None] = print,
        timeout_seconds: float = 180.0,
        trace: Path | None = DEFAULT_TRACE,
    ) -> None:
        """``trace``: replay it to Prometheus so the operator profiles real traffic (None:
        plan on the declared workload only)."""
        self.cluster, self.example, self.echo = cluster, example, echo
        self.timeout_seconds = timeout_seconds
        self.trace = trace
        self.manifest: dict[str, Any] = yaml.safe_load(example.read_text())
        self.name = self.manifest["metadata"]["name"]
        self.namespace = self.manifest["metadata"].get("namespace", "default")
        self.operator_log = cluster.log_path("kvtune-operator")

    def run(self, keep: bool = False) -> DemoReport:
        """Everything, then the report; ``keep``: stay up until interrupted. The caller
        stops the cluster (and with it the operator); the traffic is stopped here."""
        with contextlib.ExitStack() as stack:
            report = self._run(stack)
            if keep:
                self.echo(f"\nRunning. export KUBECONFIG={self.cluster.kubeconfig_path}  "
                          "(Ctrl-C to stop everything)")
                threading.Event().wait()
            return report

    def _run(self, stack: contextlib.ExitStack) -> DemoReport:
        timings: dict[str, float] = {}
        start = time.monotonic()
        self.echo("[1/6] control plane: etcd, kube-apiserver, kube-controller-manager, "
                  "kube-scheduler, kwok with fake GPU nodes (127.0.0.1 only) ...")
        self.cluster.up()
        timings["cluster_up"] = time.monotonic() - start
        self.echo(f"      up in {timings['cluster_up']:.1f}s; "
                  f"export KUBECONFIG={self.cluster.kubeconfig_path}")
        for pool, nodes_ready in self.cluster.nodes_ready_by_pool().items():
            self.echo(f"      pool {pool:<5} {nodes_ready} nodes Ready")
        api = self.cluster.api_client()

        self.echo(f"[2/6] CRDs from {CRD_DIR} ...")
        names = self._install_crds(api)
        self.echo(f"      established: {', '.join(names)}")

        self.echo("[3/6] traffic: vLLM metrics replayed from a real trace, scraped by "
                  "Prometheus ...")
        traffic = self._start_traffic(stack)
        self.echo(f"      {traffic}")

        self.echo(f"[4/6] operator: kvtune operator (log: {self.operator_log}) ...")
        self._start_operator()

        example = self.example
        shown = example.relative_to(REPO) if example.is_relative_to(REPO) else example
        self.echo(f"[5/6] applying {shown} (InferenceDeployment {self.namespace}/{self.name}) ...")
        t = time.monotonic()
        self._apply_example(api)
        ready = self._wait_ready(api)
        timings["ready"] = time.monotonic() - t
        self.echo(f"      Ready after {timings['ready']:.1f}s on the declared workload: "
                  f"{ready.get('message', '')}")
        declared = list((self._get(api).get("status") or {}).get("pools", []))
        profile = None
        if self._observing:
            self.echo(f"[6/6] waiting for the operator to profile the traffic in Prometheus "
                      f"(window {PROFILE_WINDOW_SECONDS}s) and re-plan ...")
            t = time.monotonic()
            profile = self._wait_observed_profile(api)
            ready = self._wait_settled(api)
            timings["observed"] = time.monotonic() - t
            self.echo(f"      re-planned on observed traffic after {timings['observed']:.1f}s")
            if profile.get("keptBecause"):
                self.echo("      the plan for it differs from the running one only by noise: "
                          "kept, nothing rolled out (PlanChangeNotMaterial)")
        else:
            self.echo("[6/6] no traffic to profile: the plans stay on the declared workload")
        pods = self._wait_pods(api)
        obj = self._get(api)
        report = DemoReport(
            name=self.name, namespace=self.namespace, ready_condition=ready,
            pools=list((obj.get("status") or {}).get("pools", [])), pods=pods,
            timings_seconds=timings, declared_pools=declared, profile=profile, traffic=traffic,
        )
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
                conditions = (got.status.conditions if got.status else None) or []
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return False
            return True

        self._wait("the CRDs to be Established", established, "kube-apiserver")
        return names

    _observing = False

    def _start_traffic(self, stack: contextlib.ExitStack) -> str:
        """Replay exporter + Prometheus, if both are here; returns what happened, in words.
        Without them the demo still runs, planning on the declared workload."""
        if self.trace is None:
            return "skipped (--no-traffic): plans use the declared workload"
        if not self.trace.is_file():
            return f"skipped: no trace at {self.trace} (--trace PATH or $KVTUNE_DEMO_TRACE)"
        if shutil.which("prometheus") is None:
            return "skipped: no `prometheus` on PATH (scripts/setup.sh installs Debian's)"
        try:
            from kvtune.e2e.prometheus import start_prometheus
            from kvtune.replay.exporter import Replay, ReplayServer
            from kvtune.replay.instance import InstanceConfig
        except ImportError as error:
            return f"skipped: the replay exporter or Prometheus module is missing ({error})"
        model = self.manifest["spec"]["model"]["name"]
        server = ReplayServer(Replay(InstanceConfig(model_name=model), self.trace, TRAFFIC_SPEED))
        server.start()
        stack.callback(server.stop)
        prometheus = start_prometheus([server.target], labels={"namespace": self.namespace})
        stack.callback(shutil.rmtree, prometheus.data_dir, True)
        stack.callback(prometheus.stop)
        prometheus.wait_for(
            f'vllm:request_success_total{{namespace="{self.namespace}"}}',
            timeout_seconds=self.timeout_seconds, min_value=1,
        )
        spec = self.manifest["spec"]
        tuning = spec.setdefault("tuning", {})
        tuning["prometheus"] = {"url": prometheus.url, "window": f"{PROFILE_WINDOW_SECONDS}s"}
        tuning.setdefault("retune", {"minInterval": f"{PROFILE_WINDOW_SECONDS}s",
                                     "driftThreshold": 0.2})
        self._observing = True
        return (f"{self.trace.name} at {TRAFFIC_SPEED:g}x on http://{server.target}/metrics, "
                f"Prometheus {prometheus.url} (log: {prometheus.log_path})")

    def _start_operator(self) -> None:
        kvtune = operator_executable()
        # The demo's Prometheus runs on loopback: the operator may query only allow-listed URLs.
        env = {"PYTHONUNBUFFERED": "1", "KVTUNE_PROMETHEUS_ALLOWED_URLS": "http://127.0.0.1:*"}
        if self._observing:
            # Profile every 5 s instead of every minute, so the demo shows it within seconds.
            env |= {"KVTUNE_RETUNE_INTERVAL_SECONDS": "5", "KVTUNE_PROFILE_MIN_REQUESTS": "100"}
        self.cluster.supervisor.start("kvtune-operator", [
            str(kvtune), "operator", "--kubeconfig", str(self.cluster.kubeconfig_path),
            "--standalone", "--metrics-port", "0", "--namespace", self.namespace,
        ], env=env)

    def _apply_example(self, api: Any) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            client.CoreV1Api(api).create_namespace(
                {"metadata": {"name": self.namespace}})  # type: ignore[arg-type]  # sent as is
        except ApiException as error:
            if error.status != 409:
                raise
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.manifest
        )

    def _get(self, api: Any) -> dict[str, Any]:
        from kubernetes import client

        obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        assert isinstance(obj, dict), type(obj)
        return obj

    def _wait_ready(self, api: Any) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            for cond in (self._get(api).get("status") or {}).get("conditions", []):
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    return dict(cond)
            return None

        return self._wait(f"InferenceDeployment {self.name} to be Ready", ready, "kvtune-operator")

    def _wait_observed_profile(self, api: Any) -> dict[str, Any]:
        """The observed profile once the operator planned for it: adopted (status.profile
        from Prometheus), or planned and kept because the plan for it differs from the
        running one only by noise (the retune timer's PlanChangeNotMaterial: the running
        plan's basis stays, so the profile shown is the window's, status.profile.observed)."""

        def observed() -> dict[str, Any] | None:
            status = self._get(api).get("status") or {}
            profile = status.get("profile") or {}
            if profile.get("source") == "prometheus":
                return dict(profile)
            retune = profile.get("retune") or {}
            if retune.get("reason") == "PlanChangeNotMaterial":
                window = dict(profile.get("observed") or {})
                seconds = window.get("windowSeconds")
                return {**window, "window": f"{seconds:g}s" if seconds else None,
                        # The window's lengths are estimates per quantile, read from buckets.
                        "contextTokens": _by_quantile(window.get("contextTokens")),
                        "outputTokens": _by_quantile(window.get("outputTokens")),
                        "keptBecause": retune.get("message", "")}
            return None

        return self._wait("a profile observed in Prometheus", observed, "kvtune-operator")

    def _wait_settled(self, api: Any) -> dict[str, Any]:
        """Ready, and no rollout in progress (the observed plan may have changed pods)."""

        def settled() -> dict[str, Any] | None:
            conditions = {
                c.get("type"): c for c in (self._get(api).get("status") or {}).get("conditions", [])
            }
            ready = conditions.get("Ready", {})
            if ready.get("status") == "True" and conditions.get("Progressing", {}).get(
                "status"
            ) != "True":
                return dict(ready)
            return None

        return self._wait("Ready with no rollout in progress", settled, "kvtune-operator")

    def _wait_pods(self, api: Any) -> list[PodRow]:
        from kubernetes import client

        core = client.CoreV1Api(api)
        products = {
            n.metadata.name: (n.metadata.labels or {}).get("nvidia.com/gpu.product", "-")
            for n in core.list_node().items if n.metadata is not None
        }
        wanted = sum(int(p.get("replicas", 1)) for p in self.manifest["spec"]["pools"])

        def running() -> list[PodRow] | None:
            rows = []
            for pod in core.list_namespaced_pod(self.namespace).items:
                meta, spec, status = pod.metadata, pod.spec, pod.status
                if meta is None or spec is None or status is None \
                        or meta.deletion_timestamp is not None:
                    continue
                conditions = status.conditions or []
                limits = [
                    (c.resources.limits or {}).get("nvidia.com/gpu", "0")
                    for c in spec.containers if c.resources is not None
                ]
                rows.append(PodRow(
                    name=meta.name or "-", node=spec.node_name or "-",
                    gpu_product=products.get(spec.node_name or "", "-"),
                    gpus="+".join(limits) or "0", phase=status.phase or "-",
                    ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
                ))
            # Exactly the replicas asked for: more means a rollout is still replacing pods.
            done = len(rows) == wanted and all(r.phase == "Running" and r.ready for r in rows)
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
        if report.profile is not None:
            echo(f"Traffic kvtune observed in Prometheus: {_profile_line(report.profile)}")
        echo(f"What kvtune decided for {report.namespace}/{report.name}:")
        declared = {p.get("name"): p.get("plan") or {} for p in report.declared_pools}
        for pool in report.pools:
            plan = pool.get("plan") or {}
            echo(f"  pool {pool.get('name', pool.get('gpuClass'))} ({pool.get('gpuClass')}, "
                 f"{pool.get('replicas')} replica(s), "
                 f"tensor-parallel {pool.get('tensorParallel')}, "
                 f"{pool.get('phase')}, revision {pool.get('revision')}):")
            if plan:
                # allowDeprecatedQuantization=False is every plan's: shown only when set.
                shown = {k: v for k, v in plan.items() if v is not None
                         and not (k == "allowDeprecatedQuantization" and v is False)}
                echo("    plan: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
            before = declared.get(pool.get("name"))
            if report.profile is not None and before is not None:
                changes = [f"{k} {before.get(k)} -> {v}" for k, v in plan.items()
                           if before.get(k) != v]
                echo("    changed from the declared-workload plan: "
                     + (", ".join(changes) if changes else "nothing (the traffic fits it)"))
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


def _by_quantile(estimates: Any) -> dict[str, Any]:
    """``status.profile.observed``'s estimates ([{q: 0.5, estimate: ...}, ...]) as p50/p95/..."""
    return {f"p{round(float(e['q']) * 100)}": e.get("estimate")
            for e in estimates or [] if isinstance(e, dict) and "q" in e}


def _profile_line(profile: dict[str, Any]) -> str:
    """One line of what the operator measured (keys as the status has them, camelCase)."""
    parts = [f"window {profile.get('window')}"] if profile.get("window") else []
    if profile.get("requests") is not None:
        parts.append(f"{profile['requests']} requests")
    for key, label in (("contextTokens", "context"), ("outputTokens", "output")):
        q = profile.get(key) or {}
        if q:
            parts.append(f"{label} p50/p95/p99 {q.get('p50')}/{q.get('p95')}/{q.get('p99')} tokens")
    if profile.get("prefixHitRate") is not None:
        parts.append(f"prefix hit rate {profile['prefixHitRate']:.2f}")
    if profile.get("requestRatePerSecond") is not None:
        parts.append(f"{profile['requestRatePerSecond']:.1f} req/s")
    return ", ".join(parts)
