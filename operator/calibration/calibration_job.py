"""The KV-quality calibration Job (issue 15): measure a narrower KV dtype before it first rolls
out for a model revision, keep the report, and gate the plans on it.

- The Job is the pool's own pod, re-purposed: the rendered Deployment's pod template (its
  node affinity, tolerations, GPU request, volumes, env and secrets: the model comes from the
  same source as the runtime) with the vLLM container's command replaced by
  ``python3 -m kvtune.quality --model <the runtime's model> ...`` and no probes or ports.
  ``activeDeadlineSeconds`` is ``spec.quality.calibration.timeout``; ``backoffLimit: 0``.
- The report comes back in the Job's own pod's termination message (compact JSON, at most
  4096 bytes), which only the kubelet writes, from the container's own file: a pod
  annotation (anyone who may patch pods) or the namespace's shared runtime-reports
  ConfigMap (any pod of the runtime's account, or anyone who may patch ConfigMaps there)
  would let another writer vouch for this Job's measurement (issue 25). Only a pod the Job
  controls (its ownerReference) counts.
- The operator keeps it in the ConfigMap ``kvtune-kvq-<hash of deployment, model@revision>``
  (key ``report.json``; measurements merged per dtype, so the cache is per model revision and
  dtype) and summarises it in ``status.kvQuality``. The Job and the ConfigMap are applied
  like every child (``apply.apply_owned``): a name taken by an object kvtune did not create
  for this InferenceDeployment is a NameCollision, never a takeover.
- While the Job runs, and when it failed (timeout included), plans are made with
  ``require_measurement``: the wider dtype stays.

Pure builders and readers below; ``apply``/``read`` take a ``Kube``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvtune.operator.api import KVQualityDtypeStatus, KVQualityStatus
from kvtune.quality.layouts import LAYOUTS
from kvtune.tuner import kv_quality
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.checks import (
    BELOW_QUALITY_FLOOR,
    NOT_MODELED,
    UNSUPPORTED_BY_BACKEND,
)

REPORT_ANNOTATION = "kvtune.io/kv-quality-report"
REPORT_KEY = "report.json"
LABEL_KV_QUALITY = "kvtune.io/kv-quality"
LABEL_DEPLOYMENT = "kvtune.io/deployment"
ANNOTATION_MODEL = "kvtune.io/model"
ANNOTATION_REVISION = "kvtune.io/model-revision"
JOB_COMMAND = ("python3", "-m", "kvtune.quality")
UNPINNED = "unpinned"
_MAX_NAME = 63
_NOT_CANDIDATES = {UNSUPPORTED_BY_BACKEND, NOT_MODELED, BELOW_QUALITY_FLOOR}

JobPhase = Literal["absent", "running", "succeeded", "failed"]


def _digest(*parts: str, length: int = 10) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:length]


def cache_name(deployment: str, model: str, revision: str) -> str:
    """The report ConfigMap of one InferenceDeployment's model revision. Its own: a report
    counts only from a ConfigMap the InferenceDeployment controls, so two of them serving one
    model in a namespace must not write one name (the second would be a NameCollision)."""
    return f"kvtune-kvq-{_digest(deployment, model, revision)}"


def shared_cache_name(model: str, revision: str) -> str:
    """The name kvtune gave the report ConfigMap before it was per InferenceDeployment."""
    return f"kvtune-kvq-{_digest(model, revision)}"


def job_name(deployment: str, model: str, revision: str, dtypes: Sequence[str]) -> str:
    """One Job per (InferenceDeployment, model revision, dtype set)."""
    suffix = f"-kvq-{_digest(model, revision, ','.join(sorted(dtypes)), length=8)}"
    return deployment[: _MAX_NAME - len(suffix)].rstrip("-") + suffix


def dtypes_to_measure(pool_plan: PoolPlan, evidence: kv_quality.KVQualityEvidence | None
                      ) -> list[str]:
    """The narrower dtypes this pool's plan could choose (its kv-cache-dtype candidates that
    vLLM runs here at or above the floor, measurable by kvtune) with no real measurement."""
    reason = next((r for r in pool_plan.reasons if r.knob == "kv-cache-dtype"), None)
    values = [pool_plan.plan.kv_cache_dtype]
    if reason is not None:
        values += [c.value for c in reason.candidates if c.check not in _NOT_CANDIDATES]
    out: list[str] = []
    for dtype in values:
        if dtype in kv_quality.SIXTEEN_BIT or dtype not in LAYOUTS or dtype in out:
            continue
        measured = evidence.find(dtype) if evidence is not None else None
        if measured is None or (evidence is not None and evidence.random_weights):
            out.append(dtype)
    return out


# --- the Job -----------------------------------------------------------------------------------


# The chart's calibration.image (default: kvtune's runtime image for the pool's GPU class,
# ``{gpuClass}`` standing for its lower-case name, e.g. ghcr.io/kvtune/kvtune-vllm-h200:TAG).
DEFAULT_IMAGE_ENV = "KVTUNE_CALIBRATION_IMAGE"
GPU_CLASS_PLACEHOLDER = "{gpuClass}"


def default_image(gpu_class: str) -> str | None:
    """The operator's default calibration image for ``gpu_class`` (the chart's
    ``calibration.image``); None when the operator runs without one."""
    template = os.environ.get(DEFAULT_IMAGE_ENV, "").strip()
    if not template:
        return None
    return template.replace(GPU_CLASS_PLACEHOLDER, gpu_class.lower())


def job_image(deployment: Mapping[str, Any], configured: str | None,
              container: str = "vllm", gpu_class: str | None = None) -> str | None:
    """The Job's image: ``spec.quality.calibration.image``, else the runtime container's own
    when it runs kvtune's entrypoint (kvtune's runtime images carry kvtune, torch and
    transformers), else the chart's default (kvtune's runtime image for ``gpu_class``); None
    when none of them (a plain vLLM image has no kvtune)."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    main = next((c for c in containers if c.get("name") == container), containers[0])
    runs_kvtune = list(main.get("command") or [])[:3] == ["python3", "-m", "kvtune.runtime"]
    return image_for(configured, main["image"] if runs_kvtune else None, gpu_class)


