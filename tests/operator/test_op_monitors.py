"""Monitoring as kube-prometheus-stack runs it (issue 14 items 8, 9): a PodMonitor (or
ServiceMonitor) per pool that selects exactly the pods/Service the renderer makes, and the
per-deployment PrometheusRule with labels for a ruleSelector; both switchable, applied to and
deleted from a real kube-apiserver."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC, make_pool_plan

from kvtune.operator.prometheus import monitors
from kvtune.operator.render.objects import RenderInput, render_pool

NS, NAME = "op-monitors", "bot"


def _body(monitoring: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    if monitoring is not None:
        spec["monitoring"] = monitoring
    return {"apiVersion": "kvtune.io/v1alpha1", "kind": "InferenceDeployment",
            "metadata": {"name": NAME, "namespace": NS, "uid": "u-1"}, "spec": spec}


def _rendered(pool: str) -> dict[str, dict[str, Any]]:
    objs = render_pool(RenderInput(name=NAME, namespace=NS, pool=pool,
                                   model_name="meta-llama/Llama-3.1-8B-Instruct",
                                   pool_plan=make_pool_plan(), image="vllm/vllm-openai:v0.33.0",
                                   replicas=1, revision=1))
    return {o["kind"]: o for o in objs}


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_a_pod_monitor_per_pool_selects_the_pools_pods_by_their_port() -> None:
    pods = monitors.scrape_monitors(_body())
    assert [m["kind"] for m in pods] == ["PodMonitor", "PodMonitor"]
    for monitor, pool in zip(pods, ("h200", "h100"), strict=True):
        deployment = _rendered(pool)["Deployment"]
        template = deployment["spec"]["template"]
        assert _matches(monitor["spec"]["selector"]["matchLabels"],
                        template["metadata"]["labels"])
        (other,) = [m for m in pods if m is not monitor]
        assert not _matches(other["spec"]["selector"]["matchLabels"],
                            template["metadata"]["labels"])
        port_names = {p["name"] for c in template["spec"]["containers"]
                      for p in c.get("ports", [])}
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
        # The profiler's poolSelector "labels" reads these pod labels off the series.
        assert monitor["spec"]["podTargetLabels"] == ["kvtune.io/deployment", "kvtune.io/pool"]
        assert monitor["metadata"]["namespace"] == NS


def test_service_monitor_kind_selects_the_pool_service() -> None:
    body = _body({"scrape": {"kind": "ServiceMonitor", "interval": "15s",
                             "labels": {"release": "kps"}}})
    monitor = monitors.scrape_monitors(body)[0]
    service = _rendered("h200")["Service"]
    assert monitor["kind"] == "ServiceMonitor"
    assert _matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert monitor["metadata"]["labels"]["release"] == "kps"


def test_rule_labels_for_the_rule_selector_and_switches() -> None:
    body = _body({"prometheusRule": {"labels": {"release": "kps"}}})
    rule = monitors.prometheus_rule(body)
    assert rule is not None and rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kvtune"
    wanted, unwanted = monitors.monitoring_objects(body)
    assert {o["kind"] for o in wanted} == {"PodMonitor", "PrometheusRule"}
    assert ("PrometheusRule", f"{NAME}-kvtune") not in unwanted
    off = _body({"scrape": {"enabled": False}, "prometheusRule": {"enabled": False}})
    wanted, unwanted = monitors.monitoring_objects(off)
    assert wanted == []
    assert ("PrometheusRule", f"{NAME}-kvtune") in unwanted
    assert ("PodMonitor", "bot-h200") in unwanted


def test_kvtune_alerts_prints_the_rule_the_operator_applies(tmp_path: Any) -> None:
    import yaml
    from click.testing import CliRunner

    from kvtune.cli.main import cli

    body = _body({"prometheusRule": {"labels": {"release": "kps"}}})
    path = tmp_path / "infd.yaml"
    path.write_text(yaml.safe_dump(body))
    result = CliRunner().invoke(cli, ["alerts", "-f", str(path)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == monitors.prometheus_rule(body)


# --- on the real kube-apiserver -----------------------------------------------------------

def _crd(kind: str, plural: str) -> dict[str, Any]:
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


@pytest.mark.cluster
def test_objects_are_applied_and_switched_off_on_the_apiserver(local_cluster: Any) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from op_cluster_helpers import create_infd, get_infd, install_crd

    from kvtune.operator.kube import apply as kapply
    from kvtune.operator.retune.retune_handlers import sync_alert_rules

    api = local_cluster.api_client()
    ext = client.ApiextensionsV1Api(api)
    for kind, plural in (("PodMonitor", "podmonitors"), ("PrometheusRule", "prometheusrules")):
        try:
            ext.create_custom_resource_definition(_crd(kind, plural))
        except ApiException as exc:
            if exc.status != 409:
                raise
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": NS}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    kube = kapply.Kube(api)
    custom = client.CustomObjectsApi(api)
    # A real owner: the garbage collector deletes objects whose owner reference names an
    # InferenceDeployment that does not exist (once it watches their kind).
    install_crd(api)
    try:
        create_infd(api, NS, NAME, _body()["spec"])
    except ApiException as exc:
        if exc.status != 409:
            raise
    uid = get_infd(api, NS, NAME)["metadata"]["uid"]

    def owned(monitoring: dict[str, Any]) -> dict[str, Any]:
        body = _body(monitoring)
        body["metadata"]["uid"] = uid
        return body

    def names(plural: str) -> set[str]:
        items = custom.list_namespaced_custom_object("monitoring.coreos.com", "v1", NS,
                                                     plural)["items"]
        return {i["metadata"]["name"] for i in items}

    def served() -> bool:
        try:
            names("podmonitors")
            names("prometheusrules")
        except ApiException:
            return False
        return True

    # Both CRDs served before the first sync (a 404 is retried only after a backoff).
    deadline = time.monotonic() + 60
    while not served():
        assert time.monotonic() < deadline, "the monitoring CRDs were never served"
        time.sleep(0.5)
    body = owned({"prometheusRule": {"labels": {"release": "kps"}}})
    deadline = time.monotonic() + 60
    while True:  # the CRDs become served a moment after they are created
        memo: dict[str, Any] = {}
        sync_alert_rules(kube, body, memo)
        # A CRD just created can answer 404 to an apply for a moment after it lists: the
        # loop re-syncs (a fresh memo each time) until both kinds hold kvtune's objects.
        if "alert_rules_digest" in memo and names("podmonitors") == {"bot-h200", "bot-h100"} \
                and names("prometheusrules") == {f"{NAME}-kvtune"}:
            break
        assert time.monotonic() < deadline, "PodMonitors or the PrometheusRule never applied"
        time.sleep(0.5)
    rule = custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", NS,
                                               "prometheusrules", f"{NAME}-kvtune")
    assert rule["metadata"]["labels"]["release"] == "kps"
    # Switched off: kvtune deletes its own objects, and only those.
    custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", NS, "podmonitors", {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {"name": "someone-elses", "namespace": NS}, "spec": {}})
    sync_alert_rules(kube, owned({"scrape": {"enabled": False},
                                  "prometheusRule": {"enabled": False}}), memo)
    assert names("podmonitors") == {"someone-elses"}
    assert names("prometheusrules") == set()


@pytest.mark.cluster
def test_rules_are_applied_once_the_prometheus_operator_comes_after_kvtune(
        local_cluster: Any) -> None:
    """A 404 (no monitoring.coreos.com CRDs yet) is not remembered by digest: the same rules
    are tried again on a backoff and applied once the Prometheus operator's CRDs exist."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from op_cluster_helpers import create_infd, ensure_namespace, get_infd, install_crd

    from kvtune.operator.kube import apply as kapply
    from kvtune.operator.retune import retune_handlers
    from kvtune.operator.retune.retune_handlers import sync_alert_rules

    api = local_cluster.api_client()
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    late_ns, late = "op-monitors-late", "late"
    install_crd(api)
    ensure_namespace(api, late_ns)
    try:
        create_infd(api, late_ns, late, _body()["spec"])
    except ApiException as exc:
        if exc.status != 409:
            raise
    body = _body({"prometheusRule": {"labels": {"release": "kps"}}})
    body["metadata"].update(namespace=late_ns, name=late,
                            uid=get_infd(api, late_ns, late)["metadata"]["uid"])
    crds = (("PodMonitor", "podmonitors"), ("PrometheusRule", "prometheusrules"))

    def listed(plural: str) -> set[str] | None:
        try:
            items = custom.list_namespaced_custom_object("monitoring.coreos.com", "v1",
                                                         late_ns, plural)["items"]
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {i["metadata"]["name"] for i in items}

    # kvtune first: the Prometheus operator's CRDs are not installed.
    for _, plural in crds:
        try:
            ext.delete_custom_resource_definition(f"{plural}.monitoring.coreos.com")
        except ApiException as exc:
            if exc.status != 404:
                raise
    deadline = time.monotonic() + 120
    while any(listed(plural) is not None for _, plural in crds):
        assert time.monotonic() < deadline, "the monitoring CRDs were never removed"
        time.sleep(0.5)
    memo: dict[str, Any] = {}
    sync_alert_rules(kapply.Kube(api), body, memo, now_seconds=1000.0)
    assert "alert_rules_digest" not in memo
    retry = memo["alert_rules_retry"]
    assert (retry.failures, retry.next_attempt) == (1, 1000.0 + retune_handlers.INTERVAL_SECONDS)
    sync_alert_rules(kapply.Kube(api), body, memo, now_seconds=1001.0)
    assert memo["alert_rules_retry"] == retry  # within the backoff: not tried
    sync_alert_rules(kapply.Kube(api), body, memo, now_seconds=retry.next_attempt)
    retry = memo["alert_rules_retry"]  # tried again, still 404: the backoff doubles
    assert (retry.failures, retry.next_attempt) == (
        2, 1000.0 + 3 * retune_handlers.INTERVAL_SECONDS)

    # Then the Prometheus operator: the same rules (same digest) are applied at the next try.
    for kind, plural in crds:
        ext.create_custom_resource_definition(_crd(kind, plural))
    deadline = time.monotonic() + 120
    while "alert_rules_digest" not in memo:
        # A CRD just created can answer 404 to an apply a moment after it lists: each pass is
        # the next backoff step.
        assert time.monotonic() < deadline, f"never applied: {memo}"
        sync_alert_rules(kapply.Kube(api), body, memo,
                         now_seconds=memo["alert_rules_retry"].next_attempt)
        time.sleep(0.2)
    assert "alert_rules_retry" not in memo
    assert listed("prometheusrules") == {f"{late}-kvtune"}
    assert listed("podmonitors") == {"late-h200", "late-h100"}


