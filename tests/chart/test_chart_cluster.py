"""The chart installed into the real control plane (e2e's ``local_cluster``).

No container runtime exists here, so the operator pod the chart creates never really runs.
What is proven instead: the chart installs against the real API server; its ServiceAccount
can do exactly what the operator needs and nothing more (SubjectAccessReview); and the real
operator (``kvtune operator`` with the args the chart renders), run as a local process
authenticated AS that ServiceAccount (a TokenRequest token in a kubeconfig), reconciles an
example InferenceDeployment without a single permission error.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from op_cluster_helpers import PeeringReplica as Replica
from op_cluster_helpers import service_account_client, service_account_kubeconfig
from waiting import wait_for

from kvtune.e2e.operator_command import operator_executable

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/kvtune"
RELEASE_NS = "kvtune-system"
WATCHED_NS = "kvtune-pkg-e2e"
RUNTIME_NS = "kvtune-pkg-runtime"  # the cluster-mode release's runtime.namespaces
GROUP, VERSION, PLURAL = "kvtune.io", "v1alpha1", "inferencedeployments"

pytestmark = pytest.mark.cluster

# (verb, group, resource, subresource, namespace) the operator uses: docs/rbac.md.
NEEDED = [
    ("list", "kvtune.io", "inferencedeployments", "", WATCHED_NS),
    ("watch", "kvtune.io", "inferencedeployments", "", WATCHED_NS),
    ("get", "kvtune.io", "inferencedeployments", "", WATCHED_NS),
    ("patch", "kvtune.io", "inferencedeployments", "", WATCHED_NS),
    ("patch", "kvtune.io", "inferencedeployments", "status", WATCHED_NS),
    ("create", "apps", "deployments", "", WATCHED_NS),
    ("patch", "apps", "deployments", "", WATCHED_NS),
    ("get", "apps", "deployments", "", WATCHED_NS),
    ("delete", "apps", "deployments", "", WATCHED_NS),
    ("patch", "", "services", "", WATCHED_NS),
    ("patch", "policy", "poddisruptionbudgets", "", WATCHED_NS),
    # get: the ownership check before an apply (never take over someone else's object).
    ("get", "", "services", "", WATCHED_NS),
    ("get", "policy", "poddisruptionbudgets", "", WATCHED_NS),
    ("get", "", "configmaps", "", WATCHED_NS),
    ("patch", "monitoring.coreos.com", "prometheusrules", "", WATCHED_NS),
    ("delete", "monitoring.coreos.com", "prometheusrules", "", WATCHED_NS),
    ("patch", "monitoring.coreos.com", "podmonitors", "", WATCHED_NS),
    ("delete", "monitoring.coreos.com", "podmonitors", "", WATCHED_NS),
    ("patch", "monitoring.coreos.com", "servicemonitors", "", WATCHED_NS),
    ("create", "", "events", "", WATCHED_NS),
    # spec.runtime.entrypoint: kvtune: the pools' pods, to match the runtime's reports.
    ("list", "", "pods", "", WATCHED_NS),
    ("list", "", "nodes", "", ""),
    ("watch", "", "nodes", "", ""),
    ("watch", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
]
# The KV-quality calibration Job and its report ConfigMap (docs/quality.md): granted in the
# runtime namespaces only (cluster mode: runtime.namespaces; namespaced mode: the watched ones).
CALIBRATION = [("get", "batch", "jobs", ""), ("create", "batch", "jobs", ""),
               ("patch", "batch", "jobs", ""), ("list", "batch", "jobs", ""),
               ("create", "", "configmaps", ""), ("patch", "", "configmaps", "")]
CALIBRATION_NS = {"cluster": RUNTIME_NS, "namespaced": WATCHED_NS}
NOT_CALIBRATION_NS = {"cluster": WATCHED_NS, "namespaced": RUNTIME_NS}
FORBIDDEN = [
    ("get", "", "secrets", "", WATCHED_NS),
    ("list", "", "secrets", "", ""),
    ("delete", "kvtune.io", "inferencedeployments", "", WATCHED_NS),
    ("update", "kvtune.io", "inferencedeployments", "", WATCHED_NS),
    ("patch", "", "nodes", "", ""),
    ("create", "", "pods", "", WATCHED_NS),
    ("list", "", "configmaps", "", WATCHED_NS),
    ("delete", "batch", "jobs", "", WATCHED_NS),
    ("delete", "", "configmaps", "", WATCHED_NS),
    ("update", "kvtune.io", "inferencedeployments", "status", WATCHED_NS),
    ("watch", "apps", "deployments", "", WATCHED_NS),
    ("watch", "", "pods", "", WATCHED_NS),
    ("delete", "", "pods", "", WATCHED_NS),
    ("escalate", "rbac.authorization.k8s.io", "roles", "", WATCHED_NS),
    ("bind", "rbac.authorization.k8s.io", "roles", "", WATCHED_NS),
    ("bind", "rbac.authorization.k8s.io", "clusterroles", "", ""),
    # No pod writes, no RBAC writes, no ServiceAccount writes (issue 11).
    ("get", "", "pods", "", WATCHED_NS),
    ("patch", "", "pods", "", WATCHED_NS),
    ("patch", "", "pods", "", "kube-system"),
    ("create", "", "serviceaccounts", "", WATCHED_NS),
    ("patch", "", "serviceaccounts", "", "kube-system"),
    ("create", "", "serviceaccounts", "token", "kube-system"),
    ("create", "rbac.authorization.k8s.io", "roles", "", WATCHED_NS),
    ("patch", "rbac.authorization.k8s.io", "roles", "", WATCHED_NS),
    ("create", "rbac.authorization.k8s.io", "rolebindings", "", WATCHED_NS),
    ("patch", "rbac.authorization.k8s.io", "rolebindings", "", "kube-system"),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""),
    ("create", "rbac.authorization.k8s.io", "clusterroles", "", ""),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
]


@pytest.fixture(scope="module")
def helm() -> Path:
    from kvtune.e2e.binaries import ensure_built

    return ensure_built(["helm"])["helm"]


@pytest.fixture(scope="module")
def admin(local_cluster: Any) -> Any:
    return local_cluster.api_client()


def run_helm(helm: Path, kubeconfig: Path, *args: str) -> str:
    result = subprocess.run([str(helm), "--kubeconfig", str(kubeconfig), *args],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def releases(helm: Path, local_cluster: Any, admin: Any) -> Iterator[dict[str, str]]:
    """Two releases: "kvtune" cluster-wide (it owns the CRD) and "kvtune-ns" in namespaced
    mode watching one namespace (the one whose operator runs below)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(admin)
    for ns in (WATCHED_NS, RUNTIME_NS):
        try:
            core.create_namespace({"metadata": {"name": ns}})
        except ApiException as exc:
            if exc.status != 409:
                raise
    kubeconfig = local_cluster.kubeconfig_path
    # --take-ownership: other tests in this session may have created the CRD directly.
    out = run_helm(helm, kubeconfig, "install", "kvtune", str(CHART), "-n", RELEASE_NS,
                   "--create-namespace", "--take-ownership",
                   "--set", f"runtime.namespaces={{{RUNTIME_NS}}}")
    # NOTES.txt: what was installed and the next step.
    assert "kvtune 0.1.0 is installed in namespace kvtune-system" in out
    assert "Next step:" in out and "kvtune plan --from-cluster chat -n default -o patch" in out
    run_helm(helm, kubeconfig, "install", "kvtune-ns", str(CHART), "-n", RELEASE_NS,
             "--set", "operator.namespaced=true",
             "--set", f"operator.watchNamespaces={{{WATCHED_NS}}}",
             "--set", "crds.install=false", "--set", "rbac.aggregateToDefaultRoles=false")
    yield {"cluster": "kvtune", "namespaced": "kvtune-ns"}
    for release in ("kvtune-ns", "kvtune"):
        subprocess.run([str(helm), "--kubeconfig", str(kubeconfig), "uninstall", release,
                        "-n", RELEASE_NS, "--wait", "--timeout", "60s"],
                       capture_output=True, timeout=120, check=False)


