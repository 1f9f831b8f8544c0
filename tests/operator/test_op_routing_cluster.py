"""The rendered routing objects against the Gateway API Inference Extension's real CRDs (the
pinned release's own manifests, installed into the local control plane) and its real endpoint
picker: the API server keeps every field kvtune renders (a misspelt one would be pruned by the
structural schema) and refuses an invalid pool; a new plan moves the scorer's block size; the
endpoint picker loads the rendered configuration and, authenticated as the ServiceAccount the
chart grants it, reads its InferencePool and watches the pool's pods."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    OperatorProcess,
    condition,
    create_infd,
    create_objects,
    ensure_namespace,
    get_infd,
    install_crd,
    patch_spec,
    service_account_kubeconfig,
    wait_for,
)
from op_samples import SAMPLE_SPEC, make_pool_plan

from kvtune.e2e.inference_extension import crd_paths, gateway_api_crd_paths
from kvtune.operator.routing import endpoint_picker, http_route
from kvtune.operator.routing import inference_pool as routing

NS = "routing"
LABELS = {"kvtune.io/deployment": "bot", "kvtune.io/pool": "h200"}
GROUP, VERSION, PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
APPLY = "application/apply-patch+yaml"


def _apply(api_client: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply as kvtune does; what the server then holds."""
    name, kw = obj["metadata"]["name"], {"field_manager": "kvtune", "force": True,
                                         "_content_type": APPLY}
    if obj["kind"] == "InferencePool":
        custom = client.CustomObjectsApi(api_client)
        custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, obj, **kw)
        return custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
            GROUP, VERSION, NS, PLURAL, name)
    api = {"ConfigMap": (client.CoreV1Api, "config_map"), "Service": (client.CoreV1Api,
                                                                       "service"),
           "Deployment": (client.AppsV1Api, "deployment")}[obj["kind"]]
    group = api[0](api_client)
    getattr(group, f"patch_namespaced_{api[1]}")(name, NS, obj, **kw)
    held = getattr(group, f"read_namespaced_{api[1]}")(name, NS, _preload_content=False)
    return json.loads(held.data)  # type: ignore[no-any-return]


def _rendered(block_size: int = 32, multi_turn: bool = False) -> dict[str, dict[str, Any]]:
    objects = routing.routing_objects(name="bot", namespace=NS, pool="h200",
                                      pool_plan=make_pool_plan(block_size=block_size),
                                      labels=LABELS, multi_turn=multi_turn)
    return {o["kind"]: o for o in objects}


def _setup(local_cluster: Any) -> Any:
    api_client = local_cluster.api_client()
    for path in crd_paths():
        install_crd(api_client, path)
    ensure_namespace(api_client, NS)
    return api_client


