"""The chart's admission policy against the operator's own token on the real API server
(issue 25, item 2): every kind kvtune writes, to the shapes kvtune renders.

A release of the chart (cluster mode, routing on, one runtime namespace) is installed on the
local control plane with the Prometheus operator's CRDs (as tests/operator/test_op_monitors.py
installs them), the Gateway API's and the Inference Extension's. Each attack is a real request
made with a TokenRequest token of the chart's ServiceAccount, in a namespace where RBAC lets
that token write the kind: only the ValidatingAdmissionPolicy stands in the way, so each must
end 403 with the policy's own message (``kvtune: …``). The positive control: what kvtune's own
renderers make (operator/render/objects.py, routing.py, endpoint_picker.py, http_route.py,
monitors.py, alerts.py, calibration.py, search_jobs.py, apply.post_event) is admitted, as a
server-side dry run with the same token.
"""

from __future__ import annotations

import contextlib
import copy
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from op_cluster_helpers import (
    create_infd,
    ensure_namespace,
    install_crd,
    service_account_client,
)
from op_samples import SAMPLE_SPEC, make_pool_plan
from waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/kvtune"
RELEASE, RELEASE_NS = "kvtune-adm", "kvtune-adm-system"
NS = "adm-tenant"  # the release's runtime namespace: RBAC grants every kind kvtune writes
OWNER = "chat"
LABELS = {"kvtune.io/deployment": OWNER}
MON = ("monitoring.coreos.com", "v1")
APPLY = "application/apply-patch+yaml"

pytestmark = pytest.mark.cluster


def _monitoring_crd(kind: str, plural: str) -> dict[str, Any]:
    """The Prometheus operator's kind, reduced to what the API server needs to store it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                           "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                     "openAPIV3Schema": {"type": "object",
                                         "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


def _install_crds(admin: Any) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kvtune.e2e.inference_extension import crd_paths, gateway_api_crd_paths
    from kvtune.e2e.leader_worker_set import crd_path as lws_crd_path

    install_crd(admin)
    # LeaderWorkerSet v0.9.0's own CRD (the Go module's): a multi-node pool's kind.
    for path in [*crd_paths(), *gateway_api_crd_paths("experimental"), lws_crd_path()]:
        install_crd(admin, path)
    ext = client.ApiextensionsV1Api(admin)
    for kind, plural in (("PodMonitor", "podmonitors"), ("ServiceMonitor", "servicemonitors"),
                         ("PrometheusRule", "prometheusrules")):
        with contextlib.suppress(ApiException):  # 409: another test installed it
            ext.create_custom_resource_definition(_monitoring_crd(kind, plural))

        def established(plural: str = plural) -> bool:
            crd = ext.read_custom_resource_definition(f"{plural}.monitoring.coreos.com")
            return any(c.type == "Established" and c.status == "True"
                       for c in crd.status.conditions or [])

        wait_for(established, f"{plural}.monitoring.coreos.com established", 30)


def _victims(admin: Any) -> None:
    """What the token must not touch: a tenant's pods, rule and Secret, a rule in
    kube-system (labelled as kvtune's: only the namespace refuses it), an
    InferenceDeployment."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    with contextlib.suppress(ApiException):
        core.create_namespaced_secret(NS, {"metadata": {"name": "db"},
                                           "stringData": {"password": "hunter2"}})
    with contextlib.suppress(ApiException):
        core.create_namespaced_pod(NS, {"metadata": {"name": "db-0", "labels": {"app": "db"}},
                                        "spec": {"containers": [{"name": "c",
                                                                 "image": "postgres"}]}})
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "spec": {"groups": [{"name": "db", "rules": [{"alert": "DBDown",
                                                           "expr": "up == 0"}]}]}}
    for ns, name, labels in ((NS, "db-alerts", {"team": "db"}),
                             ("kube-system", "chat-kvtune", LABELS)):
        with contextlib.suppress(ApiException):
            custom.create_namespaced_custom_object(*MON, ns, "prometheusrules", {
                **rule, "metadata": {"name": name, "labels": labels}})
    with contextlib.suppress(ApiException):
        create_infd(admin, NS, OWNER, copy.deepcopy(SAMPLE_SPEC))


