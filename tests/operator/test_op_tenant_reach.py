"""What a tenant's spec may reach through the operator (issue 25 item 3,
operator/render/tenant_reach.py): images from the allow-list, Secrets only when the spec names them
and the API server checked the writer may read them. The refusals are InvalidSpec-worthy
one-liners naming the field, the value and the fix; the cluster test
(test_op_tenant_reach_cluster.py) runs the same through the reconcile and the chart's
admission policy."""

from __future__ import annotations

import dataclasses

import pytest

from kvtune.operator.calibration import calibration_job as calibration
from kvtune.operator.render import pod_policy, tenant_reach
from kvtune.operator.render.objects import ReachError, RenderError, RenderInput, render_pool
from kvtune.tuner.plan import PoolPlan

SPEC_IMAGE = "vllm/vllm-openai:v0.33.0"
TEMPLATE = """
metadata: {labels: {team: a}}
spec:
  containers:
    - name: vllm
      image: %s
      command: {{ command | tojson }}
      args: {{ args | tojson }}
%s
"""


def _input(pool_plan: PoolPlan, image: str, extra: str = "",
           secrets: tuple[str, ...] = ()) -> RenderInput:
    return RenderInput(name="chat", namespace="llm", pool="h200", pool_plan=pool_plan,
                       model_name="meta-llama/Llama-3.1-8B-Instruct", image=SPEC_IMAGE,
                       replicas=1, revision=1, pod_template=TEMPLATE % (image, extra),
                       secrets=secrets)


@pytest.mark.parametrize("image", ["{{ image | tojson }}",
                                   "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0"])
def test_the_specs_image_and_kvtunes_runtime_images_are_allowed_by_default(
        pool_plan: PoolPlan, image: str) -> None:
    render_pool(_input(pool_plan, image))


def test_another_image_is_refused_with_field_value_and_fix(pool_plan: PoolPlan) -> None:
    with pytest.raises(ReachError) as refused:
        render_pool(_input(pool_plan, "evil.example/miner:1"))
    message = str(refused.value)
    assert "spec.containers[0].image='evil.example/miner:1' is not an allowed image" in message
    assert SPEC_IMAGE in message and "podPolicy.allowedImages" in message
    assert "\n" not in message


def test_an_init_container_image_is_checked_too(pool_plan: PoolPlan) -> None:
    extra = "  initContainers: [{name: fetch, image: busybox}]"
    with pytest.raises(ReachError, match=r"spec.initContainers\[0\].image='busybox'"):
        render_pool(_input(pool_plan, "{{ image | tojson }}", extra))


def test_an_allow_list_binds_the_specs_own_image(pool_plan: PoolPlan,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tenant_reach.CONFIG, "images", ("registry.example/vllm/*",))
    with pytest.raises(ReachError, match=r"image='vllm/vllm-openai:v0.33.0'"):
        render_pool(_input(pool_plan, "{{ image | tojson }}"))
    render_pool(_input(pool_plan, "registry.example/vllm/vllm-openai:v0.33.0"))
    # kvtune's own runtime images stay allowed (the chart's calibration.image too).
    monkeypatch.setenv(calibration.DEFAULT_IMAGE_ENV, "mirror.example/kvtune-{gpuClass}:1")
    render_pool(_input(pool_plan, "mirror.example/kvtune-h200:1"))
    assert not tenant_reach.image_allowed("mirror.example/other:1",
                                          tenant_reach.allowed_images(SPEC_IMAGE))


SECRET_ENV = ("      env: [{name: T, valueFrom: {secretKeyRef: {name: hf-token, key: t}}}]")


