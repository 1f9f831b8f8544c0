"""The KV-quality calibration Job and its report cache, as pure objects: the Job is the
pool's pod (affinity, GPU request, volumes, secrets, service account) running
`python3 -m kvtune.quality` on the runtime's model; results from the Job's status and pod."""

from __future__ import annotations

import json
from typing import Any

import pytest
from op_samples import make_pool_plan

from kvtune.operator.calibration import calibration_job as calibration
from kvtune.operator.render import pod_policy, tenant_reach
from kvtune.operator.render.objects import RenderInput, render_pool
from kvtune.tuner.kv_quality import KVDtypeMeasurement, KVQualityEvidence
from kvtune.tuner.plan import CandidateVerdict, Reason

AFFINITY = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                           "values": ["NVIDIA-H200"]}]}]}}
TEMPLATE = """\
metadata: {labels: {{ pod_labels | tojson }}}
spec:
  affinity: {{ {"nodeAffinity": affinity} | tojson }}
  tolerations: {{ tolerations | tojson }}
  containers:
    - name: vllm
      image: ghcr.io/kvtune/kvtune-vllm-h200:0.1.0
      command: ["python3", "-m", "kvtune.runtime"]
      args: {{ args | tojson }}
      env:
        - {name: KVTUNE_PLAN, value: {{ plan_json | tojson }}}
        - name: HF_TOKEN
          valueFrom: {secretKeyRef: {name: hf-token, key: token}}
      resources:
        limits: {{ {"nvidia.com/gpu": gpus | string} | tojson }}
      readinessProbe: {httpGet: {path: /health, port: 8000}}
      volumeMounts: [{name: models, mountPath: /models}]
    - {name: log-shipper, image: busybox}
  volumes: [{name: models, persistentVolumeClaim: {claimName: llama-weights}}]
"""


@pytest.fixture(autouse=True)
def _tenant_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """The template's log-shipper sidecar is an image the chart allows
    (podPolicy.allowedImages), and its hf-token is named in the spec and checked at
    admission (operator/render/tenant_reach.py)."""
    monkeypatch.setattr(tenant_reach.CONFIG, "images", ("vllm/vllm-openai:*", "busybox"))
    monkeypatch.setattr(tenant_reach.CONFIG, "secrets_checked_at_admission", True)


def _deployment(entrypoint: str = "kvtune", template: str | None = TEMPLATE) -> dict[str, Any]:
    objects = render_pool(RenderInput(
        name="chat", namespace="llm", pool="h200", pool_plan=make_pool_plan(),
        model_name="/models/llama-3.1-8b",
        image="vllm/vllm-openai:v0.33.0", replicas=2, revision=1, affinity=AFFINITY,
        pod_template=template, entrypoint=entrypoint, secrets=("hf-token",),
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "llm",
                      "effect": "NoSchedule"}]))
    return next(o for o in objects if o["kind"] == "Deployment")


def _job(deployment: dict[str, Any]) -> dict[str, Any]:
    return calibration.render_job(
        deployment=deployment, name="chat-kvq-1", namespace="llm",
        model="/models/llama-3.1-8b", revision="abc123", dtypes=["fp8", "int8_per_token_head"],
        image=calibration.job_image(deployment, None) or "", timeout_seconds=1800,
        max_prompt_tokens=1024, labels={"kvtune.io/deployment": "chat"})


