"""Scale benchmark (issue 11): N InferenceDeployments on the real local control plane.

Starts the local control plane (e2e's LocalCluster) with enough fake H200 GPUs for one pod
per object, runs `kvtune operator` (standalone) as a subprocess, creates one
InferenceDeployment and times it to Ready (the baseline, same run), then creates N more at
once and prints:

- the time until all N are Ready (goal: < 60 s at N = 1,000), and the ratio to the baseline;
- the operator's peak resident memory (goal: < 250 MB), sampled from /proc every second;
- API requests per second, from the apiserver's own counter ``apiserver_request_total``
  (every client: operator, controllers, scheduler, kwok, this script), by verb;
- the machine's load average before and after (a shared machine skews every figure);
- the CPU seconds each process spent (etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler, kwok, the operator) per object, and what the whole machine was busy with;
- the control plane's own floor, measured first in the same run (``--no-floor`` skips it):
  the same N Deployments, Services and PodDisruptionBudgets the operator renders (copied
  from the baseline object's), server-side applied directly by this script, timed until all
  are available. The operator's figure is then "overhead over the floor": what the
  operator adds to the work the control plane must do anyway. The floor's objects stay while
  the operator runs (a cost against the operator, not for it).

    .venv/bin/python bench/scale.py            # N = 1000
    .venv/bin/python bench/scale.py -n 100     # smaller
    .venv/bin/python bench/scale.py -n 200 --profile /tmp/op.txt   # where the CPU goes

``--profile FILE`` runs the operator under py-spy (``pip install py-spy``; sampling, all
threads, idle waits left out) and writes its collapsed stacks to FILE; the figures of a
profiled run are slower than the plain ones.

A benchmark, not a test: it asserts nothing, it prints figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "kvtune.io", "v1alpha1", "inferencedeployments"
NAMESPACE = "bench-scale"
FLOOR_NAMESPACE = "bench-floor"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
GOAL_SECONDS = 60.0
GOAL_RSS_BYTES = 250 * 1000**2
SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "workload": {"profile": "chat"},
    "pools": [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}],
    "tuning": {"mode": "auto"},
}


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (on a shared machine, what the operator itself
    spent, whatever its wall clock)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (every core, every process: /proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu_by_process(pids: dict[str, int]) -> Counter[str]:
    """CPU seconds so far of each named process, and of the whole machine ("machine")."""
    out: Counter[str] = Counter({name: _cpu_seconds(pid) for name, pid in pids.items()})
    out["machine"] = _machine_busy_seconds()
    return out


def _child_pid(pid: int) -> int:
    """The first child of ``pid`` (the operator py-spy started), else ``pid`` itself."""
    for _ in range(100):
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return pid
        if children:
            return int(children[0])
        time.sleep(0.1)
    return pid


def _label(labels: str, name: str) -> str:
    marker = f'{name}="'
    return labels.split(marker, 1)[1].split('"', 1)[0] if marker in labels else ""


def _request_counts(api: Any) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (verb, resource[/subresource]), from the
    apiserver's /metrics; and under ("seconds", …) the server's time on them
    (apiserver_request_duration_seconds_sum), in milliseconds."""
    response = api.call_api("GET", f"{api.configuration.host}/metrics")
    response.read()
    counts: Counter[tuple[str, str]] = Counter()
    for line in response.data.decode().splitlines():
        total = line.startswith("apiserver_request_total{")
        if not total and not line.startswith("apiserver_request_duration_seconds_sum{"):
            continue
        labels, value = line.rsplit(" ", 1)
        resource = _label(labels, "resource") or "-"
        if _label(labels, "subresource"):
            resource += "/" + _label(labels, "subresource")
        dry = " (dry run)" if _label(labels, "dry_run") else ""
        verb = _label(labels, "verb") + dry
        if total:
            counts[(verb, resource)] += int(float(value))
        else:
            counts[("ms " + verb, resource)] += int(1000 * float(value))
    return counts