def access_allowed(admin: Any, service_account: str, check: tuple[str, ...],
                   name: str | None = None) -> bool:
    from kubernetes import client

    verb, group, resource, subresource, namespace = check
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{RELEASE_NS}:{service_account}",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{RELEASE_NS}",
                "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            verb=verb, group=group, resource=resource, subresource=subresource or None,
            namespace=namespace or None, name=name)))
    result = client.AuthorizationV1Api(admin).create_subject_access_review(review)
    return bool(result.status.allowed)


def test_chart_objects_exist(releases: dict[str, str], admin: Any) -> None:
    from kubernetes import client

    apps = client.AppsV1Api(admin)
    for release in releases.values():
        deploy = apps.read_namespaced_deployment(release, RELEASE_NS)
        assert deploy.spec.replicas == 2
        client.CoreV1Api(admin).read_namespaced_service_account(release, RELEASE_NS)
    custom = client.CustomObjectsApi(admin)
    custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", "kvtune")
    custom.get_namespaced_custom_object("kopf.dev", "v1", WATCHED_NS, "kopfpeerings",
                                        "kvtune-ns")
    crd = client.ApiextensionsV1Api(admin).read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    assert crd.metadata.annotations["meta.helm.sh/release-name"] == "kvtune"


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
def test_service_account_can_do_exactly_what_the_operator_needs(
    releases: dict[str, str], admin: Any, mode: str
) -> None:
    sa = releases[mode]
    missing = [c for c in NEEDED if not access_allowed(admin, sa, c)]
    assert missing == [], f"{sa} lacks {missing}"
    excess = [c for c in FORBIDDEN if access_allowed(admin, sa, c)]
    assert excess == [], f"{sa} may do more than it needs: {excess}"
    calibration = [(*c, CALIBRATION_NS[mode]) for c in CALIBRATION]
    assert [c for c in calibration if not access_allowed(admin, sa, c)] == []
    elsewhere = [(*c, ns) for c in CALIBRATION
                 for ns in (NOT_CALIBRATION_NS[mode], "default", "kube-system", "")]
    assert [c for c in elsewhere if access_allowed(admin, sa, c)] == [], (
        "calibration rights outside the runtime namespaces")
    peering = ("patch", "kopf.dev", "kopfpeerings" if mode == "namespaced"
               else "clusterkopfpeerings", "", WATCHED_NS if mode == "namespaced" else "")
    # Patching peering objects is limited to this release's own (resourceNames).
    assert access_allowed(admin, sa, peering, name=sa)
    assert not access_allowed(admin, sa, peering, name="someone-elses-peering")
    assert not access_allowed(admin, sa, peering)
    if mode == "namespaced":
        # Nothing namespaced outside the watched namespace.
        assert not access_allowed(admin, sa, ("patch", "apps", "deployments", "", "default"))
        assert not access_allowed(admin, sa, ("list", "kvtune.io", PLURAL, "", "default"))


