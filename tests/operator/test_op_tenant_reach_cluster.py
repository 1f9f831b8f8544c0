"""The pod-template deputy (issue 25 item 3) on the real API server: a tenant allowed only
InferenceDeployments and ConfigMaps gets, through the operator, no image and no Secret she
could not get herself.

- At admission (the chart's tenant-secrets ValidatingAdmissionPolicy, rendered by helm and
  installed here): a spec may name in ``spec.runtime.secrets`` only Secrets its writer may
  ``get`` (the authorizer, asked for the requesting user); the tenant's own token is refused
  for a Secret she cannot read, on create and on a spec update, and admitted for one she can.
- At reconcile (the reconcile seam, called directly; operator/render/tenant_reach.py): a template
  that references a Secret the spec does not name, or runs an image off the allow-list, is
  Degraded/InvalidSpec naming the field, the value and the fix, and nothing is applied;
  without the admission policy (``--tenant-secrets-admission`` unset) a named Secret is
  refused too. Before, the operator mounted any Secret of the chart's allow-list
  (``podPolicy.allowedSecrets``) into a tenant's own image.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    condition,
    get_infd,
    prepare_namespaces,
    service_account_client,
)
from op_samples import SAMPLE_SPEC
from waiting import wait_for

from kvtune.operator import reconcile as rec
from kvtune.operator.kube.apply import Kube
from kvtune.operator.render import pod_policy, tenant_reach

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS = "tenant-reach"
TENANT = "alice"
CHART = Path(__file__).resolve().parents[2] / "charts/kvtune"
POLICY = "kvtune-reach-tenant-secrets"

TEMPLATE = """\
metadata:
  labels: {{ pod_labels | tojson }}
spec:
  containers:
    - name: vllm
      image: %(image)s
      command: {{ command | tojson }}
      args: {{ args | tojson }}
      resources: {{ resources | tojson }}
      env:
        - name: HF_TOKEN
          valueFrom: {secretKeyRef: {name: %(env_secret)s, key: token}}
      volumeMounts: [{name: creds, mountPath: /creds}]
  volumes:
    - name: creds
      secret: {secretName: hf-token}
"""


def _install_policy(admin: Any, kubeconfig: Path) -> None:
    """The chart's tenant-secrets policy and binding, as ``helm template`` renders them."""
    from kvtune.e2e.binaries import ensure_built

    helm = ensure_built(["helm"])["helm"]
    out = subprocess.run(
        [str(helm), "template", "kvtune-reach", str(CHART), "-n", "kvtune-reach-system",
         "--show-only", "templates/tenant-secrets-policy.yaml"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    adm = client.AdmissionregistrationV1Api(admin)
    for doc in yaml.safe_load_all(out):
        if doc["kind"] == "ValidatingAdmissionPolicy":
            adm.create_validating_admission_policy(doc)
        else:
            adm.create_validating_admission_policy_binding(doc)

    def checked() -> Any:
        policy = adm.read_validating_admission_policy(POLICY)
        return policy if policy.status and policy.status.observed_generation else None

    policy = wait_for(checked, f"{POLICY} type-checked", 60)
    assert not (policy.status.type_checking
                and policy.status.type_checking.expression_warnings), policy.status


def _tenant(admin: Any) -> None:
    """alice: InferenceDeployments and ConfigMaps in NS, and get on Secret hf-token only."""
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    subject = [{"kind": "ServiceAccount", "name": TENANT, "namespace": NS}]
    objects: list[tuple[Any, dict[str, Any]]] = [
        (core.create_namespaced_service_account, {"metadata": {"name": TENANT}}),
        (core.create_namespaced_secret, {"metadata": {"name": "hf-token"},
                                         "stringData": {"token": "hf_tenant"}}),
        (core.create_namespaced_secret, {"metadata": {"name": "db"},
                                         "stringData": {"token": "hunter2"}}),
        (rbac.create_namespaced_role, {"metadata": {"name": TENANT}, "rules": [
            {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["hf-token"],
             "verbs": ["get"]}]}),
        (rbac.create_namespaced_role_binding, {
            "metadata": {"name": TENANT}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": TENANT}}),
    ]
    for create, body in objects:
        with contextlib.suppress(ApiException):
            create(NS, body)


@pytest.fixture(scope="module")
def apis(local_cluster: Any) -> tuple[Any, Any]:
    """(admin, alice's ApiClient), the policy in force."""
    admin = prepare_namespaces(local_cluster, NS)
    kubeconfig = Path(local_cluster.kubeconfig_path)
    _install_policy(admin, kubeconfig)
    _tenant(admin)
    alice = service_account_client(admin, kubeconfig, NS, TENANT)

    def in_force() -> bool:  # a dry run the policy refuses
        try:
            _create(alice, "probe", _spec(["db"]), dry_run=True)
        except ApiException as exc:
            return exc.status == 403
        return False

    wait_for(in_force, "the tenant-secrets policy to take effect", 60)
    return admin, alice


def _spec(secrets: list[str], template: str | None = None,
          sha256: str | None = None) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    spec.pop("rollout", None)
    spec["runtime"] = {"secrets": secrets}
    if template:
        spec["runtime"]["podTemplate"] = {"configMapRef": {"name": template}}
        if sha256:
            spec["runtime"]["podTemplate"]["sha256"] = sha256
    return spec


def _create(api: Any, name: str, spec: dict[str, Any], dry_run: bool = False) -> Any:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, {"apiVersion": f"{GROUP}/{VERSION}",
                                     "kind": "InferenceDeployment",
                                     "metadata": {"name": name}, "spec": spec},
        dry_run="All" if dry_run else None)


def _refusal(call: Any) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return str(json.loads(refused.value.body)["message"])


def test_a_spec_names_only_secrets_its_writer_may_read(apis: tuple[Any, Any]) -> None:
    admin, alice = apis
    custom = client.CustomObjectsApi(alice)
    message = _refusal(lambda: _create(alice, "steal", _spec(["hf-token", "db"])))
    assert "spec.runtime.secrets[1]=db" in message and f"system:serviceaccount:{NS}:{TENANT}" \
        in message and "Fix: remove it from spec.runtime.secrets" in message, message
    _create(alice, "mine", _spec(["hf-token"]))  # a Secret she may read: admitted
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "mine")
    obj["spec"]["runtime"]["secrets"] = ["hf-token", "db"]
    message = _refusal(lambda: custom.replace_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "mine", obj))
    assert "spec.runtime.secrets[1]=db" in message, message
    # The admin, who may read db, names it; alice may still change the object's metadata
    # (her label adds no reach), but not its spec.
    _create(admin, "admins", _spec(["db"]))
    custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "admins",
                                          {"metadata": {"labels": {"team": "alice"}}})
    message = _refusal(lambda: custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "admins", {"spec": {"workload": {"profile": "rag"}}}))
    assert "spec.runtime.secrets[0]=db" in message, message