def test_the_job_is_the_pools_pod_running_the_measurement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The model hub token is a Secret the chart allows (podPolicy.allowedSecrets).
    monkeypatch.setattr(pod_policy.CONFIG, "secrets", ("hf-token",))
    deployment = _deployment()
    job = _job(deployment)
    pod, source = job["spec"]["template"]["spec"], deployment["spec"]["template"]["spec"]
    assert pod["affinity"] == source["affinity"] == {"nodeAffinity": AFFINITY}
    assert pod["tolerations"] == source["tolerations"]
    assert pod["volumes"] == source["volumes"]
    assert pod["serviceAccountName"] == source["serviceAccountName"] == "kvtune-runtime"
    assert pod["restartPolicy"] == "Never"
    [container] = pod["containers"]  # the log shipper would keep the Job from ending
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert container["volumeMounts"] == [{"name": "models", "mountPath": "/models"}]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token",
                                                             "key": "token"}}
    assert "POD_NAME" in env and "KVTUNE_PLAN" not in env
    assert container["image"] == "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0"
    assert container["command"] == ["python3", "-m", "kvtune.quality"]
    args = container["args"]
    assert args[args.index("--model") + 1] == "/models/llama-3.1-8b"
    assert args[args.index("--dtypes") + 1] == "fp8,int8_per_token_head"
    assert args[args.index("--report-annotation") + 1] == calibration.REPORT_ANNOTATION
    assert "readinessProbe" not in container and "ports" not in container
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 1800
    assert job["metadata"]["annotations"][calibration.ANNOTATION_REVISION] == "abc123"


def test_a_plain_vllm_image_needs_a_calibration_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(calibration.DEFAULT_IMAGE_ENV, raising=False)
    plain = _deployment(entrypoint="vllm", template=None)
    assert calibration.job_image(plain, None, gpu_class="H200") is None
    assert calibration.job_image(plain, "ghcr.io/me/kvq:1") == "ghcr.io/me/kvq:1"


def test_the_charts_default_image_is_kvtunes_runtime_image_for_the_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The chart's calibration.image (KVTUNE_CALIBRATION_IMAGE): the guardrail runs by
    # default on a plain vLLM pool; the spec's own image still wins.
    monkeypatch.setenv(calibration.DEFAULT_IMAGE_ENV,
                       "ghcr.io/kvtune/kvtune-vllm-{gpuClass}:0.1.0-vllm0.33.0")
    plain = _deployment(entrypoint="vllm", template=None)
    assert calibration.job_image(plain, None, gpu_class="H200") == \
        "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0"
    assert calibration.job_image(plain, None, gpu_class="B200") == \
        "ghcr.io/kvtune/kvtune-vllm-b200:0.1.0-vllm0.33.0"
    assert calibration.job_image(plain, "ghcr.io/me/kvq:1", gpu_class="H200") == \
        "ghcr.io/me/kvq:1"
    monkeypatch.setenv(calibration.DEFAULT_IMAGE_ENV, "")  # calibration.image.repository=""
    assert calibration.job_image(plain, None, gpu_class="H200") is None


