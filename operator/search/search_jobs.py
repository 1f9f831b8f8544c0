"""A pool's capacity search as a Kubernetes Job (issue 22 item 4; docs/search-jobs.md): the
settings, the names, the ConfigMap and the Job, and what a finished Job says. Pure builders and
readers; the I/O around them is ``search_job_flow``.

- **When** (the chart's ``search.mode``, ``KVTUNE_SEARCH_MODE``): ``inProcess`` (the default:
  the operator's handler thread searches, as before), ``job`` (every searched pool), or
  ``auto``: a Job when the InferenceDeployment's pools x the pool's candidates, at
  ``CPU_SECONDS_PER_CANDIDATE`` each, exceed the operator's CPU budget of one search
  (``search.cpuSeconds``): one reconcile plans its pools one after another in one handler
  thread, so that is what it would spend in the operator.
- **Inputs**: the search document (``kvtune.tuner.simulator.search_job.SearchInput``, JSON
  under ``search.json``) in a ConfigMap the InferenceDeployment owns; its sha256 digest names
  the ConfigMap and the Job (``<object>-<pool>-search-<digest[:10]>``) and labels both, so
  a result is only ever read for the inputs it was made from.
- **The Job** runs the operator's own image (``KVTUNE_SEARCH_JOB_IMAGE``, the chart sets it
  to the operator's) with ``kvtune search-worker``; ``backoffLimit`` retries a pod that
  crashed, was evicted or OOM-killed (an answer, an error included, is written once: exit
  0); ``activeDeadlineSeconds`` from the budget; ``ttlSecondsAfterFinished`` cleans up a Job
  the operator did not (it deletes a Job once it has read its answer). Least privilege: no
  API token (``automountServiceAccountToken: false``), the namespace's ``default`` account,
  non-root, read-only root filesystem, no capabilities, seccomp ``RuntimeDefault``, no
  service links; the input mounted read-only, ``/tmp`` an emptyDir.
- **The answer** comes back in the container's termination message (only the kubelet writes
  it, from the container's own file), from a pod the Job controls; the operator keeps it in
  the same ConfigMap under ``result.json`` (so a restart does not search again) and deletes
  the Job.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvtune.operator.api.names import LABEL_DEPLOYMENT, LABEL_POOL, object_name
from kvtune.operator.calibration.calibration_job import (
    JobPhase,
    image_pull_failure,
    job_phase,
    owned_by,
)
from kvtune.tuner.simulator.search_job import SearchInput, SearchOutcome, decode

Mode = Literal["inProcess", "job", "auto"]
MODES: tuple[Mode, ...] = ("inProcess", "job", "auto")

ENV_MODE = "KVTUNE_SEARCH_MODE"
ENV_IMAGE = "KVTUNE_SEARCH_JOB_IMAGE"
ENV_RESOURCES = "KVTUNE_SEARCH_JOB_RESOURCES"
ENV_BACKOFF_LIMIT = "KVTUNE_SEARCH_JOB_BACKOFF_LIMIT"
ENV_TTL_SECONDS = "KVTUNE_SEARCH_JOB_TTL_SECONDS"

LABEL_SEARCH = "kvtune.io/search-digest"  # the digest's first 40 hex digits (a label value)
ANNOTATION_DIGEST = "kvtune.io/search-digest"  # the whole digest
INPUT_KEY = "search.json"
RESULT_KEY = "result.json"
CONTAINER = "search"
INPUT_DIR = "/inputs"
TERMINATION_LOG = "/dev/termination-log"
# The operator image's user (runtime_images/Dockerfile.operator: USER 65532:65532).
RUN_AS_USER = 65532
# A search's CPU per candidate of its grid, averaged over the successive halving (most replay
# 100 requests, a third 300, the finalists 800): the sample chat pool's 24 candidates took
# 12 s of CPU on a quiet core, 29 s on a busy 2-core machine (docs/search-jobs.md).
CPU_SECONDS_PER_CANDIDATE = 0.5
# Wall-clock slack of a Job beyond its CPU budget: scheduling, the image pull, Python's start
# and numba's compilation (the root filesystem is read-only: no cached machine code).
DEADLINE_SLACK_SECONDS = 300
# How often a reconcile waiting for a Job looks again.
POLL_SECONDS = 10.0
_MAX_NAME = 63
_LABEL_DIGITS = 40

# A finished Job must outlive the operator's next look (its answer is on the Job's pod, which
# goes with the Job): with a shorter TTL an answer could be lost and the search run again.
MIN_TTL_SECONDS = 60

DEFAULT_RESOURCES: dict[str, Any] = {"requests": {"cpu": "1", "memory": "512Mi"},
                                     "limits": {"cpu": "1", "memory": "1Gi"}}


class SettingsError(ValueError):
    """A chart value (its environment variable) kvtune cannot use: one line, with the fix."""


@dataclass(frozen=True)
class JobSettings:
    mode: Mode = "inProcess"
    image: str = ""
    resources: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    backoff_limit: int = 2
    ttl_seconds: int = 3600


def settings(env: Mapping[str, str] | None = None) -> JobSettings:
    """The search-Job settings from the environment the chart sets (module doc)."""
    env = os.environ if env is None else env
    mode = env.get(ENV_MODE, "").strip() or "inProcess"
    if mode not in MODES:
        raise SettingsError(f"search.mode={mode!r} ({ENV_MODE}): not one of "
                            f"{', '.join(MODES)}; set one of them")
    raw = env.get(ENV_RESOURCES, "").strip()
    try:
        resources = json.loads(raw) if raw else dict(DEFAULT_RESOURCES)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"search.job.resources ({ENV_RESOURCES}={raw[:60]!r}): not JSON "
                            f"({exc.msg}); give requests/limits as the chart does") from None
    if not isinstance(resources, dict):
        raise SettingsError(f"search.job.resources ({ENV_RESOURCES}): a mapping of requests "
                            "and limits, not a list or a value")
    return JobSettings(mode=mode, image=env.get(ENV_IMAGE, "").strip(), resources=resources,
                       backoff_limit=_int(env, ENV_BACKOFF_LIMIT, 2, 0, 20),
                       ttl_seconds=_int(env, ENV_TTL_SECONDS, 3600, MIN_TTL_SECONDS,
                                        7 * 86400))


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise SettingsError(f"{name}={raw!r}: an integer from {low} to {high}")
    return value


def use_job(s: JobSettings, *, pools: int, candidates: int, cpu_seconds: float | None) -> bool:
    """Whether a pool's search runs as a Job (module doc: ``auto``)."""
    if s.mode != "auto":
        return s.mode == "job"
    if cpu_seconds is None:
        return False
    return max(1, pools) * candidates * CPU_SECONDS_PER_CANDIDATE > cpu_seconds