@pytest.fixture(scope="module")
def admin(local_cluster: Any) -> Any:
    return local_cluster.api_client()


@pytest.fixture(scope="module")
def token(local_cluster: Any, admin: Any) -> Iterator[Any]:
    """The release installed; an ApiClient with the chart's ServiceAccount's token."""
    from kvtune.e2e.binaries import ensure_built

    helm = ensure_built(["helm"])["helm"]
    for ns in (NS, RELEASE_NS):
        ensure_namespace(admin, ns)
    _install_crds(admin)
    kubeconfig = Path(local_cluster.kubeconfig_path)
    result = subprocess.run(
        [str(helm), "--kubeconfig", str(kubeconfig), "install", RELEASE, str(CHART), "-n",
         RELEASE_NS, "--set", "crds.install=false", "--set", "routing.enabled=true",
         "--set", "rbac.aggregateToDefaultRoles=false",
         "--set", f"runtime.namespaces={{{NS}}}"],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    _victims(admin)
    api = service_account_client(admin, kubeconfig, RELEASE_NS, RELEASE)
    _wait_for_policies(admin, api)
    yield api
    subprocess.run([str(helm), "--kubeconfig", str(kubeconfig), "uninstall", RELEASE, "-n",
                    RELEASE_NS, "--wait", "--timeout", "60s"],
                   capture_output=True, timeout=120, check=False)


def _wait_for_policies(admin: Any, api: Any) -> None:
    """Type-checked by the API server with no warning, then in force (a dry run of a NodePort
    Service, which only the newest policy refuses)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    adm = client.AdmissionregistrationV1Api(admin)
    for suffix in ("operator-writes", "operator-pods", "operator-lws-leaders",
                   "operator-lws-workers", "operator-shapes"):
        def checked(name: str = f"{RELEASE}-{suffix}") -> Any:
            policy = adm.read_validating_admission_policy(name)
            return policy if policy.status and policy.status.observed_generation else None

        policy = wait_for(checked, f"{RELEASE}-{suffix} type-checked", 60)
        assert not (policy.status.type_checking
                    and policy.status.type_checking.expression_warnings), policy.status

    def refused() -> bool:
        try:
            client.CoreV1Api(api).create_namespaced_service(
                NS, _service(type="NodePort"), dry_run="All")
        except ApiException as exc:
            return exc.status == 403
        return False

    wait_for(refused, "the admission policies to take effect", 60)


# --- what kvtune renders --------------------------------------------------------------------

def _pool_objects() -> list[dict[str, Any]]:
    """Deployment, Service and PodDisruptionBudget of one pool, as the renderer makes them."""
    from kvtune.operator.render.objects import RenderInput, render_pool

    return render_pool(RenderInput(
        name=OWNER, namespace=NS, pool="h200", pool_plan=make_pool_plan(),
        model_name="meta-llama/Llama-3.1-8B-Instruct", image="vllm/vllm-openai:v0.33.0",
        replicas=1, revision=1, entrypoint="kvtune"))


def _group_objects() -> list[dict[str, Any]]:
    """A pool whose replicas span 2 nodes (DP16+EP, 8 engines a node): LeaderWorkerSet,
    Service and PodDisruptionBudget, as the renderer makes them."""
    from kvtune.operator.render.objects import RenderInput, render_pool
    from kvtune.tuner.layout import ParallelLayout

    plan = make_pool_plan().model_copy(update={"layout": ParallelLayout(
        tensor_parallel=1, data_parallel=16, expert_parallel=True)})
    return render_pool(RenderInput(
        name=OWNER, namespace=NS, pool="h100", pool_plan=plan,
        model_name="deepseek-ai/DeepSeek-V3", image="vllm/vllm-openai:v0.33.0", replicas=2,
        revision=1, entrypoint="kvtune", nodes_per_replica=2))


def _kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(o for o in objects if o["kind"] == kind))


def _service(**spec: Any) -> dict[str, Any]:
    svc = _kind(_pool_objects(), "Service")
    svc["metadata"]["name"] = "pwn"
    svc["spec"].update(spec)
    return svc


def _routing_objects() -> list[dict[str, Any]]:
    from kvtune.operator.render.objects import LABEL_POOL
    from kvtune.operator.routing import inference_pool as routing

    return routing.routing_objects(name=OWNER, namespace=NS, pool="h200",
                                   pool_plan=make_pool_plan(),
                                   labels={**LABELS, LABEL_POOL: "h200"}, multi_turn=True)


def _http_route() -> dict[str, Any]:
    from kvtune.operator.routing import http_route

    return http_route.http_route(
        name=OWNER, namespace=NS, labels=dict(LABELS),
        gateway=http_route.GatewayRef("inference-gateway", "gateways", "https"),
        pools=[http_route.PoolRoute("chat-h100", 8192, 2),
               http_route.PoolRoute("chat-h200", 32768, 1)],
        session_header="x-session-id", length_header="x-prompt-tokens")


def _infd_body() -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["monitoring"] = {"scrape": {"enabled": True}, "prometheusRule": {"enabled": True}}
    spec["slo"] = {"ttftP95": "2s", "tpotP95": "50ms"}
    return {"metadata": {"name": OWNER, "namespace": NS, "uid": "u1"}, "spec": spec}


def _monitors(kind: str) -> list[dict[str, Any]]:
    from kvtune.operator.prometheus import monitors

    body = _infd_body()
    body["spec"]["monitoring"]["scrape"]["kind"] = kind
    body["spec"]["monitoring"]["scrape"]["interval"] = "15s"
    return monitors.scrape_monitors(body)


def _prometheus_rule() -> dict[str, Any]:
    from kvtune.operator.prometheus import monitors

    rule = monitors.prometheus_rule(_infd_body())
    assert rule is not None
    return rule


def _calibration() -> tuple[dict[str, Any], dict[str, Any]]:
    from kvtune.operator.calibration import calibration_job as calibration

    job = calibration.render_job(
        deployment=_kind(_pool_objects(), "Deployment"), name="chat-kvq-1", namespace=NS,
        model="meta-llama/Llama-3.1-8B-Instruct", revision="r1", dtypes=["fp8"],
        image="ghcr.io/kvtune/kvtune-quality:0.1.0", timeout_seconds=1800,
        max_prompt_tokens=1024, labels=dict(LABELS))
    report = calibration.report_config_map(
        name="kvtune-kvq-0123456789", namespace=NS, model="m", revision="r1",
        report={"measurements": []}, labels=dict(LABELS))
    return job, report


def _search_job() -> tuple[dict[str, Any], dict[str, Any]]:
    """A pool's search Job and its ConfigMap with input and answer
    (operator/search/search_jobs.py)."""
    from kvtune.operator.search import search_jobs
    from kvtune.tuner.facts.catalog import get_model
    from kvtune.tuner.facts.gpus import get_gpu_class
    from kvtune.tuner.planner.planning import PlanRequest
    from kvtune.tuner.planner.presets import preset_profile
    from kvtune.tuner.simulator.search_job import SearchError, SearchInput, SearchOutcome, encode

    doc = SearchInput(request=PlanRequest(
        model=get_model("meta-llama/Llama-3.1-8B-Instruct"), gpu=get_gpu_class("H100"),
        profile=preset_profile("chat").model_copy(update={"request_rate_per_second": 2.0})),
        cpu_seconds=30.0)
    name, labels = "chat-h100-search-0123456789", search_jobs.labels(OWNER, "h100",
                                                                      doc.digest())
    job = search_jobs.render_job(name=name, namespace=NS, doc=doc, labels=labels,
                                 s=search_jobs.JobSettings(mode="job", image="kvtune:0.1.0"))
    kept = search_jobs.result_config_map(search_jobs.input_config_map(
        name=name, namespace=NS, doc=doc, labels=labels), encode(SearchOutcome(
            digest=doc.digest(), error=SearchError(kind="NoFeasiblePlan", message="x"))))
    return job, kept


# --- the requests -----------------------------------------------------------------------------

def _create(api: Any, obj: dict[str, Any], *, dry_run: bool = True,
            namespace: str = NS) -> Any:
    """Create ``obj`` (any kind kvtune writes) with ``api``'s token."""
    from kubernetes import client

    group_version, kind = obj["apiVersion"], obj["kind"]
    dry = {"dry_run": "All"} if dry_run else {}
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    native: dict[str, Callable[..., Any]] = {
        "Deployment": apps.create_namespaced_deployment,
        "Service": core.create_namespaced_service,
        "ConfigMap": core.create_namespaced_config_map,
        "Event": core.create_namespaced_event,
        "Job": client.BatchV1Api(api).create_namespaced_job,
        "PodDisruptionBudget": client.PolicyV1Api(api).create_namespaced_pod_disruption_budget,
    }
    if kind in native:
        return native[kind](namespace, obj, **dry)
    group, version = group_version.split("/")
    plural = {"InferencePool": "inferencepools", "HTTPRoute": "httproutes",
              "PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors",
              "PrometheusRule": "prometheusrules",
              "LeaderWorkerSet": "leaderworkersets"}[kind]
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        group, version, namespace, plural, obj, **dry)