def image_for(configured: str | None, kvtune_runtime_image: str | None,
              gpu_class: str | None) -> str | None:
    """``job_image``'s choice without a rendered Deployment: the configured image, else the
    runtime's own when it runs kvtune's entrypoint, else the chart's default for the class."""
    if configured:
        return configured
    if kvtune_runtime_image:
        return kvtune_runtime_image
    return default_image(gpu_class) if gpu_class else None


def render_job(*, deployment: Mapping[str, Any], name: str, namespace: str, model: str,
               revision: str, dtypes: Sequence[str], image: str, timeout_seconds: int,
               max_prompt_tokens: int, labels: Mapping[str, str],
               container: str = "vllm") -> dict[str, Any]:
    """The calibration Job from a pool's rendered Deployment (see the module docstring)."""
    pod = copy.deepcopy(dict(deployment["spec"]["template"]))
    spec = pod["spec"]
    spec["restartPolicy"] = "Never"
    spec.pop("terminationGracePeriodSeconds", None)
    containers = spec["containers"]
    main = next((c for c in containers if c.get("name") == container), containers[0])
    for key in ("startupProbe", "readinessProbe", "livenessProbe", "lifecycle", "ports"):
        main.pop(key, None)
    main["image"] = image
    main["command"] = list(JOB_COMMAND)
    main["args"] = [
        "--model", model, "--revision", revision, "--dtypes", ",".join(dtypes),
        "--max-prompt-tokens", str(max_prompt_tokens), "--device", "cuda",
        "--termination-log", "/dev/termination-log", "--report-annotation", REPORT_ANNOTATION,
    ]
    main["env"] = [e for e in main.get("env") or [] if e.get("name") != "KVTUNE_PLAN"]
    # The serving pod's memory limit is sized for vLLM's processes (docs/pod-resources.md);
    # transformers loads the whole 16-bit checkpoint into host memory before moving it to
    # the GPU, far more than that: the one-off Job keeps the requests and drops the limit.
    resources = main.get("resources")
    if isinstance(resources, dict) and isinstance(resources.get("limits"), dict):
        limits = {k: v for k, v in resources["limits"].items() if k != "memory"}
        main["resources"] = {**resources, "limits": limits}
    main["terminationMessagePolicy"] = "FallbackToLogsOnError"
    # The sidecars of a serving pod (proxies, log shippers) would keep the Job from ending.
    spec["containers"] = [main]
    meta = pod.setdefault("metadata", {})
    meta["labels"] = {**dict(labels), LABEL_KV_QUALITY: "calibration"}
    meta["annotations"] = {ANNOTATION_MODEL: model, ANNOTATION_REVISION: revision}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**dict(labels), LABEL_KV_QUALITY: "calibration"},
                     "annotations": {ANNOTATION_MODEL: model, ANNOTATION_REVISION: revision}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": timeout_seconds,
            # Kept a day for `kubectl logs`; the report itself lives in the ConfigMap.
            "ttlSecondsAfterFinished": 86400,
            "template": pod,
        },
    }