def resource_name(deployment: str, pool: str, digest: str) -> str:
    """The ConfigMap's and the Job's name: the pool's objects' name and the digest."""
    suffix = f"-search-{digest[:10]}"
    return object_name(deployment, pool)[: _MAX_NAME - len(suffix)].rstrip("-") + suffix


def labels(deployment: str, pool: str, digest: str) -> dict[str, str]:
    return {LABEL_DEPLOYMENT: deployment, LABEL_POOL: pool, LABEL_SEARCH: digest[:_LABEL_DIGITS]}


def deadline_seconds(doc: SearchInput) -> int:
    """``activeDeadlineSeconds``: twice the CPU budget (the container's CPU may be shared)
    plus the start's slack; a search without a CPU limit gets an hour."""
    cpu = doc.cpu_seconds if doc.cpu_seconds is not None else 1800.0
    return math.ceil(2 * cpu) + DEADLINE_SLACK_SECONDS


def input_config_map(*, name: str, namespace: str, doc: SearchInput,
                     labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                         "annotations": {ANNOTATION_DIGEST: doc.digest()}},
            "data": {INPUT_KEY: doc.canonical_json()}}


def result_config_map(input_map: Mapping[str, Any], message: str) -> dict[str, Any]:
    """The input ConfigMap with the Job's answer kept beside the input."""
    return {**input_map, "data": {**dict(input_map.get("data") or {}), RESULT_KEY: message}}