@pytest.mark.cluster
def test_routing_objects_are_accepted_as_rendered_by_the_real_crds(local_cluster: Any) -> None:
    api_client = _setup(local_cluster)
    rendered = _rendered(32)
    held = {kind: _apply(api_client, obj) for kind, obj in rendered.items()}
    pool = rendered["InferencePool"]
    # The structural schema prunes unknown fields: what the server holds is what was rendered.
    assert held["InferencePool"]["spec"] == pool["spec"]
    assert held["InferencePool"]["metadata"]["labels"] == pool["metadata"]["labels"]
    # The endpoint picker as the server holds it: the ref resolves to its Service, whose
    # selector takes the Deployment's pods (and not the model servers'), mounting the config.
    ref = held["InferencePool"]["spec"]["endpointPickerRef"]
    service, deployment = held["Service"], held["Deployment"]
    assert service["metadata"]["name"] == ref["name"]
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    template = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert not pool["spec"]["selector"]["matchLabels"].items() <= \
        template["metadata"]["labels"].items()
    assert template["spec"]["volumes"][0]["configMap"]["name"] == \
        held["ConfigMap"]["metadata"]["name"]
    assert template["spec"]["containers"][0]["args"] == \
        rendered["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert template["spec"]["serviceAccountName"] == endpoint_picker.SERVICE_ACCOUNT

    broken = json.loads(json.dumps(pool))
    broken["spec"]["targetPorts"] = [{"number": 0}]
    with pytest.raises(ApiException) as refused:
        _apply(api_client, broken)
    assert refused.value.status == 422

    # A new plan (block 16): the pool, the configuration and the EPP's pods follow, in the
    # same apply (the EPP reads its configuration only at start: a new hash restarts it).
    hash_before = template["metadata"]["annotations"][endpoint_picker.ANNOTATION_CONFIG_HASH]
    rendered2 = _rendered(16)
    held2 = {kind: _apply(api_client, obj) for kind, obj in rendered2.items()}
    assert held2["InferencePool"]["metadata"]["labels"][routing.LABEL_BLOCK_SIZE] == "16"
    config = yaml.safe_load(held2["ConfigMap"]["data"][routing.EPP_CONFIG_KEY])
    producer = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")
    assert producer["parameters"]["blockSizeTokens"] == 16
    annotations = held2["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations[endpoint_picker.ANNOTATION_CONFIG_HASH] != hash_before


def _epp_args(rendered: dict[str, Any], config: Path) -> list[str]:
    """The rendered Deployment's arguments, with the config file and ports of this machine."""
    from kvtune.e2e.prometheus import free_port

    args = list(rendered["spec"]["template"]["spec"]["containers"][0]["args"])
    local = {"--config-file": str(config), "--grpc-port": str(free_port()),
             "--grpc-health-port": str(free_port()), "--metrics-port": str(free_port())}
    for flag, value in local.items():
        args[args.index(flag) + 1] = value
    return args


def _run_endpoint_picker(kubeconfig: Path, args: list[str], log_path: Path,
                         done: Callable[[str], bool], timeout_seconds: float
                         ) -> tuple[int | None, str]:
    """The Inference Extension's own endpoint picker with ``args`` against the local cluster;
    (exit code or None while running, its log) once ``done(log)`` or it exited."""
    from kvtune.e2e.inference_extension import endpoint_picker as epp_binary

    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(epp_binary()), *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            text = log_path.read_text()
            if proc.poll() is not None or done(text):
                break
            time.sleep(0.2)
        return proc.poll(), log_path.read_text()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.cluster
def test_the_endpoint_picker_loads_the_rendered_configuration(local_cluster: Any,
                                                              tmp_path: Path) -> None:
    api_client = _setup(local_cluster)
    rendered = _rendered(32)
    _apply(api_client, rendered["InferencePool"])
    text = rendered["ConfigMap"]["data"][routing.EPP_CONFIG_KEY]
    config = tmp_path / "epp-config.yaml"
    kubeconfig = Path(local_cluster.kubeconfig_path)

    config.write_text(text)
    code, log = _run_endpoint_picker(kubeconfig, _epp_args(rendered["Deployment"], config),
                                     tmp_path / "epp.log",
                                     lambda t: "Instantiated all plugins" in t, 120)
    assert code is None, f"the endpoint picker exited ({code}) on kvtune's configuration:\n{log}"
    assert "Instantiated all plugins" in log
    assert "approx-prefix-cache-producer" in log

    # Multi-turn traffic: the prefix-cache affinity filter runs first in the profile.
    multi_turn = _rendered(32, multi_turn=True)
    config.write_text(multi_turn["ConfigMap"]["data"][routing.EPP_CONFIG_KEY])
    code, log = _run_endpoint_picker(kubeconfig, _epp_args(multi_turn["Deployment"], config),
                                     tmp_path / "epp-multi-turn.log",
                                     lambda t: "Instantiated all plugins" in t, 120)
    assert code is None, f"the endpoint picker exited ({code}) on the multi-turn config:\n{log}"
    assert routing.AFFINITY_FILTER in log

    # The same configuration with a block size the producer refuses: the picker refuses to
    # start, so the check above is not vacuous.
    broken = text.replace("blockSizeTokens: 32", "blockSizeTokens: 0")
    assert broken != text
    config.write_text(broken)
    code, log = _run_endpoint_picker(kubeconfig, _epp_args(rendered["Deployment"], config),
                                     tmp_path / "epp-broken.log",
                                     lambda t: "Instantiated all plugins" in t, 120)
    assert code not in (None, 0), log
    assert "BlockSizeTokens must be > 0" in log


@pytest.mark.cluster
def test_the_endpoint_picker_runs_with_only_the_access_the_chart_grants(
        local_cluster: Any, tmp_path: Path) -> None:
    """Authenticated as kvtune-endpoint-picker (a TokenRequest token, as its pod would be),
    with the rendered arguments: it reads its InferencePool and watches the pool's pods. As
    an account without that Role it is refused, so the first check is not vacuous."""
    api_client = _setup(local_cluster)
    create_objects(api_client, endpoint_picker.namespace_objects(NS))
    create_objects(api_client, [{"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": "no-role", "namespace": NS}}])
    rendered = _rendered(32)
    _apply(api_client, rendered["InferencePool"])
    config = tmp_path / "epp-config.yaml"
    config.write_text(rendered["ConfigMap"]["data"][routing.EPP_CONFIG_KEY])
    admin = Path(local_cluster.kubeconfig_path)
    # A model server of the pool: the endpoint picker must see it through its pod watch.
    pod_name = "bot-h200-model-server"
    try:
        client.CoreV1Api(api_client).create_namespaced_pod(NS, {
            "metadata": {"name": pod_name, "labels": LABELS},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}]}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    args = _epp_args(rendered["Deployment"], config)

    as_picker = service_account_kubeconfig(api_client, admin, NS,
                                           endpoint_picker.SERVICE_ACCOUNT,
                                           tmp_path / "picker.kubeconfig")
    # Once it has read the pool, it lists the pool's pods and starts collecting each one's
    # metrics (at its pod IP, which the local cluster's kwok assigns).
    code, log = _run_endpoint_picker(as_picker, args, tmp_path / "epp.log",
                                     lambda t: "starting collection" in t, 120)
    assert code is None, f"the endpoint picker exited ({code}):\n{log[-3000:]}"
    assert "Reconciling InferencePool" in log
    pod_ip = client.CoreV1Api(api_client).read_namespaced_pod(pod_name, NS).status.pod_ip
    collecting = [line for line in log.splitlines() if "starting collection" in line]
    assert pod_ip and any(pod_ip in line for line in collecting), log[-3000:]
    assert "forbidden" not in log.lower(), log[-3000:]

    as_nobody = service_account_kubeconfig(api_client, admin, NS, "no-role",
                                           tmp_path / "nobody.kubeconfig")
    code, log = _run_endpoint_picker(as_nobody, args, tmp_path / "epp-nobody.log",
                                     lambda t: "forbidden" in t.lower(), 120)
    assert "forbidden" in log.lower(), log[-3000:]
    assert "starting collection" not in log


