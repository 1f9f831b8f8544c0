"""The bad-spec corpus against the real API server, in one batch (issue 11 item 6).

Every case ends one of three ways, each checked: refused at admission (the CRD's schema and
CEL rules) with the field in the error; a typo'd field refused under strict field validation
(and reported as a warning under the client default); or accepted and then ``Degraded`` with
the field, the value and the fix, while the runtime already running for that object keeps
its Deployment (same generation, same plan). The reconcile seam is called directly; no
retry loop hides an exception (an exception fails the test)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from bad_specs import BASE, CASES, BadSpec
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    get_infd,
    prepare_namespaces,
)

from kvtune.operator import reconcile as rec
from kvtune.operator.api.dropped_fields import LAST_APPLIED
from kvtune.operator.kube.apply import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS = "bad-specs"
RUNNING = "running"


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, NS)


def _body(case: BadSpec, name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
            "metadata": {"name": case.name or name, "namespace": NS}, "spec": case.spec()}


def _create(api: Any, body: dict[str, Any], validation: str | None) -> Any:
    """``validation`` None: the client sends no fieldValidation (the API server's default)."""
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, body, field_validation=validation,
        _preload_content=False)


def _dropped_is_degraded(api: Any, case: BadSpec, name: str) -> None:
    """As ``kubectl apply --validate=false`` stores it: no fieldValidation sent (Kubernetes
    1.35 then warns and prunes), the applied object in the last-applied annotation. The
    reconcile is Degraded/InvalidSpec naming the dropped field, and nothing is applied."""
    body = _body(case, name)
    body["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(body)}
    warned = _create(api, body, None)
    warning = warned.headers.get("Warning") or ""
    assert "unknown field" in warning and case.needles[0] in warning, (case.id, warning)
    stored = get_infd(api, NS, name)
    assert f'"{case.needles[0]}":' not in json.dumps(stored["spec"]), (case.id, stored)
    result = rec.reconcile(stored, kube=Kube(api))
    degraded = condition(get_infd(api, NS, name), "Degraded")
    assert degraded is not None and degraded["status"] == "True", (case.id, result.status)
    assert degraded["reason"] == "InvalidSpec", (case.id, degraded)
    assert case.needles[0] in degraded["message"] and "dropped" in degraded["message"], degraded
    with pytest.raises(ApiException):
        client.AppsV1Api(api).read_namespaced_deployment(f"{name}-h100", NS)


def test_the_corpus_is_large_and_named_once() -> None:
    assert len(CASES) >= 80
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.expect for c in CASES} == {"admission", "strict", "degraded", "accepted"}


def test_every_bad_spec_is_refused_or_degraded_and_nothing_running_changes(
    cluster_api: Any,
) -> None:
    started = time.monotonic()
    custom, apps = client.CustomObjectsApi(cluster_api), client.AppsV1Api(cluster_api)
    kube = Kube(cluster_api)
    outcomes: dict[str, str] = {}

    # Refused at admission.
    for i, case in enumerate(c for c in CASES if c.expect == "admission"):
        with pytest.raises(ApiException) as refused:
            _create(cluster_api, _body(case, f"adm-{i}"), "Strict")
        assert refused.value.status == 422, (case.id, refused.value.body)
        text = json.loads(refused.value.body)["message"]
        for needle in case.needles:
            assert needle in text, (case.id, needle, text)
        outcomes[case.id] = "refused"

    # Typos: refused when strict, pruned with a warning otherwise.
    for i, case in enumerate(c for c in CASES if c.expect == "strict"):
        with pytest.raises(ApiException) as refused:
            _create(cluster_api, _body(case, f"typo-{i}"), "Strict")
        # 400: strict decoding refuses before the schema is checked.
        assert refused.value.status in (400, 422), (case.id, refused.value.status)
        assert "unknown field" in refused.value.body, (case.id, refused.value.body)
        warned = _create(cluster_api, _body(case, f"typo-{i}"), "Warn")
        warning = warned.headers.get("Warning") or ""
        assert "unknown field" in warning and case.needles[0] in warning, (case.id, warning)
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, f"typo-{i}")
        _dropped_is_degraded(cluster_api, case, f"dropped-{i}")
        outcomes[case.id] = "refused when strict"

    # A runtime running a good plan; each Degraded case is an edit of it.
    core = client.CoreV1Api(cluster_api)
    for case in CASES:
        for cm_name, data in case.config_maps.items():
            core.create_namespaced_config_map(NS, {"metadata": {"name": cm_name}, "data": data})
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
        "metadata": {"name": RUNNING, "namespace": NS}, "spec": BASE})
    first = rec.reconcile(get_infd(cluster_api, NS, RUNNING), kube=kube)
    assert first.permanent_error is None and first.status["pools"][0]["phase"] == "Applied"
    deployment = apps.read_namespaced_deployment(f"{RUNNING}-h100", NS)
    generation = deployment.metadata.generation
    plan_hash = deployment.metadata.annotations["kvtune.io/plan-hash"]

    for case in (c for c in CASES if c.expect == "degraded"):
        obj = get_infd(cluster_api, NS, RUNNING)
        obj["spec"] = case.spec()
        custom.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, RUNNING, obj,
                                                field_validation="Strict")
        rec.reconcile(get_infd(cluster_api, NS, RUNNING), kube=kube)
        stored = get_infd(cluster_api, NS, RUNNING)
        degraded = condition(stored, "Degraded")
        assert degraded is not None and degraded["status"] == "True", (case.id, stored["status"])
        assert degraded["reason"] == case.reason, (case.id, degraded)
        for needle in case.needles:
            assert needle in degraded["message"], (case.id, needle, degraded["message"])
        assert stored["status"]["observedGeneration"] == stored["metadata"]["generation"]
        running = apps.read_namespaced_deployment(f"{RUNNING}-h100", NS)
        assert running.metadata.generation == generation, case.id
        assert running.metadata.annotations["kvtune.io/plan-hash"] == plan_hash, case.id
        outcomes[case.id] = f"Degraded/{case.reason}"

    # Accepted at the edge of a bound: applied as written, not Degraded.
    for case in (c for c in CASES if c.expect == "accepted"):
        obj = get_infd(cluster_api, NS, RUNNING)
        obj["spec"] = case.spec()
        custom.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, RUNNING, obj,
                                                field_validation="Strict")
        result = rec.reconcile(get_infd(cluster_api, NS, RUNNING), kube=kube)
        assert result.permanent_error is None, (case.id, result.permanent_error)
        degraded = condition(get_infd(cluster_api, NS, RUNNING), "Degraded")
        assert degraded is None or degraded["status"] == "False", (case.id, degraded)
        running = apps.read_namespaced_deployment(f"{RUNNING}-h100", NS).to_dict()["spec"]
        for key, value in case.deployment.items():
            got = running[{"progressDeadlineSeconds": "progress_deadline_seconds"}.get(key, key)]
            assert got == value, (case.id, key, got)
        outcomes[case.id] = "accepted"

    assert set(outcomes) == {c.id for c in CASES}
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome.split("/")[0]] = counts.get(outcome.split("/")[0], 0) + 1
    print(f"\n{len(outcomes)} bad specs in {time.monotonic() - started:.1f}s: {counts}")