@dataclass(frozen=True)
class JobResult:
    phase: JobPhase
    report: dict[str, Any] | None = None
    message: str = ""


def job_phase(job: Mapping[str, Any] | None) -> tuple[JobPhase, str]:
    """From a Job's status conditions: Complete / Failed (with its reason) / running."""
    if job is None:
        return "absent", ""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return "succeeded", ""
        if c.get("type") == "Failed":
            why = c.get("reason") or "Failed"
            detail = c.get("message") or ""
            return "failed", f"{why}: {detail}".rstrip(": ")
    return "running", ""


def report_from_pod(pod: Mapping[str, Any], container: str | None = None
                    ) -> dict[str, Any] | None:
    """The report a Job pod left in its termination message (of ``container``: the Job's
    one container; any when None)."""
    texts = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if container is not None and status.get("name") != container:
            continue
        terminated = (status.get("state") or {}).get("terminated") or {}
        texts.append(terminated.get("message"))
    for text in texts:
        if not text:
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and isinstance(data.get("measurements"), list):
            return data
    return None


# The runtime entrypoint's reports (operator/monitoring/runtime_reports.py); the Job's pod also
# writes
# its report there (quality/run.py publish), for people: the operator never reads it as a
# measurement (any writer of that ConfigMap could vouch for another object's Job).
RUNTIME_REPORTS_CONFIG_MAP = "kvtune-runtime-reports"