@pytest.mark.cluster
def test_someone_elses_rule_or_monitor_of_that_name_is_not_taken_over(
        local_cluster: Any) -> None:
    """A PrometheusRule and a PodMonitor with the names kvtune would give them, made by
    someone else (even labelled managed-by: kvtune), are neither applied over (no owner
    reference: deleting the InferenceDeployment would have garbage-collected them) nor
    deleted when spec.monitoring switches them off. The collision is on the object:
    MonitoringReady=False/NameCollision and one Warning Event, True once resolved."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from op_cluster_helpers import create_infd, ensure_namespace, get_infd, install_crd

    from kvtune.operator.kube import apply as kapply
    from kvtune.operator.monitoring import alert_rules
    from kvtune.operator.retune.retune_handlers import sync_alert_rules

    api = local_cluster.api_client()
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    ns, name = "op-monitors-deputy", "bot"
    for kind, plural in (("PodMonitor", "podmonitors"), ("PrometheusRule", "prometheusrules")):
        try:
            ext.create_custom_resource_definition(_crd(kind, plural))
        except ApiException as exc:
            if exc.status != 409:
                raise
    install_crd(api)
    ensure_namespace(api, ns)
    create_infd(api, ns, name, _body()["spec"])
    body = _body()
    body["metadata"].update(namespace=ns, uid=get_infd(api, ns, name)["metadata"]["uid"])
    victims = {
        "prometheusrules": {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                            "metadata": {"name": f"{name}-kvtune", "namespace": ns, "labels": {
                                "app.kubernetes.io/managed-by": "kvtune"}},
                            "spec": {"groups": [{"name": "theirs", "rules": []}]}},
        "podmonitors": {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                        "metadata": {"name": f"{name}-h200", "namespace": ns,
                                     "labels": {"app": "theirs"}},
                        "spec": {"selector": {"matchLabels": {"app": "theirs"}}}},
    }
    deadline = time.monotonic() + 60
    for plural, victim in victims.items():
        while True:  # a CRD just created may answer 404 for a moment
            try:
                custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", ns,
                                                       plural, victim)
                break
            except ApiException as exc:
                assert exc.status == 404 and time.monotonic() < deadline, exc
                time.sleep(0.5)

    def snapshot() -> list[Any]:
        out = []
        for plural, victim in victims.items():
            obj = custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", ns,
                                                      plural, victim["metadata"]["name"])
            out.append((obj["metadata"]["uid"], obj["metadata"].get("ownerReferences"),
                        obj["metadata"]["labels"], obj["spec"]))
        return out

    def monitoring_ready() -> dict[str, Any] | None:
        conds = (get_infd(api, ns, name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "MonitoringReady"), None)

    def collision_events() -> list[Any]:
        events = client.CoreV1Api(api).list_namespaced_event(
            ns, field_selector=f"involvedObject.name={name}").items
        return [e for e in events if e.reason == "NameCollision"]

    kube = kapply.Kube(api)
    before = snapshot()
    objects, _ = alert_rules.rendered_objects(body)
    rule = next(o for o in objects if o["kind"] == "PrometheusRule")
    with pytest.raises(kapply.NameCollision, match="kvtune did not create it"):
        alert_rules.apply_object(kube, rule, body)
    # Switched off: kvtune deletes only what it made for this InferenceDeployment; nothing
    # collides then, and an object that never collided gets no MonitoringReady at all (and
    # is not even read for it: nothing shows the condition, and this process never wrote it).
    reads: list[str] = []

    class Recording(kapply.Kube):
        def request(self, method: str, api_path: str, **kwargs: Any) -> dict[str, Any]:
            reads.append(f"{method} {api_path}")
            return super().request(method, api_path, **kwargs)

    sync_alert_rules(Recording(api), {**body, "spec": {**body["spec"], "monitoring": {
        "scrape": {"enabled": False}, "prometheusRule": {"enabled": False}}}}, {},
        now_seconds=0.0)
    assert reads and not [r for r in reads if "/inferencedeployments/" in r], reads
    assert snapshot() == before
    assert before[0][1] is None and before[1][1] is None
    assert monitoring_ready() is None

    memo: dict[str, Any] = {}
    sync_alert_rules(kube, body, memo, now_seconds=0.0)
    assert "alert_rules_digest" not in memo and memo["alert_rules_retry"].failures == 1
    assert snapshot() == before
    # Surfaced on the object: the condition names each kind/name and the fix; one Event.
    cond = monitoring_ready()
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "NameCollision")
    for taken in (f"PrometheusRule {ns}/{name}-kvtune", f"PodMonitor {ns}/{name}-h200"):
        assert taken in cond["message"], cond
    assert "rename it or the InferenceDeployment" in cond["message"]
    [event] = collision_events()
    assert event.type == "Warning" and event.message == cond["message"]
    # The retry (its backoff passed) finds the same collision: no second Event.
    sync_alert_rules(kube, body, memo, now_seconds=10_000.0)
    assert memo["alert_rules_retry"].failures == 2
    assert len(collision_events()) == 1 and monitoring_ready() == cond

    # Resolved (the other objects gone): kvtune's own objects are applied, the condition
    # turns True, and no further Warning is posted.
    for plural, victim in victims.items():
        custom.delete_namespaced_custom_object("monitoring.coreos.com", "v1", ns, plural,
                                               victim["metadata"]["name"])
    sync_alert_rules(kube, body, memo, now_seconds=20_000.0)
    assert "alert_rules_digest" in memo and "alert_rules_retry" not in memo
    for plural, victim in victims.items():
        owners = custom.get_namespaced_custom_object(
            "monitoring.coreos.com", "v1", ns, plural,
            victim["metadata"]["name"])["metadata"]["ownerReferences"]
        assert [o["uid"] for o in owners] == [body["metadata"]["uid"]]
    cond = monitoring_ready()
    assert cond is not None and (cond["status"], cond["reason"]) == ("True",
                                                                     "MonitoringApplied")
    assert len(collision_events()) == 1
    custom.delete_namespaced_custom_object("kvtune.io", "v1alpha1", ns, "inferencedeployments",
                                           name)


def test_chart_wide_labels_on_every_monitor_and_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    # The chart's monitoring.labels reach the operator as KVTUNE_MONITORING_LABELS; a
    # deployment's own spec.monitoring labels add to them (and win on a clash).
    monkeypatch.setenv(monitors.LABELS_ENV, '{"release": "kps", "team": "ml"}')
    body = _body({"scrape": {"labels": {"team": "search"}},
                  "prometheusRule": {"labels": {"extra": "yes"}}})
    wanted, _ = monitors.monitoring_objects(body)
    assert sorted(o["kind"] for o in wanted) == ["PodMonitor", "PodMonitor", "PrometheusRule"]
    for obj in wanted:
        labels = obj["metadata"]["labels"]
        assert labels["release"] == "kps", obj["kind"]
        assert labels["app.kubernetes.io/managed-by"] == "kvtune"
    pods = [o for o in wanted if o["kind"] == "PodMonitor"]
    assert {o["metadata"]["labels"]["team"] for o in pods} == {"search"}
    (rule,) = [o for o in wanted if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["team"] == "ml"
    assert rule["metadata"]["labels"]["extra"] == "yes"
    assert rule["metadata"]["labels"]["kvtune.io/deployment"] == NAME


def test_no_chart_labels_without_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(monitors.LABELS_ENV, raising=False)
    wanted, _ = monitors.monitoring_objects(_body({"prometheusRule": {}}))
    assert all("release" not in o["metadata"]["labels"] for o in wanted)


@pytest.mark.parametrize("text", ["release=kps", '["kps"]', '{"release": 1}'])
def test_bad_chart_labels_are_one_line_naming_the_value(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(monitors.LABELS_ENV, text)
    with pytest.raises(ValueError, match=r"monitoring\.labels") as info:
        monitors.scrape_monitors(_body())
    assert "\n" not in str(info.value) and monitors.LABELS_ENV in str(info.value)


def test_the_operators_own_alerts_are_not_in_each_deployments_rule() -> None:
    # KVTuneReconcileErrors (and KVTuneOperatorDown) are the chart's, once; a deployment's
    # rule keeps only what is about that deployment.
    rule = monitors.prometheus_rule(_body({"prometheusRule": {}}))
    assert rule is not None
    alerts = {r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "KVTuneReconcileErrors" not in alerts and "KVTuneOperatorDown" not in alerts
    assert "KVTuneProfileStale" in alerts