def test_two_replicas_as_the_chart_service_account_reconcile_an_example(
    releases: dict[str, str], admin: Any, local_cluster: Any, tmp_path: Path
) -> None:
    from kubernetes import client
    from kubernetes import config as kube_config

    sa = releases["namespaced"]
    kubeconfig = service_account_kubeconfig(admin, Path(local_cluster.kubeconfig_path),
                                            RELEASE_NS, sa, tmp_path / "sa.kubeconfig")
    # The token really is the ServiceAccount's: the API server says who we are.
    as_sa = kube_config.new_client_from_config(config_file=str(kubeconfig))
    review = client.AuthenticationV1Api(as_sa).create_self_subject_review(
        client.V1SelfSubjectReview())
    assert review.status.user_info.username == f"system:serviceaccount:{RELEASE_NS}:{sa}"

    # The operator with the args the chart renders, but no port on 0.0.0.0 here; two of
    # them, as the chart's two replicas, meeting in the chart's KopfPeering.
    deploy = client.AppsV1Api(admin).read_namespaced_deployment(sa, RELEASE_NS)
    assert deploy.spec.replicas == 2
    args = [a for a in deploy.spec.template.spec.containers[0].args
            if not a.startswith(("--liveness", "--metrics-"))]
    assert args[0] == "operator" and f"--namespace={WATCHED_NS}" in args
    argv = [str(operator_executable()), *args, "--metrics-port", "0",
            "--kubeconfig", str(kubeconfig)]
    # The pod's own namespace, as the chart's Deployment hands it down (the model
    # calibration ConfigMap lives there: operator/kube/model_calibrations.py).
    fields = {e.name: e.value_from.field_ref.field_path
              for e in deploy.spec.template.spec.containers[0].env or []
              if e.value_from is not None and e.value_from.field_ref is not None}
    assert fields.get("POD_NAMESPACE") == "metadata.namespace"
    pod_env = {"POD_NAMESPACE": RELEASE_NS}
    custom = client.CustomObjectsApi(admin)

    def peers() -> dict[str, Any]:
        peering = custom.get_namespaced_custom_object("kopf.dev", "v1", WATCHED_NS,
                                                      "kopfpeerings", sa)
        return dict(peering.get("status") or {})

    replicas: list[Replica] = []
    example = yaml.safe_load((REPO / "examples/support-bot.yaml").read_text())
    name = example["metadata"]["name"]
    try:
        replicas.append(Replica(argv, tmp_path / "operator-a.log", pod_env))
        wait_for(lambda: len(peers()) == 1, "replica a in the KopfPeering", 60, replicas[0].log)
        wait_for(replicas[0].active, "replica a, alone, to become active", 60, replicas[0].log)
        replicas.append(Replica(argv, tmp_path / "operator-b.log", pod_env))
        wait_for(lambda: len(peers()) == 2, "replica b in the KopfPeering", 60, replicas[1].log)
        # `kvtune operator` derives each replica's priority from $POD_NAME, here (no pod)
        # from host and pid: they must differ, or kopf pauses both.
        def derived_priority(r: Replica) -> int:
            who = f"{socket.gethostname()}-{r.proc.pid}"
            return int(hashlib.sha256(who.encode()).hexdigest()[:6], 16)

        assert sorted(p["priority"] for p in peers().values()) == sorted(
            derived_priority(r) for r in replicas)
        active = max(replicas, key=derived_priority)
        standby = replicas[1 - replicas.index(active)]
        wait_for(lambda: active.active() and not standby.active(),
                 "the higher-priority replica active, the other paused", 60, standby.log)
        _run_example(custom, admin, local_cluster, example, name, active, standby)
    finally:
        for replica in replicas:
            replica.stop()
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):  # not created when an earlier step failed
            custom.delete_namespaced_custom_object(GROUP, VERSION, WATCHED_NS, PLURAL, name)
    for replica in replicas:
        for complaint in ("Forbidden", "status=403", "Not enough permissions"):
            assert complaint not in replica.text(), (
                f"permission problem in {replica.log.name}:\n{replica.text()[-4000:]}")