@pytest.mark.cluster
def test_the_http_route_is_held_as_rendered_by_gateway_apis_experimental_crds(
        local_cluster: Any) -> None:
    """Session persistence is in Gateway API's experimental channel: with its CRDs the server
    holds the route's every field (a field the schema lacks would be pruned)."""
    api_client = _setup(local_cluster)
    for path in gateway_api_crd_paths("experimental"):
        install_crd(api_client, path)
    pools = [http_route.PoolRoute("bot-h100", 8192, 3), http_route.PoolRoute("bot-h200", 32768, 2),
             http_route.PoolRoute("bot-b200", 131072, 1)]
    route = http_route.http_route(name="bot", namespace=NS, labels=LABELS,
                                  gateway=http_route.GatewayRef("inference-gateway"),
                                  pools=pools, session_header="x-session-id",
                                  length_header="x-prompt-tokens")
    custom = client.CustomObjectsApi(api_client)
    args = ("gateway.networking.k8s.io", "v1", NS, "httproutes")
    custom.patch_namespaced_custom_object(*args, "bot", route, field_manager="kvtune",
                                          force=True, _content_type=APPLY)
    held = custom.get_namespaced_custom_object(*args, "bot")
    # The server writes the CRD's defaults (a backendRef's port is optional for an
    # InferencePool); every rendered field is held as rendered.
    for got, want in zip(held["spec"]["rules"], route["spec"]["rules"], strict=True):
        assert got["sessionPersistence"] == want["sessionPersistence"]
        assert got["matches"] == want["matches"]
        assert [{k: b[k] for k in want["backendRefs"][0]} for b in got["backendRefs"]] == \
            want["backendRefs"]
    assert held["spec"]["parentRefs"] == route["spec"]["parentRefs"]

    # The schema's own rules run: a cookie configuration on a Header session is refused.
    broken = json.loads(json.dumps(route))
    broken["spec"]["rules"][0]["sessionPersistence"]["cookieConfig"] = {
        "lifetimeType": "Session"}
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(*args, "bot", broken, field_manager="kvtune",
                                              force=True, _content_type=APPLY)
    assert refused.value.status == 422
    assert "cookieConfig can only be set with type Cookie" in refused.value.body