def _deployment_with(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """kvtune's own Deployment of the pool, changed in its pod spec by ``change``."""
    dep = _kind(_pool_objects(), "Deployment")
    dep["metadata"]["name"] = "pwn"
    change(dep["spec"]["template"]["spec"])
    return dep


def _container(spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = spec["containers"][0]
    return container


def _group_with(key: str | None, change: Callable[[dict[str, Any]], None],
                *, leader: bool = True) -> dict[str, Any]:
    """kvtune's own LeaderWorkerSet of a pool over 2 nodes, changed in the pod spec of its
    template ``key`` (leaderTemplate, workerTemplate); ``leader=False`` drops the
    leaderTemplate (LWS then makes the leader from the workerTemplate)."""
    group = _kind(_group_objects(), "LeaderWorkerSet")
    group["metadata"]["name"] = "pwn"
    templates = group["spec"]["leaderWorkerTemplate"]
    if not leader:
        del templates["leaderTemplate"]
    if key is not None:
        change(templates[key]["spec"])
    return group


def _group_attacks(api: Any) -> dict[str, Callable[[], Any]]:
    """A tenant's template through a LeaderWorkerSet: each of its two templates, and the
    worker's alone when it is also the leader's."""
    def group(key: str, change: Callable[[dict[str, Any]], None],
              leader: bool = True) -> Callable[[], Any]:
        return lambda: _create(api, _group_with(key, change, leader=leader))

    mount = {"name": "db", "secret": {"secretName": "db"}}
    secret_env = {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}
    attacks: dict[str, Callable[[], Any]] = {}
    for key in ("leaderTemplate", "workerTemplate"):
        attacks |= {
            f"{key}: mount the namespace's Secret": group(
                key, lambda s: s["volumes"].append(mount)),
            f"{key}: read the Secret with env secretKeyRef": group(
                key, lambda s: _container(s)["env"].append(secret_env)),
            f"{key}: pin the pod to a node (nodeName)": group(
                key, lambda s: s.update(nodeName="control-plane-0")),
            f"{key}: tolerate every taint": group(
                key, lambda s: s.update(tolerations=[{"operator": "Exists"}])),
            f"{key}: a system priority class": group(
                key, lambda s: s.update(priorityClassName="system-node-critical")),
            f"{key}: run as root": group(key, lambda s: _container(s).update(
                securityContext={"runAsUser": 0})),
            f"{key}: allow privilege escalation": group(key, lambda s: _container(s).update(
                securityContext={"allowPrivilegeEscalation": True})),
            f"{key}: privileged": group(key, lambda s: _container(s).update(
                securityContext={"privileged": True})),
            f"{key}: host network": group(key, lambda s: s.update(hostNetwork=True)),
            # A custom resource's template is stored as written: the deprecated alias would
            # reach the pods the LWS controller makes as their serviceAccountName.
            f"{key}: another ServiceAccount by the deprecated alias": group(
                key, lambda s: s.update(serviceAccount="kvtune")),
            f"{key}: the endpoint picker's ServiceAccount": group(
                key, lambda s: s.update(serviceAccountName="kvtune-endpoint-picker")),
        }
    attacks |= {
        "no leaderTemplate, the workers' (and leader's) mounts the Secret": group(
            "workerTemplate", lambda s: s["volumes"].append(mount), leader=False),
        "no leaderTemplate, the workers' (and leader's) on a named node": group(
            "workerTemplate", lambda s: s.update(nodeName="control-plane-0"), leader=False),
    }
    return attacks


def _pod_attacks(api: Any) -> dict[str, Callable[[], Any]]:
    def deploy(change: Callable[[dict[str, Any]], None]) -> Callable[[], Any]:
        return lambda: _create(api, _deployment_with(change))

    secret_env = {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}
    return {
        "mount the namespace's Secret as a volume": deploy(lambda s: s["volumes"].append(
            {"name": "db", "secret": {"secretName": "db"}})),
        "project the namespace's Secret into a volume": deploy(lambda s: s["volumes"].append(
            {"name": "db", "projected": {"sources": [{"secret": {"name": "db"}}]}})),
        "read the Secret with env secretKeyRef": deploy(
            lambda s: _container(s)["env"].append(secret_env)),
        "read the Secret with envFrom": deploy(
            lambda s: _container(s).setdefault("envFrom", []).append(
                {"secretRef": {"name": "db"}})),
        "use the namespace's pull secret": deploy(
            lambda s: s.update(imagePullSecrets=[{"name": "db"}])),
        "run as root": deploy(lambda s: _container(s).update(
            securityContext={"runAsUser": 0})),
        "add the SYS_ADMIN capability": deploy(lambda s: _container(s).update(
            securityContext={"capabilities": {"add": ["SYS_ADMIN"]}})),
        "allow privilege escalation": deploy(lambda s: _container(s).update(
            securityContext={"allowPrivilegeEscalation": True})),
        "seccomp Unconfined on the container": deploy(lambda s: _container(s).update(
            securityContext={"seccompProfile": {"type": "Unconfined"}})),
        "seccomp Unconfined on the pod": deploy(lambda s: s.update(
            securityContext={"seccompProfile": {"type": "Unconfined"}})),
        "bind a hostPort from an init container": deploy(lambda s: s.update(initContainers=[
            {"name": "init", "image": "busybox",
             "ports": [{"containerPort": 22, "hostPort": 22}]}])),
        "set an unsafe sysctl": deploy(lambda s: s.update(securityContext={
            "sysctls": [{"name": "kernel.msgmax", "value": "65536"}]})),
        "mount an NFS export": deploy(lambda s: s["volumes"].append(
            {"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}})),
        "adopt a tenant's pods with the Deployment's selector": lambda: _create(api, {
            **_deployment_with(lambda s: None), "spec": {
                **_deployment_with(lambda s: None)["spec"],
                "selector": {"matchLabels": {"app": "db"}},
                "template": {**_deployment_with(lambda s: None)["spec"]["template"],
                             "metadata": {"labels": {"app": "db", **LABELS}}}}}),
        "a calibration Job that mounts the Secret": lambda: _create(api, _job_with_secret()),
    }


def _job_with_secret() -> dict[str, Any]:
    job, _ = _calibration()
    job["spec"]["template"]["spec"]["volumes"].append(
        {"name": "db", "secret": {"secretName": "db"}})
    return job


def _event(involved: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "forged.", "namespace": namespace},
            "involvedObject": involved, "type": "Warning", "reason": "NodeCompromised",
            "message": "forged", "source": {"component": "kubelet"}}


def _other_attacks(api: Any) -> dict[str, Callable[[], Any]]:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    pdb = _kind(_pool_objects(), "PodDisruptionBudget")
    pdb["metadata"]["name"] = "pwn"
    foreign_pdb = copy.deepcopy(pdb)
    foreign_pdb["spec"]["selector"] = {"matchLabels": {"app": "db"}}
    blocking_pdb = copy.deepcopy(pdb)
    blocking_pdb["spec"]["maxUnavailable"] = 0
    pool = _kind(_routing_objects(), "InferencePool")
    pool["spec"]["selector"] = {"matchLabels": {"app": "db"}}
    claimed = _http_route()
    claimed["spec"]["hostnames"] = ["bank.example.com"]
    mirrored = _http_route()
    mirrored["spec"]["rules"][-1]["filters"] = [{"type": "RequestMirror", "requestMirror": {
        "backendRef": {"name": "db", "port": 5432}}}]
    to_service = _http_route()
    to_service["spec"]["rules"][-1]["backendRefs"] = [{"name": "db", "port": 5432}]
    leaky_sm = _monitors("ServiceMonitor")[0]
    leaky_sm["spec"]["endpoints"][0]["bearerTokenSecret"] = {"name": "db", "key": "password"}
    wide_pm = _monitors("PodMonitor")[0]
    wide_pm["spec"]["namespaceSelector"] = {"any": True}
    foreign_pm = _monitors("PodMonitor")[0]
    foreign_pm["spec"]["selector"] = {"matchLabels": {"app": "db"}}
    recording = _prometheus_rule()
    recording["spec"]["groups"][0]["rules"].append({"record": "up", "expr": "vector(1)"})
    foreign_group = _prometheus_rule()
    foreign_group["spec"]["groups"][0]["name"] = "db"
    kvtune_event = {"apiVersion": "kvtune.io/v1alpha1", "kind": "InferenceDeployment",
                    "name": OWNER, "namespace": NS}
    template = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "pod-template", "labels": dict(LABELS)},
                "data": {"pod.yaml.j2": "evil"}}
    return {
        "a PodDisruptionBudget over a tenant's pods": lambda: _create(api, foreign_pdb),
        "a PodDisruptionBudget that blocks every drain": lambda: _create(api, blocking_pdb),
        "a NodePort Service": lambda: _create(api, _service(type="NodePort")),
        "an ExternalName Service": lambda: _create(api, {
            **_service(), "spec": {"type": "ExternalName", "externalName": "evil.example"}}),
        "a Service in front of a tenant's pods": lambda: _create(
            api, _service(selector={"app": "db"})),
        "an InferencePool over a tenant's pods": lambda: _create(api, pool),
        "an HTTPRoute claiming a foreign hostname": lambda: _create(api, claimed),
        "an HTTPRoute mirroring traffic to a tenant's Service": lambda: _create(api, mirrored),
        "an HTTPRoute sending traffic to a tenant's Service": lambda: _create(api, to_service),
        "forge an Event in kube-system": lambda: _create(
            api, _event({**kvtune_event, "namespace": "kube-system"}, "kube-system"),
            dry_run=False, namespace="kube-system"),
        "forge an Event about a tenant's pod": lambda: _create(
            api, _event({"apiVersion": "v1", "kind": "Pod", "name": "db-0", "namespace": NS},
                        NS), dry_run=False),
        "delete a tenant's PrometheusRule": lambda: custom.delete_namespaced_custom_object(
            *MON, NS, "prometheusrules", "db-alerts"),
        "rewrite a PrometheusRule in kube-system": lambda: custom.patch_namespaced_custom_object(
            *MON, "kube-system", "prometheusrules", "chat-kvtune",
            {"spec": {"groups": []}}),
        "a PrometheusRule recording over a foreign series": lambda: _create(api, recording),
        "a PrometheusRule group of another name": lambda: _create(api, foreign_group),
        "a ServiceMonitor that sends a Secret to its target": lambda: _create(api, leaky_sm),
        "a PodMonitor scraping every namespace": lambda: _create(api, wide_pm),
        "a PodMonitor over a tenant's pods": lambda: _create(api, foreign_pm),
        "a ConfigMap posing as a tenant's pod template": lambda: _create(api, template),
        "rewrite an InferenceDeployment's spec": lambda: custom.patch_namespaced_custom_object(
            "kvtune.io", "v1alpha1", NS, "inferencedeployments", OWNER,
            {"spec": {"runtime": {"image": "evil/image:latest"}}}),
    }


def _refused_by_the_policy(attacks: dict[str, Callable[[], Any]]) -> list[str]:
    """The attacks NOT refused with the policy's 403 (each with its answer)."""
    from kubernetes.client.exceptions import ApiException

    escaped = []
    for what, attack in attacks.items():
        try:
            attack()
        except ApiException as exc:
            if exc.status != 403 or "kvtune: " not in (exc.body or ""):
                escaped.append(f"{what}: answered {exc.status} {(exc.body or '')[:300]}")
            continue
        escaped.append(f"{what}: ALLOWED")
    return escaped


def test_the_operators_token_cannot_reach_beyond_its_job(token: Any) -> None:
    """Each attack of issue 25 item 2, with the operator's own token, refused by the policy
    (RBAC allows every one of these requests: only the policy's message may refuse it)."""
    assert _refused_by_the_policy(_pod_attacks(token)) == []
    assert _refused_by_the_policy(_other_attacks(token)) == []


def test_the_operators_token_cannot_get_a_bad_pod_through_a_leader_worker_set(
        token: Any) -> None:
    """A multi-node pool's LeaderWorkerSet (v0.9.0's CRD installed): what a Deployment may not
    carry, neither of its templates may (RBAC lets the token write LWSs; only the pod rules'
    policies refuse it), and kvtune's own LWS, with and without a leaderTemplate, passes."""
    assert _refused_by_the_policy(_group_attacks(token)) == []
    _create(token, _group_with(None, lambda s: None))
    _create(token, _group_with(None, lambda s: None, leader=False))


def test_what_kvtune_renders_is_admitted(token: Any, admin: Any) -> None:
    """The positive control: every object kvtune's renderers make, created with the same token
    (a server-side dry run: admitted exactly as a real write), and its Events for real."""
    from kubernetes import client

    from kvtune.operator.kube import apply as kapply

    job, report = _calibration()
    objects = [*_pool_objects(), *_group_objects(), *_routing_objects(), _http_route(),
               *_monitors("PodMonitor"), *_monitors("ServiceMonitor"), _prometheus_rule(),
               job, report, *_search_job()]
    # kvtune's own template with a vLLM entrypoint too, and a pod with the chart's /dev/shm
    # and resource requests (what the pods change renders).
    from kvtune.operator.render.objects import RenderInput, render_pool

    plain = render_pool(RenderInput(
        name=OWNER, namespace=NS, pool="h100", pool_plan=make_pool_plan(),
        model_name="m", image="vllm/vllm-openai:v0.33.0", replicas=1, revision=1))
    requests = _kind(plain, "Deployment")
    resources = _container(requests["spec"]["template"]["spec"])["resources"]
    resources["requests"].update({"cpu": "8", "memory": "64Gi"})
    resources.setdefault("limits", {})["memory"] = "64Gi"  # the limit is the request
    requests["metadata"]["name"] = "chat-h100-requests"
    objects += [*plain, requests]
    refused = []
    for obj in objects:
        try:
            _create(token, obj)
        except client.exceptions.ApiException as exc:
            refused.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.status} "
                           f"{(exc.body or '')[:300]}")
    assert refused == []
    # The Events kvtune posts (apply.post_event) on its InferenceDeployment.
    owner = client.CustomObjectsApi(admin).get_namespaced_custom_object(
        "kvtune.io", "v1alpha1", NS, "inferencedeployments", OWNER)
    kapply.post_event(kapply.Kube(token), owner, "Normal", "PlanChanged", "a test event")
    # kopf's bookkeeping: annotations on the InferenceDeployment, never its spec.
    client.CustomObjectsApi(token).patch_namespaced_custom_object(
        "kvtune.io", "v1alpha1", NS, "inferencedeployments", OWNER,
        {"metadata": {"annotations": {"kopf.zalando.org/last-handled-configuration": "{}"}}})