class _Watcher:
    """When each object was first reconciled and first Ready (``judge``: an object's
    (reconciled, Ready)), from a watch: a watch costs the API server little, where listing
    1,000 objects every few seconds would load it as much as the operator does.
    ``list_call(**kwargs)`` lists the objects (a namespaced list call of the client)."""

    def __init__(self, list_call: Any, judge: Any) -> None:
        self.list_call, self.judge = list_call, judge
        self.reconciled: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from kubernetes import client, watch
        from kubernetes.client.exceptions import ApiException

        while not self.stop.is_set():
            listing = self.list_call()
            if not isinstance(listing, dict):  # a typed list: as the API server sent it
                listing = client.ApiClient().sanitize_for_serialization(listing)
            for obj in listing["items"]:
                self._see(obj)
            version = listing["metadata"]["resourceVersion"]
            try:
                for event in watch.Watch().stream(self.list_call, resource_version=version,
                                                  timeout_seconds=60):
                    self._see(event["raw_object"])
                    if self.stop.is_set():
                        return
            except ApiException as exc:
                if exc.status != 410:  # 410: the version expired; list again
                    raise
            except Exception:  # the control plane stopping under an open watch
                if self.stop.is_set():
                    return
                raise

    def _see(self, obj: dict[str, Any]) -> None:
        name, now = obj["metadata"]["name"], time.monotonic()
        reconciled, ready = self.judge(obj)
        with self.lock:
            if reconciled:
                self.reconciled.setdefault(name, now)
            if ready:
                self.ready.setdefault(name, now)

    def counts(self, names: set[str]) -> tuple[int, int, float | None, float | None]:
        """(reconciled, Ready, when the last was reconciled, when the last became Ready)."""
        with self.lock:
            reconciled = [self.reconciled[n] for n in names if n in self.reconciled]
            ready = [self.ready[n] for n in names if n in self.ready]
        return (len(reconciled), len(ready),
                max(reconciled) if len(reconciled) == len(names) else None,
                max(ready) if len(ready) == len(names) else None)


def _inference_deployment_state(obj: dict[str, Any]) -> tuple[bool, bool]:
    """(reconciled: status.observedGeneration set, Ready=True)."""
    status = obj.get("status") or {}
    return bool(status.get("observedGeneration")), any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or [])


def _deployment_state(obj: dict[str, Any]) -> tuple[bool, bool]:
    """(the Deployment controller saw it, every replica updated and available)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    want = int(spec.get("replicas", 1))
    seen = int(status.get("observedGeneration") or 0) >= int(obj["metadata"].get("generation")
                                                                or 1)
    return seen, seen and int(status.get("updatedReplicas") or 0) >= want and int(
        status.get("availableReplicas") or 0) >= want


def _floor_templates(kube: Any, name: str) -> list[dict[str, Any]]:
    """The Deployment, Service and PodDisruptionBudget the operator applied for the object
    ``name`` (its pool h200), as they would be applied (no server-set fields, no owner)."""
    from kvtune.operator.kube import apply as kapply

    out = []
    for kind in ("Service", "Deployment", "PodDisruptionBudget"):
        obj = copy.deepcopy(kube.request("GET", kapply.path(kind, NAMESPACE, f"{name}-h200")))
        meta = obj["metadata"]
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if k != "deployment.kubernetes.io/revision"}
        obj["metadata"] = {"name": meta["name"], "labels": meta.get("labels") or {},
                           "annotations": annotations}
        obj.pop("status", None)
        if kind == "Service":
            for key in ("clusterIP", "clusterIPs"):
                obj["spec"].pop(key, None)
        out.append(obj)
    return out


def _apply_floor(kube: Any, templates: list[dict[str, Any]], like: str, name: str) -> None:
    """The objects of ``templates`` (made for the object ``like``) for the object ``name``,
    server-side applied in the floor's namespace: one request each, nothing else."""
    from kvtune.operator.kube import apply as kapply

    for template in templates:
        obj = json.loads(json.dumps(template).replace(like, name))
        obj["metadata"]["namespace"] = FLOOR_NAMESPACE
        kube.request("PATCH", kapply.path(obj["kind"], FLOOR_NAMESPACE, obj["metadata"]["name"]),
                     query={"fieldManager": "bench-floor", "force": True}, body=obj,
                     content_type=kapply.APPLY_CONTENT_TYPE)