def test_a_secret_needs_the_spec_to_name_it_and_admission_to_have_checked_the_writer(
        pool_plan: PoolPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_policy.CONFIG, "secrets", ("hf-token",))  # the chart allows it
    inp = _input(pool_plan, "{{ image | tojson }}", SECRET_ENV)
    monkeypatch.setattr(tenant_reach.CONFIG, "secrets_checked_at_admission", True)
    with pytest.raises(ReachError, match=r"secretKeyRef='hf-token': a Secret the spec does "
                       r"not name. Fix: add it to spec.runtime.secrets"):
        render_pool(inp)
    named = dataclasses.replace(inp, secrets=("hf-token",))
    render_pool(named)
    monkeypatch.setattr(tenant_reach.CONFIG, "secrets_checked_at_admission", False)
    with pytest.raises(ReachError, match=r"admissionPolicy.enabled=true"):
        render_pool(named)


def test_the_chart_allow_list_still_bounds_a_named_secret(
        pool_plan: PoolPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    """Named in the spec and readable by its writer is not enough: the operator's token may
    mount only podPolicy.allowedSecrets (its own admission policy refuses the rest)."""
    monkeypatch.setattr(tenant_reach.CONFIG, "secrets_checked_at_admission", True)
    inp = _input(pool_plan, "{{ image | tojson }}", SECRET_ENV, secrets=("hf-token",))
    with pytest.raises(Exception, match=r"podPolicy.allowedSecrets"):
        render_pool(inp)


def test_a_template_may_not_override_kvtunes_labels_nor_set_one_the_api_server_refuses(
        pool_plan: PoolPlan) -> None:
    """A template's label cannot change kvtune's own (its selector, GPU class, revision,
    app.kubernetes.io/*): refused naming it; the same value (pod_labels) is fine. One the API
    server would refuse is a render error naming it (before: the apply failed on every
    reconcile)."""
    inp = _input(pool_plan, "{{ image | tojson }}")

    def labelled(labels: str) -> RenderInput:
        template = TEMPLATE.replace("{team: a}", labels)
        return dataclasses.replace(inp, pod_template=template % ("{{ image | tojson }}", ""))

    for claim in ("kvtune.io/gpu-class: B200", "app.kubernetes.io/managed-by: me"):
        with pytest.raises(RenderError, match=rf"metadata.labels\['{claim.split(':')[0]}'\]="
                           r".* overrides kvtune's own"):
            render_pool(labelled("{team: a, " + claim + "}"))
    (dep, *_) = render_pool(labelled("{{ pod_labels | tojson }}"))
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "kvtune"
    assert labels["kvtune.io/gpu-class"] == pool_plan.gpu_class
    with pytest.raises(RenderError, match=r"metadata.labels\['team'\]='a b': not a label value"):
        render_pool(labelled("{team: 'a b'}"))


def test_a_template_beside_named_secrets_must_be_pinned_by_its_digest() -> None:
    """The ConfigMap's writers are not checked at admission: with spec.runtime.secrets set,
    the spec pins the template's SHA-256; unset or another digest is refused, naming the
    current one (to set after review); without Secrets nothing is required."""
    import hashlib

    from kvtune.operator.api import RuntimeSpec

    text = TEMPLATE % ("{{ image | tojson }}", "")
    digest = hashlib.sha256(text.encode()).hexdigest()
    ref = {"configMapRef": {"name": "tpl"}}
    assert tenant_reach.unpinned_template(RuntimeSpec(podTemplate=ref), text) is None
    unset = tenant_reach.unpinned_template(
        RuntimeSpec(podTemplate=ref, secrets=["hf-token"]), text)
    assert unset is not None and "spec.runtime.podTemplate.sha256 is unset" in unset
    assert f"has SHA-256 {digest}" in unset and "Fix: review the template" in unset
    other = tenant_reach.unpinned_template(RuntimeSpec(
        podTemplate={**ref, "sha256": "0" * 64}, secrets=["hf-token"]), text)
    assert other is not None and f"sha256='{'0' * 64}'" in other
    assert tenant_reach.unpinned_template(RuntimeSpec(
        podTemplate={**ref, "sha256": digest}, secrets=["hf-token"]), text) is None