def _template(alice: Any, name: str, image: str, env_secret: str) -> str:
    """The template's ConfigMap; its SHA-256, which a spec naming Secrets pins."""
    text = TEMPLATE % {"image": image, "env_secret": env_secret}
    client.CoreV1Api(alice).create_namespaced_config_map(NS, {
        "metadata": {"name": name}, "data": {"pod.yaml.j2": text}})
    return hashlib.sha256(text.encode()).hexdigest()


def _degraded(admin: Any, name: str) -> dict[str, Any]:
    result = rec.reconcile(get_infd(admin, NS, name), kube=Kube(admin))
    degraded = condition(get_infd(admin, NS, name), "Degraded")
    assert degraded is not None and degraded["status"] == "True", result.status
    return degraded


def _no_deployment(admin: Any, name: str) -> None:
    with pytest.raises(ApiException) as missing:
        client.AppsV1Api(admin).read_namespaced_deployment(f"{name}-h100", NS)
    assert missing.value.status == 404


def test_the_operator_mounts_only_named_secrets_into_allowed_images(
    apis: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin, alice = apis
    # The chart allows both Secrets for the operator's token (podPolicy.allowedSecrets), as
    # in the attack: only the tenant's own reach may stop the deputy now.
    monkeypatch.setattr(pod_policy.CONFIG, "secrets", ("hf-token", "db"))
    monkeypatch.setattr(tenant_reach.CONFIG, "secrets_checked_at_admission", True)
    runtime = SAMPLE_SPEC.get("runtime", {}).get("image", "vllm/vllm-openai:v0.33.0")
    thief = _template(alice, "steals-db", "{{ image | tojson }}", "db")
    miner = _template(alice, "own-image", "evil.example/miner:1", "hf-token")
    fine = _template(alice, "fine", "{{ image | tojson }}", "hf-token")
    _create(alice, "db-thief", _spec(["hf-token"], "steals-db", thief))
    _create(alice, "miner", _spec(["hf-token"], "own-image", miner))
    _create(alice, "fine", _spec(["hf-token"], "fine", fine))
    # Unpinned, the template beside a named Secret is not rendered: whoever may write the
    # ConfigMap (not checked at admission) could change what runs with the Secret.
    _create(alice, "unpinned", _spec(["hf-token"], "fine"))
    degraded = _degraded(admin, "unpinned")
    assert degraded["reason"] == "InvalidSpec", degraded
    assert "spec.runtime.podTemplate.sha256 is unset" in degraded["message"], degraded
    assert f"has SHA-256 {fine}" in degraded["message"], degraded
    _no_deployment(admin, "unpinned")

    degraded = _degraded(admin, "db-thief")
    assert degraded["reason"] == "InvalidSpec", degraded
    assert "spec.containers[0].env[0].valueFrom.secretKeyRef='db'" in degraded["message"]
    assert "Fix: add it to spec.runtime.secrets" in degraded["message"], degraded
    _no_deployment(admin, "db-thief")

    degraded = _degraded(admin, "miner")
    assert degraded["reason"] == "InvalidSpec", degraded
    assert "spec.containers[0].image='evil.example/miner:1' is not an allowed image" \
        in degraded["message"] and "podPolicy.allowedImages" in degraded["message"], degraded
    assert runtime in degraded["message"]  # the allowed images are named
    _no_deployment(admin, "miner")

    result = rec.reconcile(get_infd(admin, NS, "fine"), kube=Kube(admin))
    assert result.permanent_error is None, result.status
    pod = client.AppsV1Api(admin).read_namespaced_deployment("fine-h100", NS).spec.template
    assert [v.secret.secret_name for v in pod.spec.volumes if v.secret] == ["hf-token"]

    # An allow-list set by the chart: the spec's own image must match it too.
    monkeypatch.setattr(tenant_reach.CONFIG, "images", ("registry.example/vllm/*",))
    degraded = _degraded(admin, "fine")
    assert degraded["reason"] == "InvalidSpec"
    assert f"spec.containers[0].image={runtime!r}" in degraded["message"], degraded
    monkeypatch.setattr(tenant_reach.CONFIG, "images", ())

    # Without the admission policy nobody checked the writer: a named Secret is refused.
    monkeypatch.setattr(tenant_reach.CONFIG, "secrets_checked_at_admission", False)
    _create(admin, "unchecked", _spec(["hf-token"], "fine", fine))
    degraded = _degraded(admin, "unchecked")
    assert degraded["reason"] == "InvalidSpec"
    assert "admissionPolicy.enabled=true" in degraded["message"], degraded
    _no_deployment(admin, "unchecked")