def _create(custom: Any, name: str) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": SPEC})


def _wait_ready(watcher: _Watcher, names: set[str], timeout_s: float,
                operator: subprocess.Popen[bytes], peak: list[int],
                started: float | None = None,
                milestones: dict[str, float] | None = None) -> float | None:
    """Seconds from ``started`` until every one of ``names`` is Ready (None: timed out).
    ``milestones["reconciled"]``: when the last was first reconciled (the operator's first
    pass; the rest is the controllers, kwok and the rollout follower)."""
    started = time.monotonic() if started is None else started
    last_print = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if operator.poll() is not None:
            raise SystemExit(f"the operator exited ({operator.returncode})")
        reconciled, ready, all_reconciled, all_ready = watcher.counts(names)
        if all_reconciled is not None and milestones is not None:
            milestones["reconciled"] = all_reconciled - started
        if all_ready is not None:
            return all_ready - started
        if time.monotonic() - last_print > 15:
            last_print = time.monotonic()
            print(f"  … after {last_print - started:.0f} s: {reconciled} reconciled, {ready}/"
                  f"{len(names)} Ready, operator RSS {peak[0] / 2**20:.0f} MiB", flush=True)
        time.sleep(0.5)
    return None


def _cpu_line(what: str, spent: Counter[str], n: int, wall_s: float) -> str:
    """CPU ms per object of each process in ``spent``, the control plane's sum, and what the
    rest of the machine (other engineers, this script) was busy with meanwhile."""
    cores = os.cpu_count() or 1
    plane = sum(spent[c] for c in CONTROL_PLANE)
    ours = plane + spent["operator"] + spent["bench"]
    parts = ", ".join(f"{c} {1000 * spent[c] / n:.0f}" for c in (*CONTROL_PLANE, "operator",
                                                                 "bench"))
    return (f"  CPU, {what} (ms per object): {parts}; control plane {1000 * plane / n:.0f} "
            f"({plane:.0f} s in all: {plane / cores:.0f} s of wall time at least on "
            f"{cores} cores); the machine was busy {spent['machine'] / wall_s:.2f} of "
            f"{cores} cores over {wall_s:.0f} s, {max(0.0, spent['machine'] - ours) / wall_s:.2f}"
            f" of them with other work")


def _requests_lines(counts: Counter[tuple[str, str]], n: int, wall_s: float) -> str:
    """The API requests of a phase (all clients) by verb, the most requested per object, and
    the API server's time on them (``_request_counts`` after minus before)."""
    server_ms = Counter({(verb[3:], resource): ms for (verb, resource), ms in counts.items()
                         if verb.startswith("ms ")})
    delta = Counter({key: count for key, count in counts.items()
                     if not key[0].startswith("ms ")})
    by_verb: Counter[str] = Counter()
    for (verb, _), count in delta.items():
        by_verb[verb] += count
    total = sum(delta.values())
    return "\n".join([
        f"  API requests (apiserver_request_total, all clients): {total} in {wall_s:.0f} s = "
        f"{total / wall_s:.0f}/s; by verb: " + ", ".join(
            f"{verb} {count}" for verb, count in by_verb.most_common()),
        "  the 24 most requested (verb, resource), per object: " + ", ".join(
            f"{verb} {resource} {count / n:.1f}" for (verb, resource), count
            in delta.most_common(24)),
        f"  the API server's time (apiserver_request_duration_seconds, "
        f"{sum(server_ms.values()) / 1000:.0f} s in all), the 10 largest: " + ", ".join(
            f"{verb} {resource} {ms / 1000:.0f} s ({ms / max(delta[(verb, resource)], 1):.0f}"
            f" ms each)" for (verb, resource), ms in server_ms.most_common(10))])