@pytest.mark.cluster
@pytest.mark.slow
def test_the_operator_renders_each_pools_picker_and_the_route_over_the_pools(
        local_cluster: Any, tmp_path: Path) -> None:
    """`kvtune operator` with routing: per pool the InferencePool, the endpoint picker's
    configuration, Deployment and Service; over the pools the HTTPRoute, attached to the named
    Gateway, with session persistence and the length rules from the pools' plans."""
    import copy

    ns = "op-routing"
    api_client = _setup(local_cluster)
    install_crd(api_client)
    for path in gateway_api_crd_paths("experimental"):
        install_crd(api_client, path)
    ensure_namespace(api_client, ns)
    proc = OperatorProcess(Path(local_cluster.kubeconfig_path), [ns], tmp_path / "op.log",
                           env={routing.ROUTING_ENV: "true"})
    proc.start()
    try:
        spec = copy.deepcopy(SAMPLE_SPEC)
        spec["routing"] = {"enabled": True, "gateway": {"name": "inference-gateway"},
                           "sessionHeader": "x-session-id", "lengthHeader": "x-prompt-tokens"}
        create_infd(api_client, ns, "bot", spec)

        def ready() -> dict[str, Any] | None:
            obj = get_infd(api_client, ns, "bot")
            cond = condition(obj, "Ready")
            return obj if cond is not None and cond["status"] == "True" else None

        obj = wait_for(ready, "Ready=True", 120, proc.log)
        custom = client.CustomObjectsApi(api_client)
        apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
        pools = {p["name"]: p for p in obj["status"]["pools"]}
        assert len(pools) == 2
        for name, pool in pools.items():
            inference_pool = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                                 f"bot-{name}")
            assert inference_pool["metadata"]["labels"][routing.LABEL_MAX_MODEL_LEN] == \
                str(pool["plan"]["maxModelLen"])
            picker = inference_pool["spec"]["endpointPickerRef"]["name"]
            deployment = apps.read_namespaced_deployment(picker, ns)
            assert core.read_namespaced_service(picker, ns).spec.selector == \
                deployment.spec.selector.match_labels
            assert deployment.metadata.owner_references[0].name == "bot"
            # The pool's model servers are not the picker's pods.
            assert deployment.spec.template.metadata.labels.get("kvtune.io/pool") is None

        route = custom.get_namespaced_custom_object("gateway.networking.k8s.io", "v1", ns,
                                                    "httproutes", "bot")
        assert route["metadata"]["ownerReferences"][0]["name"] == "bot"
        assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
        catch_all = route["spec"]["rules"][-1]
        assert {b["name"]: b["weight"] for b in catch_all["backendRefs"]} == {
            f"bot-{name}": pool["replicas"] for name, pool in pools.items()}
        lengths = {pool["plan"]["maxModelLen"] for pool in pools.values()}
        assert len(route["spec"]["rules"]) == len(lengths)  # a rule per longer tier, + catch-all
        for rule in route["spec"]["rules"]:
            assert rule["sessionPersistence"] == {"type": "Header", "sessionName": "x-session-id"}

        # A pool leaves the spec: its picker and its InferencePool go, the route follows.
        gone = sorted(pools)[0]
        kept = [p for p in spec["pools"] if p.get("name", p["gpuClass"].lower()) != gone]
        patch_spec(api_client, ns, "bot", {"pools": kept})

        def pool_gone() -> bool:
            names = {p["metadata"]["name"] for p in custom.list_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL)["items"]}
            backends = {b["name"] for b in custom.get_namespaced_custom_object(
                "gateway.networking.k8s.io", "v1", ns, "httproutes", "bot")["spec"]["rules"][-1][
                "backendRefs"]}
            return f"bot-{gone}" not in names and backends == names and len(names) == 1

        wait_for(pool_gone, f"pool {gone}'s InferencePool pruned", 120, proc.log)
        assert not [d for d in apps.list_namespaced_deployment(ns).items
                    if d.metadata.name == f"bot-{gone}-epp"]

        # Routing off: the pickers (a running pod each), the pools and the route go.
        patch_spec(api_client, ns, "bot", {"routing": {"enabled": False, "gateway": None,
                                                       "sessionHeader": None,
                                                       "lengthHeader": None}})

        def routing_gone() -> bool:
            pickers = apps.list_namespaced_deployment(
                ns, label_selector=endpoint_picker.LABEL_PICKER).items
            services = core.list_namespaced_service(
                ns, label_selector=endpoint_picker.LABEL_PICKER).items
            pools_left = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            routes = custom.list_namespaced_custom_object("gateway.networking.k8s.io", "v1", ns,
                                                          "httproutes")["items"]
            return not (pickers or services or pools_left or routes)

        wait_for(routing_gone, "routing objects pruned", 120, proc.log)
        # The model servers keep running.
        assert [d.metadata.name for d in apps.list_namespaced_deployment(ns).items] == [
            f"bot-{name}" for name in sorted(pools) if name != gone]
    finally:
        proc.stop()