def argocd_health_of(obj: dict[str, Any]) -> tuple[str, str]:
    """charts/kvtune/files/argocd/health.lua in Lua 5.1, as Argo CD runs it."""
    import lupa.lua51 as lua51

    runtime = lua51.LuaRuntime()

    def table(value: Any) -> Any:
        if isinstance(value, dict):
            return runtime.table_from({k: table(v) for k, v in value.items()})
        if isinstance(value, list):
            return runtime.table_from([table(v) for v in value])
        return value

    runtime.globals().obj = table(obj)
    hs = runtime.execute((CHART / "files/argocd/health.lua").read_text())
    return str(hs["status"]), str(hs["message"])


def _run_example(custom: Any, admin: Any, local_cluster: Any, example: dict[str, Any],
                 name: str, active: Replica, standby: Replica) -> None:
    from kubernetes import client

    # The demo's example (two pools, H200 and H100), moved into the watched namespace.
    example["metadata"]["namespace"] = WATCHED_NS

    def reconciled(replicas_wanted: int) -> Callable[[], dict[str, Any] | None]:
        def probe() -> dict[str, Any] | None:
            obj: dict[str, Any] = custom.get_namespaced_custom_object(
                GROUP, VERSION, WATCHED_NS, PLURAL, name)
            pools = (obj.get("status") or {}).get("pools") or []
            done = len(pools) == len(example["spec"]["pools"]) and all(
                p.get("plan") and p.get("deployment") and p.get("replicas") == replicas_wanted
                for p in pools)
            return obj if done else None
        return probe

    custom.create_namespaced_custom_object(GROUP, VERSION, WATCHED_NS, PLURAL, example)
    obj = wait_for(reconciled(2), f"{name} to get a plan and a Deployment per pool", 120,
                   active.log)
    for pool in obj["status"]["pools"]:
        rendered = client.AppsV1Api(admin).read_namespaced_deployment(pool["deployment"],
                                                                      WATCHED_NS)
        assert rendered.metadata.labels["app.kubernetes.io/managed-by"] == "kvtune"
    # The status is written before the handler logs its line: wait for the line.
    wait_for(lambda: "reconciled:" in active.text(), "the active replica's log line", 30,
             active.log)
    assert "reconciled:" not in standby.text(), "the standby replica handled the object"

    # Argo CD's view of the real object: the health check on the status the operator wrote.
    def argocd_health() -> str | None:
        live = custom.get_namespaced_custom_object(GROUP, VERSION, WATCHED_NS, PLURAL, name)
        status, message = argocd_health_of(live)
        return f"{status}: {message}" if status == "Healthy" else None

    wait_for(argocd_health, "Argo CD health Healthy once the pools rolled out", 90, active.log)

    # `kvtune plan --from-cluster` (the reviewer's side) reads the plan back as a patch.
    out = subprocess.run(
        [str(Path(sys.executable).parent / "kvtune"), "plan", "--from-cluster", name,
         "-n", WATCHED_NS, "--kubeconfig", str(local_cluster.kubeconfig_path),
         "-o", "patch"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith(f"# kvtune: pin the plan recommended for {WATCHED_NS}/{name}")
    patch = yaml.safe_load(out)
    pin = patch["spec"]["tuning"]["pin"]
    plans = [p["plan"] for p in obj["status"]["pools"]]
    for knob, value in pin.items():  # only what both pools' plans share is pinned
        assert all(plan.get(knob) == value for plan in plans), knob
    assert pin, "the two pools share no knob at all"
    # The patch applies: the API server's CEL rules and schema accept the pinned plan.
    custom.patch_namespaced_custom_object(GROUP, VERSION, WATCHED_NS, PLURAL, name,
                                          {"spec": patch["spec"]})

    # A restart of the active replica (rolling update, node drain) loses nothing: the
    # standby resumes and handles the next change.
    active.stop()
    wait_for(lambda: "Resuming operations" in standby.text(),
             "the standby replica to resume", 90, standby.log)
    pools = [{**p, "replicas": 3} for p in example["spec"]["pools"]]
    custom.patch_namespaced_custom_object(GROUP, VERSION, WATCHED_NS, PLURAL, name,
                                          {"spec": {"pools": pools}})
    wait_for(reconciled(3), "the former standby to reconcile the change", 120, standby.log)

    # Tuning off: Argo CD shows the application Suspended, not Degraded.
    custom.patch_namespaced_custom_object(GROUP, VERSION, WATCHED_NS, PLURAL, name,
                                          {"spec": {"tuning": {"mode": "off"}}})

    def suspended() -> bool:
        live = custom.get_namespaced_custom_object(GROUP, VERSION, WATCHED_NS, PLURAL, name)
        return argocd_health_of(live)[0] == "Suspended"

    wait_for(suspended, "Argo CD health Suspended with spec.tuning.mode off", 60, standby.log)


# --- issue 11: every account the chart creates, attacking with its own token -----------------

MALLORY = "mallory@example.com"


def _token_client(admin: Any, local_cluster: Any, namespace: str, sa: str) -> Any:
    """An ApiClient authenticated as ``namespace/sa`` by a TokenRequest token, as the pod
    would be."""
    return service_account_client(admin, Path(local_cluster.kubeconfig_path), namespace, sa)


def _deployment(namespace: str, *, privileged: bool = True, service_account: str | None = None,
                name: str = "pwn") -> dict[str, Any]:
    """A Deployment an attacker would want: privileged, the node's / mounted, on the host's
    network; labelled as kvtune's so only the content gives it away."""
    container: dict[str, Any] = {"name": "c", "image": "busybox",
                                 "volumeMounts": [{"name": "root", "mountPath": "/host"}]}
    spec: dict[str, Any] = {"containers": [container],
                            "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}
    if privileged:
        container["securityContext"] = {"privileged": True}
        spec["hostNetwork"] = True
    if service_account:
        spec["serviceAccountName"] = service_account
    labels = {"app": name, "kvtune.io/deployment": "chat"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


def _binding(kind: str, namespace: str | None, role_kind: str, role: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "pwn"}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": role},
            "subjects": [{"kind": "User", "name": MALLORY,
                          "apiGroup": "rbac.authorization.k8s.io"}]}


def _attacks(api: Any, release: str) -> dict[str, Callable[[], Any]]:
    """What a thief of this token would try, each a real request."""
    from kubernetes import client

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    swap_image = {"spec": {"containers": [{"name": "c", "image": "evil/image:latest"}]}}
    kvtune_role = f"{release}-rendered"
    return {
        "swap the image of a pod in kube-system":
            lambda: core.patch_namespaced_pod("victim", "kube-system", swap_image),
        "patch a pod in a watched namespace":
            lambda: core.patch_namespaced_pod("victim", WATCHED_NS, swap_image),
        "read a Secret in kube-system":
            lambda: core.list_namespaced_secret("kube-system"),
        "create a pod directly":
            lambda: core.create_namespaced_pod(WATCHED_NS, {
                "metadata": {"name": "pwn"}, "spec": {"containers": [
                    {"name": "c", "image": "busybox"}]}}),
        "bind kvtune's ClusterRole to mallory cluster-wide":
            lambda: rbac.create_cluster_role_binding(
                _binding("ClusterRoleBinding", None, "ClusterRole", kvtune_role)),
        "bind kvtune's ClusterRole to mallory in a watched namespace":
            lambda: rbac.create_namespaced_role_binding(
                WATCHED_NS, _binding("RoleBinding", WATCHED_NS, "ClusterRole", kvtune_role)),
        "bind kvtune's ClusterRole to mallory in kube-system":
            lambda: rbac.create_namespaced_role_binding(
                "kube-system", _binding("RoleBinding", "kube-system", "ClusterRole",
                                        kvtune_role)),
        "create a Role in a watched namespace":
            lambda: rbac.create_namespaced_role(WATCHED_NS, {
                "metadata": {"name": "pwn"}, "rules": [
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}),
        "annotate a ServiceAccount in kube-system":
            lambda: core.patch_namespaced_service_account("default", "kube-system", {
                "metadata": {"annotations": {"eks.amazonaws.com/role-arn": "arn:evil"}}}),
        "create a privileged hostPath / Deployment in kube-system":
            lambda: apps.create_namespaced_deployment("kube-system",
                                                      _deployment("kube-system")),
        "create a privileged hostPath / Deployment in a watched namespace":
            lambda: apps.create_namespaced_deployment(WATCHED_NS, _deployment(WATCHED_NS)),
        "run a Deployment as the operator's own ServiceAccount":
            lambda: apps.create_namespaced_deployment(WATCHED_NS, _deployment(
                WATCHED_NS, privileged=False, service_account=release)),
        "run a model server as the endpoint pickers' ServiceAccount":
            lambda: apps.create_namespaced_deployment(WATCHED_NS, _deployment(
                WATCHED_NS, privileged=False, service_account="kvtune-endpoint-picker")),
        "create a Deployment in the operator's namespace":
            lambda: apps.create_namespaced_deployment(RELEASE_NS, _deployment(
                RELEASE_NS, privileged=False)),
        "delete a Deployment kvtune did not create":
            lambda: apps.delete_namespaced_deployment("bystander", WATCHED_NS),
        "take over a Deployment kvtune did not create by labelling it":
            lambda: apps.patch_namespaced_deployment("bystander", WATCHED_NS, {
                "metadata": {"labels": {"kvtune.io/deployment": "chat"}},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "c", "image": "evil/image:latest"}]}}}}),
        "rewrite a tenant's pod-template ConfigMap":
            lambda: core.patch_namespaced_config_map("pod-template", WATCHED_NS, {
                "data": {"pod.yaml.j2": "evil"}}),
        "create a privileged hostPath / Job in a watched namespace":
            lambda: client.BatchV1Api(api).create_namespaced_job(WATCHED_NS, {
                "metadata": {"name": "pwn", "labels": {"kvtune.io/deployment": "chat"}},
                "spec": {"template": {
                    "metadata": {"labels": {"kvtune.io/deployment": "chat"}},
                    "spec": {**_deployment(WATCHED_NS)["spec"]["template"]["spec"],
                             "restartPolicy": "Never"}}}}),
    }