def _job_container(job: Mapping[str, Any] | None) -> str | None:
    containers = (((job or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    names = [c.get("name") for c in containers.get("containers") or [] if isinstance(c, dict)]
    return names[0] if len(names) == 1 else None


def _controlled_by(pod: Mapping[str, Any], job: Mapping[str, Any] | None) -> bool:
    uid = ((job or {}).get("metadata") or {}).get("uid")
    return owned_by(pod, uid) is not None


def job_result(job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> JobResult:
    """The Job's phase and report: from the termination message of the Job's own container
    in a pod the Job controls (a pod that only carries the Job's label does not count)."""
    phase, message = job_phase(job)
    container = _job_container(job)
    reports = [r for p in pods if _controlled_by(p, job)
               and (r := report_from_pod(p, container)) is not None]
    if phase == "succeeded" and not reports:
        return JobResult("failed", None, "the Job completed but its pod left no report "
                         "(its container's termination message)")
    if phase == "running" and (stuck := _image_not_pulled(pods)):
        # The Job would wait out its whole timeout for an image that never comes.
        return JobResult("failed", None, stuck)
    if phase == "failed" and not message:
        message = "the Job failed"
    return JobResult(phase, reports[-1] if phase == "succeeded" else None, message)


_PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                            "ErrImageNeverPull"})


def image_pull_failure(pods: Iterable[Mapping[str, Any]]) -> tuple[str, str] | None:
    """A Job pod's image that cannot be pulled, and kubelet's reason (None when every image
    pulls, or it is too early to say): the calibration and search Jobs both ask it."""
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _PULL_FAILURES:
                return str(status.get("image")), str(waiting["reason"])
    return None


def _image_not_pulled(pods: Iterable[Mapping[str, Any]]) -> str:
    """Why a Job pod's image cannot be pulled ('' when it can, or it is too early to say)."""
    failed = image_pull_failure(pods)
    if failed is None:
        return ""
    image, reason = failed
    return (f"its image {image} cannot be pulled ({reason}): set the chart value "
            "calibration.image (or spec.quality.calibration.image) to an image with kvtune, "
            "torch and transformers that the nodes can pull")


# --- the report cache --------------------------------------------------------------------------


def merge_reports(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The newer report, with the older one's measurements of other dtypes kept: the cache
    is per model revision and dtype."""
    merged = dict(new)
    fresh = {m["dtype"] for m in new.get("measurements") or []}
    kept = [m for m in (old or {}).get("measurements") or [] if m.get("dtype") not in fresh]
    merged["measurements"] = [*kept, *(new.get("measurements") or [])]
    return merged


def report_config_map(*, name: str, namespace: str, model: str, revision: str,
                      report: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**dict(labels), LABEL_KV_QUALITY: "report"},
                     "annotations": {ANNOTATION_MODEL: model, ANNOTATION_REVISION: revision}},
        "data": {REPORT_KEY: json.dumps(report, sort_keys=True, indent=1)},
    }


def owned_by(obj: Mapping[str, Any] | None, uid: str | None) -> Mapping[str, Any] | None:
    """``obj`` when its controller owner is the object with ``uid``, else None."""
    if obj is None or uid is None:
        return None
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("uid") == uid:
            return obj
    return None


def report_from_config_map(config_map: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if config_map is None:
        return None
    text = (config_map.get("data") or {}).get(REPORT_KEY)
    try:
        data = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def evidence(report: Mapping[str, Any] | None, *, config_map: str, revision: str
             ) -> kv_quality.KVQualityEvidence | None:
    if report is None:
        return None
    return kv_quality.evidence_from_report(
        report, source=f"calibration report configmap/{config_map}, revision {revision}")


def status(*, model: str, revision: str, phase: str, message: str = "",
           report: Mapping[str, Any] | None = None, job: str | None = None,
           config_map: str | None = None, measured_at: str | None = None,
           policy: kv_quality.KVQualityPolicy | None = None) -> KVQualityStatus:
    """``status.kvQuality``: the figures per dtype and whether the limit lets them through."""
    limit = (policy or kv_quality.KVQualityPolicy()).max_kv_quantization_kl
    rows = []
    for m in (report or {}).get("measurements") or []:
        rows.append(KVQualityDtypeStatus(
            dtype=str(m["dtype"]), kl_mean=float(m["kl_mean"]),
            top1_agreement=float(m["top1_agreement"]),
            attention_error_max=float(m.get("attention_error_max", 0.0)),
            worst_layer=int(m.get("attention_error_worst_layer", 0)),
            allowed=float(m["kl_mean"]) <= limit))
    checkpoint = (report or {}).get("checkpoint")
    scales = None
    if isinstance(checkpoint, dict):
        with_scales, layers = checkpoint.get("layers_with_scales"), checkpoint.get("layers")
        scales = (f"k/v scales for {with_scales} of {layers} layers" if with_scales
                  else "no calibrated KV scales: vLLM uses 1.0 for fp8")
    return KVQualityStatus(
        model=model, revision=revision, phase=phase, message=message, job=job,
        config_map=config_map, measured_at=measured_at,
        weights=(report or {}).get("weights"), checkpoint_kv_scales=scales, dtypes=rows)