def render_job(*, name: str, namespace: str, doc: SearchInput, s: JobSettings,
               labels: Mapping[str, str]) -> dict[str, Any]:
    """The search Job (module doc): the operator's image, ``kvtune search-worker`` on the
    mounted document, no API access, nothing writable but ``/tmp``."""
    container = {
        "name": CONTAINER, "image": s.image, "imagePullPolicy": "IfNotPresent",
        "command": ["kvtune", "search-worker", "--input", f"{INPUT_DIR}/{INPUT_KEY}",
                    "--termination-log", TERMINATION_LOG],
        # numba's cache and any home-directory write go to the emptyDir.
        "env": [{"name": "HOME", "value": "/tmp"},
                {"name": "NUMBA_CACHE_DIR", "value": "/tmp/numba"}],
        "resources": dict(s.resources),
        "terminationMessagePath": TERMINATION_LOG,
        # A crash leaves its log's tail there (never read as an answer: no format marker).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "inputs", "mountPath": INPUT_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER,
                            "runAsGroup": RUN_AS_USER,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "inputs", "configMap": {
                        "name": name, "items": [{"key": INPUT_KEY, "path": INPUT_KEY}]}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
    }
    meta = {"name": name, "namespace": namespace, "labels": dict(labels),
            "annotations": {ANNOTATION_DIGEST: doc.digest()}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {
        "backoffLimit": s.backoff_limit,
        "activeDeadlineSeconds": deadline_seconds(doc),
        "ttlSecondsAfterFinished": s.ttl_seconds,
        "template": {"metadata": {"labels": dict(labels),
                                  "annotations": {ANNOTATION_DIGEST: doc.digest()}},
                     "spec": pod_spec},
    }}


# --- what a Job says ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobAnswer:
    phase: JobPhase
    outcome: SearchOutcome | None = None
    message: str = ""  # the answer's termination message (kept), or why the Job failed


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return (status.get("state") or {}).get("terminated") or {}
    return {}


def job_answer(job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]],
               digest: str) -> JobAnswer:
    """The Job's phase and answer: the termination message of the search container of a pod
    the Job controls, for ``digest`` (an answer for other inputs is not one)."""
    phase, why = job_phase(job)
    uid = ((job or {}).get("metadata") or {}).get("uid")
    ours = [p for p in pods if owned_by(p, uid) is not None]
    for pod in ours:
        text = _terminated(pod).get("message")
        outcome = decode(text)
        if outcome is not None and outcome.digest == digest and text:
            return JobAnswer("succeeded", outcome, text)
    if phase == "succeeded":
        return JobAnswer("failed", None, "it completed but its pod left no answer for these "
                         "inputs (its container's termination message)")
    if phase == "failed":
        return JobAnswer("failed", None, _failure(why, ours))
    stuck = _image_not_pulled(ours)
    if stuck:
        return JobAnswer("failed", None, stuck)
    return JobAnswer(phase)


def _failure(why: str, pods: list[Mapping[str, Any]]) -> str:
    """The Job's reason, the last pod's own (OOMKilled, a one-line reason, a log tail)."""
    last = _terminated(pods[-1]) if pods else {}
    detail = " ".join(str(last.get("message") or "").split())[-240:]
    reason = last.get("reason")
    parts = [why or "Failed"]
    if reason and reason not in ("Completed", "Error"):
        parts.append(f"last pod: {reason}")
    if detail:
        parts.append(detail)
    return "; ".join(parts)


def _image_not_pulled(pods: Iterable[Mapping[str, Any]]) -> str:
    failed = image_pull_failure(pods)
    if failed is None:
        return ""
    image, reason = failed
    return (f"its image {image} cannot be pulled ({reason}): set the chart value "
            "search.job.image to the operator's image, pullable from the nodes")


def fix_for(failure: str) -> str:
    """The fix a failed Job's message calls for."""
    if "DeadlineExceeded" in failure:
        return ("give the Job more CPU (chart value search.job.resources) or lower "
                "search.cpuSeconds")
    if "OOMKilled" in failure:
        return "raise search.job.resources.limits.memory"
    if "cannot be pulled" in failure:
        return "set search.job.image"
    return "see the Job's pod log; or set search.mode: inProcess"


def stored_result(config_map: Mapping[str, Any] | None, owner_uid: str | None,
                  digest: str) -> SearchOutcome | None:
    """The answer kept in a search ConfigMap this InferenceDeployment owns, for ``digest``."""
    if owned_by(config_map, owner_uid) is None or config_map is None:
        return None
    outcome = decode((config_map.get("data") or {}).get(RESULT_KEY))
    return outcome if outcome is not None and outcome.digest == digest else None