def _refused(attacks: dict[str, Callable[[], Any]]) -> list[str]:
    """The attacks that were NOT refused with 403 (each also reports its answer)."""
    from kubernetes.client.exceptions import ApiException

    allowed = []
    for what, attack in attacks.items():
        try:
            attack()
        except ApiException as exc:
            if exc.status != 403:
                allowed.append(f"{what}: answered {exc.status} {exc.reason}, not 403")
            continue
        allowed.append(f"{what}: ALLOWED")
    return allowed


@pytest.fixture(scope="module")
def victims(releases: dict[str, str], admin: Any) -> None:
    """A pod in kube-system and in the watched namespace, and a Deployment not kvtune's."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    for ns in ("kube-system", WATCHED_NS):
        with contextlib.suppress(ApiException):
            core.create_namespaced_pod(ns, {"metadata": {"name": "victim"}, "spec": {
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
    with contextlib.suppress(ApiException):
        core.create_namespaced_config_map(WATCHED_NS, {
            "metadata": {"name": "pod-template"}, "data": {"pod.yaml.j2": "x"}})
    bystander = _deployment(WATCHED_NS, privileged=False, name="bystander")
    bystander["metadata"]["labels"] = {"app": "bystander"}
    bystander["spec"]["template"]["metadata"]["labels"] = {"app": "bystander"}
    bystander["spec"]["template"]["spec"].pop("volumes")
    bystander["spec"]["template"]["spec"]["containers"][0].pop("volumeMounts")
    with contextlib.suppress(ApiException):
        apps.create_namespaced_deployment(WATCHED_NS, bystander)


def _wait_for_admission_policy(api: Any, release: str) -> None:
    """A ValidatingAdmissionPolicy takes effect a moment after it is created: poll with a
    dry run (authorized and admitted like the real call, never stored) until it refuses."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    def refused() -> bool:
        try:
            client.AppsV1Api(api).create_namespaced_deployment(
                WATCHED_NS, _deployment(WATCHED_NS, name="probe"), dry_run="All")
        except ApiException as exc:
            return exc.status == 403
        return False

    wait_for(refused, f"{release}'s ValidatingAdmissionPolicy to take effect", 60)


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
def test_the_operators_token_is_refused_every_escalation(
        releases: dict[str, str], admin: Any, local_cluster: Any, victims: None,
        mode: str) -> None:
    from kubernetes import client

    sa = releases[mode]
    api = _token_client(admin, local_cluster, RELEASE_NS, sa)
    for suffix in ("operator-writes", "operator-pods"):
        def checked(name: str = f"{sa}-{suffix}") -> Any:
            policy = client.AdmissionregistrationV1Api(admin).read_validating_admission_policy(
                name)
            return policy if policy.status and policy.status.observed_generation else None

        policy = wait_for(checked, f"{sa}-{suffix} type-checked", 60)
        # The API server type-checked every CEL expression of the chart's policies.
        assert not (policy.status.type_checking
                    and policy.status.type_checking.expression_warnings), policy.status
    # In the watched namespace RBAC lets both accounts create Deployments: only the policy
    # refuses a privileged one.
    _wait_for_admission_policy(api, sa)
    assert _refused(_attacks(api, sa)) == []
    # Not a token that can do nothing: what the operator does is still allowed (a dry run
    # of a kvtune Deployment as the renderer makes them, and reading pods).
    harmless = _deployment(WATCHED_NS, privileged=False, name="chat-h200")
    # Its selector is kvtune's own (issue 25: the policy refuses a selector over other pods).
    harmless["spec"]["selector"] = {"matchLabels": {"kvtune.io/deployment": "chat"}}
    spec = harmless["spec"]["template"]["spec"]
    spec.pop("volumes")
    spec["containers"][0].pop("volumeMounts")
    client.AppsV1Api(api).create_namespaced_deployment(WATCHED_NS, harmless, dry_run="All")
    client.CoreV1Api(api).list_namespaced_pod(WATCHED_NS)
    # A pool's endpoint picker as kvtune renders it runs as its own ServiceAccount.
    from kvtune.operator.routing import endpoint_picker

    picker = endpoint_picker.deployment(
        picker="chat-h200-epp", namespace=WATCHED_NS, pool_name="chat-h200",
        labels={"kvtune.io/deployment": "chat", "kvtune.io/pool": "h200"},
        config_key="epp-config.yaml", config_text="")
    client.AppsV1Api(api).create_namespaced_deployment(WATCHED_NS, picker, dry_run="All")