def _routing_ready(api_client: Any, ns: str, status: str, reason: str
                   ) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        obj = get_infd(api_client, ns, "bot")
        cond = condition(obj, "RoutingReady")
        return obj if cond is not None and (cond["status"], cond["reason"]) == (
            status, reason) else None
    return probe


def _report_as_a_gateway(api_client: Any, ns: str, accepted: str, reason: str) -> None:
    """What a gateway controller writes on the HTTPRoute it serves (Gateway API v1.5.1's
    RouteParentStatus), through the status subresource."""
    custom = client.CustomObjectsApi(api_client)
    route = custom.get_namespaced_custom_object("gateway.networking.k8s.io", "v1", ns,
                                                "httproutes", "bot")
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    generation = route["metadata"]["generation"]
    route["status"] = {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                      "name": "inference-gateway"},
        "controllerName": "example.net/gateway-controller",
        "conditions": [
            {"type": "Accepted", "status": accepted, "reason": reason,
             "message": f"route {reason}", "observedGeneration": generation,
             "lastTransitionTime": at},
            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs",
             "message": "", "observedGeneration": generation, "lastTransitionTime": at}]}]}
    custom.replace_namespaced_custom_object_status("gateway.networking.k8s.io", "v1", ns,
                                                   "httproutes", "bot", route)


@pytest.mark.cluster
@pytest.mark.slow
def test_routing_ready_follows_the_pickers_the_gateway_and_the_pickers_account(
        local_cluster: Any, tmp_path: Path) -> None:
    """`kvtune operator`: RoutingReady waits for a gateway once the picker is available (kwok
    runs its pod), follows what a gateway controller writes on the route, names the chart value
    when the pickers' ServiceAccount is gone; during a canary the pool's routed max-model-len
    stays the stable plan's."""
    import copy

    ns = "op-routing-ready"
    api_client = _setup(local_cluster)
    install_crd(api_client)
    for path in gateway_api_crd_paths("experimental"):
        install_crd(api_client, path)
    ensure_namespace(api_client, ns)
    create_objects(api_client, endpoint_picker.namespace_objects(ns))
    proc = OperatorProcess(Path(local_cluster.kubeconfig_path), [ns], tmp_path / "op.log",
                           env={routing.ROUTING_ENV: "true",
                                "KVTUNE_ROUTING_STATUS_SECONDS": "1"})
    proc.start()
    try:
        spec = copy.deepcopy(SAMPLE_SPEC)
        spec["pools"] = [{"gpuClass": "H200", "replicas": 2, "tensorParallel": 1}]
        spec["routing"] = {"enabled": True, "gateway": {"name": "inference-gateway"}}
        create_infd(api_client, ns, "bot", spec)

        # The picker's pod runs (kwok), no gateway has written on the route.
        obj = wait_for(_routing_ready(api_client, ns, "Unknown", "AwaitingGateway"),
                       "RoutingReady=Unknown/AwaitingGateway", 120, proc.log)
        assert "no gateway has reported" in condition(obj, "RoutingReady")["message"]  # type: ignore[index]
        pool = obj["status"]["pools"][0]
        assert pool["routing"]["endpointPicker"] == "bot-h200-epp"
        assert pool["routing"]["endpointPickerAvailable"] is True
        stable_len = pool["plan"]["maxModelLen"]
        assert pool["routing"]["maxModelLen"] == stable_len

        # A gateway refuses the route, then accepts it.
        _report_as_a_gateway(api_client, ns, "False", "UnsupportedValue")
        obj = wait_for(_routing_ready(api_client, ns, "False", "RouteNotAccepted"),
                       "RoutingReady=False/RouteNotAccepted", 60, proc.log)
        message = condition(obj, "RoutingReady")["message"]  # type: ignore[index]
        assert "UnsupportedValue" in message and "example.net/gateway-controller" in message
        wait_for(lambda: any(e.reason == "RouteNotAccepted" for e in client.CoreV1Api(
            api_client).list_namespaced_event(ns).items),
            "a RouteNotAccepted Event", 30, proc.log)
        _report_as_a_gateway(api_client, ns, "True", "Accepted")
        wait_for(_routing_ready(api_client, ns, "True", "Routed"), "RoutingReady=True/Routed",
                 60, proc.log)

        # A new plan with a longer max-model-len goes to a canary (10 min analysis): the
        # stable pods still run the old one, and so does what the route is built from.
        longer = stable_len * 2
        patch_spec(api_client, ns, "bot", {"tuning": {"mode": "auto", "pin": {
            "blockSize": 32, "maxModelLen": longer}}})

        def canary() -> dict[str, Any] | None:
            obj = get_infd(api_client, ns, "bot")
            pools = (obj.get("status") or {}).get("pools") or []
            return obj if pools and pools[0]["phase"] == "Canary" else None

        pool = wait_for(canary, "the new plan's canary", 120, proc.log)["status"]["pools"][0]
        assert pool["plan"]["maxModelLen"] == longer
        assert pool["routing"]["maxModelLen"] == stable_len

        # The pickers' ServiceAccount goes (a namespace outside runtime.namespaces).
        client.CoreV1Api(api_client).delete_namespaced_service_account(
            endpoint_picker.SERVICE_ACCOUNT, ns)
        obj = wait_for(_routing_ready(api_client, ns, "False", "EndpointPickerAccessMissing"),
                       "RoutingReady=False/EndpointPickerAccessMissing", 60, proc.log)
        message = condition(obj, "RoutingReady")["message"]  # type: ignore[index]
        assert "runtime.namespaces" in message and ns in message
    finally:
        proc.stop()