def run(n: int, timeout_s: float, workers: int, profile: Path | None = None,
        control_plane_qps: int | None = None, operator_path: Path | None = None,
        floor: bool = True) -> int:
    from kubernetes import client

    from kvtune.e2e import cluster as e2e_cluster
    from kvtune.e2e.cluster import LocalCluster
    from kvtune.e2e.gpu_nodes import NodePool
    from kvtune.operator.kube.apply import Kube

    # One Service per object: the tests' /24 service range holds 254 (a /16, 65,534).
    e2e_cluster.SERVICE_CIDR = "10.0.0.0/16"
    # The controllers' own request rate (their default, 20/s, takes minutes to make 1,000
    # ReplicaSets and pods whatever the operator does): --control-plane-qps.
    e2e_cluster.CONTROL_PLANE_QPS = control_plane_qps
    load_before = os.getloadavg()
    gpus_per_node = 100
    nodes = math.ceil(((2 * n if floor else n) + 1) / gpus_per_node)
    pools = (NodePool("H200", nodes, gpus_per_node=gpus_per_node, pods=str(gpus_per_node + 20)),)
    with tempfile.TemporaryDirectory(prefix="kvtune-bench-scale-") as tmp, \
            LocalCluster(Path(tmp) / "cluster", pools) as cluster:
        api = cluster.api_client()
        crd = __import__("yaml").safe_load(
            (REPO / "crds/inferencedeployments.kvtune.io.yaml").read_text())
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
        for namespace in (NAMESPACE, FLOOR_NAMESPACE):
            client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        custom = client.CustomObjectsApi(api)
        time.sleep(2)  # the CRD's API appears a moment after it is established
        log = Path(tmp) / "operator.log"
        argv = [str(Path(sys.executable).parent / "kvtune"), "operator", "--kubeconfig",
                str(cluster.kubeconfig_path), "--standalone", "--namespace", NAMESPACE,
                "--metrics-port", "0"]
        if profile is not None:
            argv = [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
                    "--threads", "--rate", "50", "--output", str(profile), "--", *argv]
        env = dict(os.environ)
        if operator_path is not None:
            env["PYTHONPATH"] = str(operator_path)
        with log.open("w") as out:
            operator = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                        env=env)
        pid = _child_pid(operator.pid) if profile is not None else operator.pid
        pids = {r.component: r.pid for r in cluster.supervisor.records
                if r.component in CONTROL_PLANE}
        pids.update(operator=pid, bench=os.getpid())
        peak = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                peak[0] = max(peak[0], _rss_bytes(pid))

        threading.Thread(target=sample, daemon=True).start()
        floor_s: float | None = None
        floor_cpu: Counter[str] = Counter()
        floor_requests: Counter[tuple[str, str]] = Counter()
        floor_wall = 0.0
        try:
            watcher = _Watcher(lambda **kw: custom.list_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, **kw), _inference_deployment_state)
            _create(custom, "baseline")
            baseline = _wait_ready(watcher, {"baseline"}, 300, operator, peak)
            if baseline is None:
                print("the baseline object never became Ready; operator log tail:")
                print("\n".join(log.read_text().splitlines()[-30:]))
                return 1
            rss_idle = _rss_bytes(pid)
            if floor:
                # The control plane alone: the same objects, applied directly.
                kube = Kube(api)
                templates = _floor_templates(kube, "baseline")
                apps = client.AppsV1Api(api)
                deployments = _Watcher(lambda **kw: apps.list_namespaced_deployment(
                    FLOOR_NAMESPACE, **kw), _deployment_state)
                floor_names = {f"floor-{i:04d}" for i in range(n)}
                cpu_start = _cpu_by_process(pids)
                floor_before = _request_counts(api)
                started = time.monotonic()
                with ThreadPoolExecutor(workers) as pool:
                    list(pool.map(lambda name: _apply_floor(kube, templates, "baseline", name),
                                  sorted(floor_names)))
                floor_s = _wait_ready(deployments, {f"{name}-h200" for name in floor_names},
                                      timeout_s, operator, peak, started)
                floor_wall = time.monotonic() - started
                floor_cpu = _cpu_by_process(pids) - cpu_start
                floor_requests = _request_counts(api) - floor_before
                deployments.stop.set()
            cpu_start = _cpu_by_process(pids)
            names = {f"bench-{i:04d}" for i in range(n)}
            before = _request_counts(api)
            started = time.monotonic()
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda name: _create(custom, name), sorted(names)))
            created = time.monotonic() - started
            marks: dict[str, float] = {}
            took = _wait_ready(watcher, names, timeout_s, operator, peak, started, marks)
            watcher.stop.set()
            elapsed = time.monotonic() - started
            after = _request_counts(api)
            rss_end = _rss_bytes(pid)
            spent = _cpu_by_process(pids) - cpu_start
        finally:
            stop.set()
            # Under py-spy: SIGINT to py-spy writes its profile and stops the operator.
            operator.send_signal(signal.SIGINT if profile is not None else signal.SIGTERM)
            try:
                operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                operator.kill()
        load_after = os.getloadavg()
        print(f"kvtune scale bench: N={n} InferenceDeployments (1 pool, 1 replica, H200), "
              f"standalone operator, {nodes} fake nodes x {gpus_per_node} GPUs, "
              f"controller-manager/scheduler API QPS "
              f"{control_plane_qps or 'default (20/50)'}")
        print(f"  machine: {os.cpu_count()} cores, load average {load_before[0]:.1f} before, "
              f"{load_after[0]:.1f} after")
        print(f"  baseline (same run): 1 object Ready in {baseline:.1f} s")
        if floor:
            shown = "NOT all within the timeout" if floor_s is None else f"{floor_s:.1f} s"
            print(f"  the control plane's floor (same run, no operator): {n} Deployments + "
                  f"Services + PodDisruptionBudgets as the operator renders them, applied "
                  f"directly ({workers} client threads), all available after {shown}")
            print(_cpu_line("floor", floor_cpu, n, floor_wall))
            print(_requests_lines(floor_requests, n, floor_wall))
        print(f"  created {n} objects in {created:.1f} s ({workers} client threads)")
        if took is None:
            ready = watcher.counts(names)[1]
            print(f"  NOT all Ready within {timeout_s:.0f} s ({ready} Ready)")
        else:
            print(f"  all {n} Ready {took:.1f} s after the first create "
                  f"(goal < {GOAL_SECONDS:.0f} s: {took / GOAL_SECONDS:.2f}x the goal; "
                  f"{took / baseline:.1f}x the one-object baseline)")
            if floor_s is not None:
                print(f"  the operator's overhead over the control plane's floor: "
                      f"{took - floor_s:+.1f} s ({took / floor_s:.2f}x the floor)")
        print("  where the time went: " + ", ".join(
            f"all {what} {at:.1f} s after the first create" for what, at in marks.items()))
        print(f"  operator RSS: peak {peak[0] / 1e6:.0f} MB, idle with 1 object "
              f"{rss_idle / 1e6:.0f} MB, at the end {rss_end / 1e6:.0f} MB "
              f"(goal < {GOAL_RSS_BYTES / 1e6:.0f} MB: {peak[0] / GOAL_RSS_BYTES:.2f}x)")
        cpu = spent["operator"]
        print(f"  operator CPU: {cpu:.1f} s for the {n} objects ({1000 * cpu / n:.0f} ms each; "
              f"{cpu / elapsed:.0%} of one core over {elapsed:.0f} s)")
        print(_cpu_line("with the operator", spent, n, elapsed))
        print(_requests_lines(after - before, n, elapsed))
        return 0 if took is not None else 1


def main() -> int:
    # SIGTERM (timeout, kill): unwind, so the operator and the control plane are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1000, help="InferenceDeployments (1000)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds to wait for all Ready (900)")
    parser.add_argument("--workers", type=int, default=8, help="client threads creating (8)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="run the operator under py-spy; collapsed stacks to this file")
    parser.add_argument("--control-plane-qps", type=int, default=None,
                        help="the controller-manager's and scheduler's API QPS (their defaults)")
    parser.add_argument("--operator-path", type=Path, default=None,
                        help="run the operator from another checkout (the import tree "
                             "scripts/import_shim.py builds there): a before/after in one "
                             "session on the same control plane code")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the control plane's floor (the same objects applied "
                             "directly, no operator)")
    args = parser.parse_args()
    return run(args.n, args.timeout, args.workers, args.profile, args.control_plane_qps,
               args.operator_path, floor=not args.no_floor)


if __name__ == "__main__":
    sys.exit(main())