def _calibration_objects(namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A calibration Job and report ConfigMap as kvtune renders them (labelled as its own,
    harmless content): only where they are written decides."""
    labels = {"kvtune.io/deployment": "chat", "kvtune.io/kv-quality": "calibration"}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "chat-kvq-0123abcd", "namespace": namespace, "labels": labels},
           "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": {
               "restartPolicy": "Never",
               "containers": [{"name": "vllm", "image": "busybox"}]}}}}
    report = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "kvtune-kvq-0123456789", "namespace": namespace,
                           "labels": {"kvtune.io/deployment": "chat",
                                      "kvtune.io/kv-quality": "report"}},
              "data": {"report.json": "{}"}}
    return job, report


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
def test_the_operators_token_writes_calibration_objects_only_in_runtime_namespaces(
        releases: dict[str, str], admin: Any, local_cluster: Any, mode: str) -> None:
    """The KV-quality grant is a Role per runtime namespace, not cluster-wide: with the
    operator's own token a calibration Job or report ConfigMap outside them is refused (403)
    by the real API server; inside them the same writes pass (dry run)."""
    from kubernetes import client

    sa = releases[mode]
    api = _token_client(admin, local_cluster, RELEASE_NS, sa)
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    attacks: dict[str, Callable[[], Any]] = {}
    for ns in (NOT_CALIBRATION_NS[mode], "default"):
        job, report = _calibration_objects(ns)
        attacks |= {
            f"create a calibration Job in {ns}":
                lambda ns=ns, job=job: batch.create_namespaced_job(ns, job),
            f"apply a calibration Job in {ns}":
                lambda ns=ns, job=job: batch.patch_namespaced_job(
                    job["metadata"]["name"], ns, job, field_manager="kvtune", force=True,
                    _content_type="application/apply-patch+yaml"),
            f"create a report ConfigMap in {ns}":
                lambda ns=ns, report=report: core.create_namespaced_config_map(ns, report),
            f"apply a report ConfigMap in {ns}":
                lambda ns=ns, report=report: core.patch_namespaced_config_map(
                    report["metadata"]["name"], ns, report, field_manager="kvtune",
                    force=True, _content_type="application/apply-patch+yaml"),
        }
    assert _refused(attacks) == []
    inside = CALIBRATION_NS[mode]
    job, report = _calibration_objects(inside)
    batch.create_namespaced_job(inside, job, dry_run="All")
    core.create_namespaced_config_map(inside, report, dry_run="All")


def test_outside_the_runtime_namespaces_a_pool_rolls_out_without_a_calibration_job(
        releases: dict[str, str], admin: Any, local_cluster: Any) -> None:
    """The operator, as the cluster-mode release's token, reconciles an InferenceDeployment
    whose plan wants an unmeasured narrower KV cache (lowestKVPrecision: int4) in a namespace
    outside runtime.namespaces: the Job is refused (403), which is no failure: no Job, the
    pool applied and not Degraded. The gate fails closed (issue 25): the pool keeps 16-bit
    KV, status.kvQuality is Unverified with the reason and the fix, and the condition
    KVQualityVerified is False/KVQualityUnmeasurable (before: int4 rolled out unmeasured,
    Ready=True). With spec.quality.acceptUnverified the narrower dtype rolls out, said so."""
    from kubernetes import client
    from op_samples import SAMPLE_SPEC

    from kvtune.operator.kube import apply as kapply
    from kvtune.operator.reconcile import reconcile

    ns = "kvtune-pkg-nocal"
    core = client.CoreV1Api(admin)
    with contextlib.suppress(Exception):
        core.create_namespace({"metadata": {"name": ns}})
    spec = yaml.safe_load(yaml.safe_dump(SAMPLE_SPEC))
    spec["pools"] = [{"gpuClass": "H200", "replicas": 1, "tensorParallel": 1}]
    spec.pop("rollout", None)
    spec["workload"]["concurrentSequences"] = 200  # 16-bit KV holds too few: fp8 is planned
    spec["quality"] = {"lowestKVPrecision": "int4",
                       "calibration": {"image": "ghcr.io/kvtune/kvtune-quality:0.1.0"}}
    custom = client.CustomObjectsApi(admin)
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
        "metadata": {"name": "chat", "namespace": ns}, "spec": spec})
    try:
        as_operator = kapply.Kube(_token_client(admin, local_cluster, RELEASE_NS,
                                                releases["cluster"]))
        body = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat")
        reconcile(body, kube=as_operator)
        status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                     "chat")["status"]
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "False", degraded
        kvq = status["kvQuality"]
        # The planned narrower dtype cannot be measured: Unverified, and the wider dtype stays.
        assert kvq["phase"] == "Unverified" and "pool h200: " in kvq["message"], kvq
        assert f"may not run calibration Jobs in namespace {ns} (403)" in kvq["message"], kvq
        assert "runtime.namespaces" in kvq["message"]
        assert "the wider dtype stays" in kvq["message"], kvq
        assert status["pools"][0]["plan"]["kvCacheDtype"] == "auto", status["pools"][0]
        verified = next(c for c in status["conditions"] if c["type"] == "KVQualityVerified")
        assert (verified["status"], verified["reason"]) == ("False", "KVQualityUnmeasurable")
        assert "spec.quality.acceptUnverified" in verified["message"]
        assert client.BatchV1Api(admin).list_namespaced_job(ns).items == []
        dep = client.AppsV1Api(admin).read_namespaced_deployment("chat-h200", ns)
        args = dep.spec.template.spec.containers[0].args or []
        assert not any(a.startswith("--kv-cache-dtype=") and a != "--kv-cache-dtype=auto"
                       for a in args), args
        # The spec accepts unverified dtypes: the narrower one rolls out, said so.
        custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat", {
            "spec": {"quality": {"acceptUnverified": True}}})
        reconcile(custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat"),
                  kube=as_operator)
        status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                     "chat")["status"]
        assert status["pools"][0]["plan"]["kvCacheDtype"] != "auto", status["pools"][0]
        assert "rolled out unmeasured" in status["kvQuality"]["message"]
        verified = next(c for c in status["conditions"] if c["type"] == "KVQualityVerified")
        assert (verified["status"], verified["reason"]) == ("False", "AcceptedUnverified")
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat")


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
def test_the_runtimes_token_may_write_its_reports_and_nothing_else(
        releases: dict[str, str], admin: Any, local_cluster: Any, victims: None,
        mode: str) -> None:
    from kubernetes import client

    ns = RUNTIME_NS if mode == "cluster" else WATCHED_NS
    api = _token_client(admin, local_cluster, ns, "kvtune-runtime")
    core = client.CoreV1Api(api)
    # What it is for: a report under its pod's name in the reports ConfigMap.
    core.patch_namespaced_config_map("kvtune-runtime-reports", ns,
                                     {"data": {"chat-h200-abc": '{"started": true}'}})
    core.read_namespaced_config_map("kvtune-runtime-reports", ns)
    swap_image = {"spec": {"containers": [{"name": "c", "image": "evil/image:latest"}]}}
    with contextlib.suppress(Exception):
        client.CoreV1Api(admin).create_namespaced_config_map(ns, {
            "metadata": {"name": "pod-template"}, "data": {"pod.yaml.j2": "x"}})
    attacks = {
        "patch a pod in its own namespace":
            lambda: core.patch_namespaced_pod("victim", WATCHED_NS, swap_image),
        "patch a pod in kube-system":
            lambda: core.patch_namespaced_pod("victim", "kube-system", swap_image),
        "list pods": lambda: core.list_namespaced_pod(ns),
        "rewrite a tenant's pod template ConfigMap":
            lambda: core.patch_namespaced_config_map("pod-template", ns,
                                                     {"data": {"pod.yaml.j2": "evil"}}),
        "read another ConfigMap": lambda: core.read_namespaced_config_map("pod-template", ns),
        "create a ConfigMap": lambda: core.create_namespaced_config_map(ns, {
            "metadata": {"name": "pwn"}}),
        "read Secrets": lambda: core.list_namespaced_secret(ns),
        "write the reports of another namespace":
            lambda: core.patch_namespaced_config_map(
                "kvtune-runtime-reports", WATCHED_NS if ns == RUNTIME_NS else RUNTIME_NS,
                {"data": {"x": "{}"}}),
        "create a Deployment": lambda: client.AppsV1Api(api).create_namespaced_deployment(
            ns, _deployment(ns, privileged=False)),
    }
    assert _refused(attacks) == []


def test_with_routing_the_operator_reads_only_the_endpoint_pickers_service_account(
        helm: Path, admin: Any) -> None:
    """The chart's routing concern (routing.enabled), bound to a probe account in the real
    API server's authorizer: RoutingReady's check may get the ServiceAccount
    kvtune-endpoint-picker and the HTTPRoute (its status comes with it), and no other
    ServiceAccount, no list, no write."""
    from kubernetes import client

    out = subprocess.run([str(helm), "template", "kvtune", str(CHART), "-n", RELEASE_NS,
                          "--set", "routing.enabled=true"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    (concern,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "ClusterRole"
                  and any("serviceaccounts" in r["resources"] for r in d["rules"])]
    probe = "kvtune-routing-probe"
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_cluster_role({"metadata": {"name": probe}, "rules": concern["rules"]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": probe},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": probe},
        "subjects": [{"kind": "ServiceAccount", "name": probe, "namespace": RELEASE_NS}]})
    try:
        get_sa = ("get", "", "serviceaccounts", "", "llm")
        assert wait_for(lambda: access_allowed(admin, probe, get_sa,
                                               name="kvtune-endpoint-picker"),
                        "the probe's binding to take effect", 30)
        assert access_allowed(admin, probe, ("get", "gateway.networking.k8s.io", "httproutes",
                                             "", "llm"), name="chat")
        for denied, name in [(get_sa, "default"), (get_sa, "kvtune-runtime"), (get_sa, None),
                             (("list", "", "serviceaccounts", "", "llm"), None),
                             (("watch", "", "serviceaccounts", "", "llm"), None),
                             (("patch", "", "serviceaccounts", "", "llm"),
                              "kvtune-endpoint-picker"),
                             (("create", "", "serviceaccounts", "token", "llm"),
                              "kvtune-endpoint-picker")]:
            assert not access_allowed(admin, probe, denied, name=name), (denied, name)
    finally:
        rbac.delete_cluster_role_binding(probe)
        rbac.delete_cluster_role(probe)