def test_the_job_keeps_the_requests_and_drops_the_memory_limit() -> None:
    # kvtune's own pod: memory limit = request, sized for vLLM; transformers loads the whole
    # checkpoint on the host, so the Job has no memory limit (the GPU limit stays).
    plain = _deployment(entrypoint="vllm", template=None)
    served = plain["spec"]["template"]["spec"]["containers"][0]["resources"]
    job = calibration.render_job(
        deployment=plain, name="chat-kvq-1", namespace="llm", model="m", revision="r",
        dtypes=["fp8"], image="ghcr.io/kvtune/kvtune-vllm-h200:0.1.0", timeout_seconds=60,
        max_prompt_tokens=64, labels={"kvtune.io/deployment": "chat"})
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == served["requests"]
    assert "memory" in served["limits"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName"])
def test_a_job_whose_image_cannot_be_pulled_fails_at_once(reason: str) -> None:
    pod = {"metadata": {"name": "chat-kvq-1-x"}, "status": {"containerStatuses": [{
        "image": "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0",
        "state": {"waiting": {"reason": reason, "message": "not found"}}}]}}
    result = calibration.job_result({"status": {}}, [pod])
    assert result.phase == "failed"
    assert reason in result.message and "calibration.image" in result.message
    creating = {"status": {"containerStatuses": [{"state": {"waiting": {
        "reason": "ContainerCreating"}}}]}}
    assert calibration.job_result({"status": {}}, [creating]).phase == "running"


def test_names_are_per_model_revision_and_dtypes() -> None:
    a = calibration.job_name("chat", "m", "r1", ["fp8"])
    assert a == calibration.job_name("chat", "m", "r1", ["fp8"])
    assert a != calibration.job_name("chat", "m", "r2", ["fp8"])
    assert a != calibration.job_name("chat", "m", "r1", ["fp8", "int8_per_token_head"])
    long = calibration.job_name("x" * 80, "m", "r1", ["fp8"])
    assert len(long) <= 63 and long.endswith(a[a.index("-kvq-"):])
    assert calibration.cache_name("d", "m", "r1") != calibration.cache_name("d", "m", "r2")
    assert calibration.cache_name("d", "m", "r1") != calibration.cache_name("e", "m", "r1")


def test_dtypes_to_measure_are_the_unmeasured_narrow_candidates() -> None:
    plan = make_pool_plan().model_copy(update={"reasons": (Reason(
        knob="kv-cache-dtype", choice="fp8", code="WidestThatMeetsConcurrency", message="",
        candidates=(CandidateVerdict(value="auto", ok=False, check="TooFewSequences",
                                     detail=""),
                    CandidateVerdict(value="fp8", ok=True, check="Chosen", detail=""),
                    CandidateVerdict(value="int8_per_token_head", ok=True,
                                     check="WiderDTypeMeetsTarget", detail=""),
                    CandidateVerdict(value="nvfp4", ok=False, check="UnsupportedByBackend",
                                     detail=""),
                    CandidateVerdict(value="int4_per_token_head", ok=False,
                                     check="BelowQualityFloor", detail=""))),)})
    assert calibration.dtypes_to_measure(plan, None) == ["fp8", "int8_per_token_head"]
    measured = KVQualityEvidence(source="x", measurements=(
        KVDtypeMeasurement(dtype="fp8", kl_mean=1e-4, top1_agreement=0.99),))
    assert calibration.dtypes_to_measure(plan, measured) == ["int8_per_token_head"]
    random = measured.model_copy(update={"random_weights": True})
    assert calibration.dtypes_to_measure(plan, random) == ["fp8", "int8_per_token_head"]


REPORT = {"schema": "kvtune.io/kv-quality/v1", "weights": "checkpoint",
          "checkpoint": {"layers": 32, "layers_with_scales": 0},
          "measurements": [{"dtype": "fp8", "kl_mean": 3e-4, "top1_agreement": 0.993,
                            "attention_error_max": 0.04, "attention_error_worst_layer": 1}]}


JOB_UID = "job-uid-1"


def _pod(annotation: str | None = None, message: str | None = None, owner: str = JOB_UID,
         container: str = "vllm") -> dict[str, Any]:
    return {"metadata": {"annotations": {calibration.REPORT_ANNOTATION: annotation}
                         if annotation else {},
                         "ownerReferences": [{"kind": "Job", "uid": owner, "controller": True}]},
            "status": {"containerStatuses": [{"name": container,
                                              "state": {"terminated": {"message": message}}}]
                       if message else []}}


def test_job_results() -> None:
    done = {"metadata": {"uid": JOB_UID},
            "spec": {"template": {"spec": {"containers": [{"name": "vllm"}]}}},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    timed_out = {"status": {"conditions": [{"type": "Failed", "status": "True",
                                            "reason": "DeadlineExceeded",
                                            "message": "Job was active longer than specified "
                                                       "deadline"}]}}
    assert calibration.job_result(None, []).phase == "absent"
    assert calibration.job_result({"status": {}}, []).phase == "running"
    ok = calibration.job_result(done, [_pod(message=json.dumps(REPORT))])
    assert ok.phase == "succeeded" and ok.report == REPORT
    empty = calibration.job_result(done, [_pod(message="Completed")])
    assert empty.phase == "failed" and "left no report" in empty.message
    # Issue 25: only the termination message of the Job's own container, in a pod the Job
    # controls, vouches for the measurement: not an annotation (anyone who may patch pods),
    # not another container's message, not a pod that only carries the Job's label.
    for forged in (_pod(annotation=json.dumps(REPORT)),
                   _pod(message=json.dumps(REPORT), container="sidecar"),
                   _pod(message=json.dumps(REPORT), owner="another-job")):
        result = calibration.job_result(done, [forged])
        assert result.phase == "failed" and result.report is None, forged
    late = calibration.job_result(timed_out, [])
    assert late.phase == "failed" and late.message.startswith("DeadlineExceeded")


def test_the_cache_keeps_every_dtype_measured_for_the_revision() -> None:
    newer = {**REPORT, "measurements": [{"dtype": "int8_per_token_head", "kl_mean": 1e-4,
                                         "top1_agreement": 0.997}]}
    merged = calibration.merge_reports(REPORT, newer)
    assert [m["dtype"] for m in merged["measurements"]] == ["fp8", "int8_per_token_head"]
    cm = calibration.report_config_map(name="kvtune-kvq-x", namespace="llm", model="m",
                                       revision="r", report=merged, labels={})
    assert calibration.report_from_config_map(cm) == merged
    status = calibration.status(model="m", revision="r", phase="Measured", report=merged)
    assert [d.allowed for d in status.dtypes] == [True, True]
    assert status.checkpoint_kv_scales == "no calibrated KV scales: vLLM uses 1.0 for fp8"


def test_only_objects_this_deployment_owns_count() -> None:
    mine = {"metadata": {"ownerReferences": [{"uid": "u1", "controller": True}]}}
    forged = {"metadata": {"ownerReferences": [{"uid": "u2", "controller": True}]}}
    assert calibration.owned_by(mine, "u1") is mine
    assert calibration.owned_by(forged, "u1") is None
    assert calibration.owned_by({"metadata": {}}, "u1") is None
    assert calibration.owned_by(mine, None) is None


def test_the_retune_timer_sees_the_gate_from_status() -> None:
    from op_samples import SAMPLE_SPEC

    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.calibration.calibration_flow import from_status

    spec = InferenceDeploymentSpec.model_validate(
        {**SAMPLE_SPEC, "model": {**SAMPLE_SPEC["model"], "revision": "r"}})
    model = spec.model.name
    running = calibration.status(model=model, revision="r", phase="Calibrating", job="j1")
    policy, evidence = from_status(spec, running)
    assert policy.require_measurement and "j1" in policy.required_by and evidence is None
    measured = calibration.status(model=model, revision="r", phase="Measured", report=REPORT,
                                  config_map="kvtune-kvq-x")
    policy, evidence = from_status(spec, measured)
    assert not policy.require_measurement
    assert evidence is not None and evidence.find("fp8") is not None
    other = calibration.status(model=model, revision="old", phase="Failed", job="j0")
    policy, evidence = from_status(spec, other)
    assert not policy.require_measurement and evidence is None
    # Unmeasurable here: the timer holds the wider dtype too, unless the spec accepts it.
    unmeasurable = calibration.status(model=model, revision="r", phase="Unverified")
    assert from_status(spec, unmeasurable)[0].require_measurement
    accepting = spec.model_copy(update={"quality": spec.quality.model_copy(  # type: ignore[union-attr]
        update={"accept_unverified": True})})
    assert not from_status(accepting, unmeasurable)[0].require_measurement


def test_a_narrower_dtype_that_cannot_be_measured_here_is_unverified_not_not_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No calibration image (a plain vLLM pod, no spec.quality.calibration.image, the chart's
    calibration.image emptied): the gate fails closed (issue 25): maybe_start asks for the pool
    to be planned again with the held policy (the wider dtype), and status.kvQuality says
    Unverified, why and the fix; with spec.quality.acceptUnverified the planned fp8 rolls out
    unmeasured, said as such. The no-image path makes no API call (the 403 path is tested on
    the real apiserver in tests/chart/test_chart_cluster.py)."""
    monkeypatch.delenv(calibration.DEFAULT_IMAGE_ENV, raising=False)
    from op_samples import SAMPLE_SPEC

    from kvtune.operator.api import InferenceDeploymentSpec, QualitySpec
    from kvtune.operator.calibration.calibration_flow import Gate, maybe_start

    spec = InferenceDeploymentSpec.model_validate(SAMPLE_SPEC)
    body = {"metadata": {"name": "chat", "namespace": "llm", "uid": "u1"}}
    plain = _deployment(entrypoint="vllm", template=None)

    def gate(accept: bool = False) -> Gate:
        return Gate(model="m", revision="r", config_map="kvtune-kvq-x",
                    quality=QualitySpec(acceptUnverified=accept))

    narrow = gate()
    # True: plan the pool again with the wider dtype held (fp8 is not rolled out unmeasured).
    assert maybe_start(None, body, spec, narrow, make_pool_plan(), plain,  # type: ignore[arg-type]
                       pool_name="h200")
    assert narrow.hold and narrow.policy().require_measurement
    status = narrow.status()
    assert status.phase == "Unverified", status
    assert "pool h200: fp8" in status.message and "revision r" in status.message
    assert "the wider dtype stays" in status.message
    assert "spec.quality.calibration.image" in status.message  # the reason and the fix
    assert "chart value calibration.image" in status.message
    assert "spec.quality.acceptUnverified" in status.message

    accepted = gate(accept=True)
    assert not maybe_start(None, body, spec, accepted, make_pool_plan(), plain,  # type: ignore[arg-type]
                           pool_name="h200")
    assert not accepted.hold and not accepted.policy().require_measurement
    assert "rolled out unmeasured" in accepted.status().message

    disabled = Gate(model="m", revision="r", config_map="kvtune-kvq-x", quality=QualitySpec(
        calibration={"enabled": False}))  # type: ignore[arg-type]
    assert maybe_start(None, body, spec, disabled, make_pool_plan(), plain,  # type: ignore[arg-type]
                       pool_name="h200")
    assert disabled.status().phase == "Unverified"
    assert "calibration.enabled is false" in disabled.status().message

    wide = gate()
    assert not maybe_start(None, body, spec, wide, make_pool_plan(kv_cache_dtype="auto"),  # type: ignore[arg-type]
                           plain, pool_name="h200")
    assert wide.status().phase == "NotNeeded"


def test_a_calibration_image_off_the_allow_list_is_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """spec.quality.calibration.image is a tenant's image the operator would run as a Job
    (issue 25 item 3): off the chart's podPolicy.allowedImages it is not started; the dtype
    stays unverified (the wider one planned) and status.kvQuality names the field, the value
    and the fix. On the list, the Job is rendered as before."""
    monkeypatch.delenv(calibration.DEFAULT_IMAGE_ENV, raising=False)
    from op_samples import SAMPLE_SPEC

    from kvtune.operator.api import InferenceDeploymentSpec, QualitySpec
    from kvtune.operator.calibration.calibration_flow import Gate, maybe_start

    spec = InferenceDeploymentSpec.model_validate(SAMPLE_SPEC)
    body = {"metadata": {"name": "chat", "namespace": "llm", "uid": "u1"}}
    plain = _deployment(entrypoint="vllm", template=None)
    gate = Gate(model="m", revision="r", config_map="kvtune-kvq-x", quality=QualitySpec(
        calibration={"image": "evil.example/miner:1"}))  # type: ignore[arg-type]
    assert maybe_start(None, body, spec, gate, make_pool_plan(), plain,  # type: ignore[arg-type]
                       pool_name="h200")
    status = gate.status()
    assert status.phase == "Unverified" and status.unverified_cause == "ImageNotAllowed"
    assert "spec.quality.calibration.image='evil.example/miner:1' is not an allowed image" \
        in status.message and "podPolicy.allowedImages" in status.message, status.message
    monkeypatch.setattr(tenant_reach.CONFIG, "images", ("evil.example/*",))
    allowed = Gate(model="m", revision="r", config_map="kvtune-kvq-x", quality=QualitySpec(
        calibration={"image": "evil.example/miner:1"}))  # type: ignore[arg-type]
    with pytest.raises(AttributeError):  # past the check: it applies the Job (kube is None)
        maybe_start(None, body, spec, allowed, make_pool_plan(), plain,  # type: ignore[arg-type]
                    pool_name="h200")