@pytest.mark.cluster
def test_a_refused_routing_read_makes_routing_ready_unknown_not_a_failed_reconcile(
        local_cluster: Any, tmp_path: Path) -> None:
    """RoutingReady's reads as an account the API server refuses (403): Unknown, naming the
    read; with get on Deployments and HTTPRoutes but not on the pickers' ServiceAccount (a
    chart from before that right) the pickers' state still decides."""
    from kvtune.operator.api import InferenceDeploymentSpec, PoolRoutingStatus, PoolStatus
    from kvtune.operator.kube import apply as kapply
    from kvtune.operator.monitoring import routing_status

    ns = "routing-unreadable"
    api_client = _setup(local_cluster)
    for path in gateway_api_crd_paths("experimental"):
        install_crd(api_client, path)
    ensure_namespace(api_client, ns)
    client.CoreV1Api(api_client).create_namespaced_service_account(
        ns, {"metadata": {"name": "probe"}})
    kube = kapply.Kube.connect(str(service_account_kubeconfig(
        api_client, Path(local_cluster.kubeconfig_path), ns, "probe", tmp_path / "probe.yaml")))
    spec = InferenceDeploymentSpec.model_validate({**SAMPLE_SPEC, "routing": {
        "enabled": True, "gateway": {"name": "inference-gateway"}}})
    pools = [PoolStatus(name="h200", gpu_class="H200", tensor_parallel=1, replicas=1,
                        phase="Applied", routing=PoolRoutingStatus(
                            max_model_len=32768, endpoint_picker="bot-h200-epp"))]
    body = {"metadata": {"name": "bot", "namespace": ns}}

    _, verdict = routing_status.evaluate(kube, body, spec, pools)
    assert verdict[:2] == ("Unknown", "RoutingStatusUnreadable")
    assert "Deployment routing-unreadable/bot-h200-epp" in verdict[2]

    create_objects(api_client, [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "probe", "namespace": ns},
         "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
                   {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"],
                    "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "probe", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "probe"},
         "subjects": [{"kind": "ServiceAccount", "name": "probe", "namespace": ns}]}])

    def readable() -> tuple[list[PoolStatus], tuple[str, str, str]] | None:
        out = routing_status.evaluate(kube, body, spec, pools)
        return None if out[1][1] == "RoutingStatusUnreadable" else out

    pools_read, verdict = wait_for(readable, "the probe's Role to take effect", 30)
    # No picker Deployment exists: that is what it says, not the (unreadable) account.
    assert verdict[:2] == ("False", "EndpointPickerUnavailable")
    assert pools_read[0].routing is not None
    assert pools_read[0].routing.endpoint_picker_available is False
    assert "bot-h200-epp does not exist" in verdict[2]
