"""The calibration Job's place in a reconcile (issue 15), the I/O around ``calibration``.

1. ``prepare`` (once per InferenceDeployment, before the pools are planned): reads the report
   ConfigMap of the model revision and this InferenceDeployment's calibration Jobs; stores
   the report of a Job that succeeded; says whether plans must hold (a Job runs or failed, or
   the last reconcile found that none can run here and its cause stands:
   ``require_measurement``, so the wider dtype stays) and gives the evidence the planner gates
   on. Holding from the start, not after a first planning pass, plans each pool once and
   keeps the plan-in-force digest (``planInputs``) the same from one reconcile to the next.
2. ``maybe_start`` (per pool, after its plan is rendered): when the plan chose a narrower
   dtype that no measurement covers, applies the Job (the pool's rendered Deployment turned
   into it) and says so; the caller then plans the pool again with ``held`` policy.
3. ``status`` for ``status.kvQuality``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvtune.operator.api import (
    InferenceDeploymentSpec,
    KVQualityStatus,
    QualitySpec,
    UnverifiedCause,
)
from kvtune.operator.calibration import calibration_job as calibration
from kvtune.operator.kube import apply as kapply
from kvtune.operator.render import tenant_reach
from kvtune.tuner import kv_quality
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.policy import PlanPolicy


@dataclass
class Gate:
    """What one reconcile knows about the KV quality of the served model revision."""

    model: str
    revision: str
    config_map: str
    quality: QualitySpec
    namespace: str = ""
    report: dict[str, Any] | None = None
    running_job: str | None = None
    failed_job: str | None = None
    failure: str = ""
    started_jobs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The report ConfigMap's name is taken by an object kvtune did not create for this
    # InferenceDeployment: the report is not stored (Degraded/NameCollision), only used.
    collision: str | None = None
    # "pool (dtype)" per pool whose plan wanted a narrower dtype no measurement covers, where
    # no calibration can run (disabled, no image, or 403): status says Unverified, not
    # NotNeeded; the wider dtype stays unless spec.quality.acceptUnverified (issue 25).
    unverified: list[str] = field(default_factory=list)
    unverified_cause: UnverifiedCause | None = None

    @property
    def evidence(self) -> kv_quality.KVQualityEvidence | None:
        return calibration.evidence(self.report, config_map=self.config_map,
                                    revision=self.revision)

    @property
    def hold(self) -> bool:
        """A calibration runs or failed, or none can run and the spec does not accept
        unverified dtypes: unmeasured narrower dtypes must not roll out."""
        return bool(self.running_job or self.started_jobs or self.failed_job
                    or self.unmeasurable)

    @property
    def unmeasurable(self) -> bool:
        """A narrower dtype was planned that cannot be measured here, and the spec does not
        accept it unmeasured (the gate fails closed)."""
        return bool(self.unverified) and not self.quality.accept_unverified

    def policy(self) -> kv_quality.KVQualityPolicy:
        job = self.running_job or (self.started_jobs[0] if self.started_jobs else None)
        if job is not None:
            why = f"the calibration Job {job} (running)"
        elif self.failed_job is not None:
            why = f"the failed calibration Job {self.failed_job}"
        elif self.unmeasurable:
            why = UNMEASURABLE_REQUIRED_BY
        else:
            why = "quality.requireMeasurement"
        return kv_quality.KVQualityPolicy(
            max_kv_quantization_kl=self.quality.max_kv_quantization_kl,
            require_measurement=self.quality.require_measurement or self.hold,
            required_by=why)

    def status(self) -> KVQualityStatus:
        job = self.running_job or (self.started_jobs[0] if self.started_jobs else None)
        if job is not None:
            phase, message = "Calibrating", (
                f"Job {job} measures the narrower KV dtypes for revision {self.revision}; "
                "the wider dtype stays until it reports")
        elif self.failed_job is not None:
            phase, message = "Failed", (
                f"calibration Job {self.failed_job} failed ({self.failure}); the wider dtype "
                "stays (a new Job is tried when this one is deleted, after a day at most)")
            job = self.failed_job
        elif self.report is not None and not self.unverified:
            phase, message = "Measured", f"report in configmap/{self.config_map}"
        elif self.unverified:
            outcome = ("rolled out unmeasured (spec.quality.acceptUnverified)"
                       if self.quality.accept_unverified else
                       "the wider dtype stays (set spec.quality.acceptUnverified: true to "
                       "roll it out unmeasured)")
            phase, message = "Unverified", (
                f"the narrower KV dtype is not measured for revision {self.revision} "
                f"(pool {', pool '.join(self.unverified)}) and cannot be measured here: "
                f"{outcome}")
        elif not self.quality.calibration.enabled:
            phase, message = "Disabled", "spec.quality.calibration.enabled is false"
        else:
            phase, message = "NotNeeded", "no narrower KV dtype is planned"
        if self.notes:
            message = "; ".join([message, *self.notes])
        return calibration.status(
            model=self.model, revision=self.revision, phase=phase, message=message,
            report=self.report, job=job,
            config_map=self.config_map if self.report is not None else None,
            policy=self.policy()).model_copy(update={
                "unverified": list(self.unverified),
                "unverified_cause": self.unverified_cause if self.unverified else None})


UNMEASURABLE_REQUIRED_BY = ("no calibration possible here (spec.quality.acceptUnverified is "
                            "false; see status.kvQuality)")


def from_status(spec: InferenceDeploymentSpec, status: KVQualityStatus | None
                ) -> tuple[kv_quality.KVQualityPolicy, kv_quality.KVQualityEvidence | None]:
    """The gate as the last reconcile left it in ``status.kvQuality``, without API calls (the
    retune timer's view): the figures it measured for the served revision, and a hold while
    its Job runs or after it failed."""
    quality = spec.quality or QualitySpec()
    revision = spec.model.revision or calibration.UNPINNED
    usable = status is not None and (status.model, status.revision) == (spec.model.name,
                                                                         revision)
    # A Job runs or failed, or none can run and the spec does not accept an unverified dtype.
    hold = usable and status is not None and (
        status.phase in ("Calibrating", "Failed")
        or (status.phase == "Unverified" and not quality.accept_unverified))
    policy = kv_quality.KVQualityPolicy(
        max_kv_quantization_kl=quality.max_kv_quantization_kl,
        require_measurement=quality.require_measurement or hold,
        required_by=("quality.requireMeasurement" if not hold or status is None
                     else UNMEASURABLE_REQUIRED_BY if status.phase == "Unverified"
                     else f"the calibration Job {status.job}"))
    if not usable or status is None or not status.dtypes:
        return policy, None
    return policy, kv_quality.KVQualityEvidence(
        source=f"calibration report configmap/{status.config_map}, revision {revision}",
        random_weights=status.weights == "random-init",
        measurements=tuple(kv_quality.KVDtypeMeasurement(
            dtype=d.dtype, kl_mean=d.kl_mean, top1_agreement=d.top1_agreement,
            attention_error_max=d.attention_error_max,
            attention_error_worst_layer=d.worst_layer) for d in status.dtypes))


def with_gate(policy: PlanPolicy, gate: Gate) -> PlanPolicy:
    """The planner's policy with this reconcile's KV-quality policy."""
    return policy.model_copy(update={"kv_quality": gate.policy()})


def _read_config_map(kube: kapply.Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.request("GET", kapply.path("ConfigMap", namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _jobs(kube: kapply.Kube, namespace: str, deployment: str) -> list[dict[str, Any]]:
    selector = (f"{calibration.LABEL_DEPLOYMENT}={deployment},"
                f"{calibration.LABEL_KV_QUALITY}=calibration")
    items: list[dict[str, Any]] = kube.request(
        "GET", kapply.path("Job", namespace), query={"labelSelector": selector}
    ).get("items", [])
    return items


def prepare(kube: kapply.Kube, body: Mapping[str, Any], spec: InferenceDeploymentSpec
            ) -> Gate:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    model = spec.model.name
    revision = spec.model.revision or calibration.UNPINNED
    quality = spec.quality or QualitySpec()
    gate = Gate(model=model, revision=revision, config_map=calibration.cache_name(
        name, model, revision), quality=quality, namespace=namespace)
    if not body.get("status"):
        # Never reconciled: no report and no Job can count for this object yet. Only kvtune's
        # reconcile of it makes them (owned by its UID), and a reconcile writes status. (One
        # that started a Job and then failed before its status write applies the same Job,
        # by name, when its plan asks again: the gate holds as if the Job had been read.)
        # Three reads fewer per new object: a thousand new objects are 3,000 requests.
        return gate
    try:
        # Only a report this InferenceDeployment wrote counts: a ConfigMap of that name made
        # by anyone else must not vouch for a dtype.
        cached = calibration.report_from_config_map(calibration.owned_by(
            _read_config_map(kube, namespace, gate.config_map), meta.get("uid")))
        # Reports kept under the name kvtune used before (one per model revision) still
        # count, so an upgrade neither re-calibrates nor re-plans; moved on the next write.
        kept = cached if cached is not None else calibration.report_from_config_map(
            calibration.owned_by(_read_config_map(
                kube, namespace, calibration.shared_cache_name(model, revision)),
                meta.get("uid")))
        jobs = _jobs(kube, namespace, name) if quality.calibration.enabled else []
    except ApiException as exc:
        # E.g. an older chart without the Job/ConfigMap rights: plan without the cache.
        gate.notes.append(f"cannot read the KV-quality report or Jobs: {kapply._reason(exc)}")
        return gate
    report = kept
    jobs = [j for j in jobs if calibration.owned_by(j, meta.get("uid")) is not None]
    for job in jobs:
        notes = (job.get("metadata") or {}).get("annotations") or {}
        if (notes.get(calibration.ANNOTATION_MODEL), notes.get(
                calibration.ANNOTATION_REVISION)) != (model, revision):
            continue  # another model revision's Job: its report has its own ConfigMap
        job_id = job["metadata"]["name"]
        pods = kapply.list_pods(kube, namespace, f"batch.kubernetes.io/job-name={job_id}")
        result = calibration.job_result(job, pods)
        if result.phase == "running":
            gate.running_job = job_id
        elif result.phase == "failed":
            gate.failed_job, gate.failure = job_id, result.message
        elif result.phase == "succeeded" and result.report is not None:
            report = calibration.merge_reports(report, result.report)
    if report is not None and report != cached:
        try:
            kapply.apply_owned(kube, calibration.report_config_map(
                name=gate.config_map, namespace=namespace, model=model, revision=revision,
                report=report, labels={calibration.LABEL_DEPLOYMENT: name}), body)
        except kapply.NameCollision as exc:
            gate.collision = f"the KV-quality report: {exc}"
        except kapply.Forbidden as exc:  # used for this reconcile, not kept
            gate.notes.append(f"the report is not kept: {exc}")
    gate.report = report
    if gate.report is not None:
        # A measured revision is no failure: the report wins over a stale failed Job.
        measured = {m.get("dtype") for m in gate.report.get("measurements") or []}
        if measured and gate.failed_job is not None and not gate.running_job:
            gate.failed_job, gate.failure = None, ""
    _hold_if_still_unmeasurable(kube, body, spec, gate)
    return gate


def _hold_if_still_unmeasurable(kube: kapply.Kube, body: Mapping[str, Any],
                                spec: InferenceDeploymentSpec, gate: Gate) -> None:
    """The last reconcile held a narrower dtype that cannot be measured here: hold it again
    from status while its cause stands (calibration still disabled, still no image, Jobs
    still forbidden), so the pools are planned once, with the wider dtype, as before. Once
    the cause is gone the narrower dtype is planned again and its calibration Job started."""
    if gate.quality.accept_unverified or gate.report is not None or gate.running_job \
            or gate.failed_job:
        return
    raw = (body.get("status") or {}).get("kvQuality")
    try:
        before = KVQualityStatus.model_validate(raw) if raw else None
    except ValueError:
        return
    if before is None or before.phase != "Unverified" or not before.unverified \
            or before.unverified_cause is None \
            or (before.model, before.revision) != (gate.model, gate.revision):
        return
    cause = before.unverified_cause
    namespace = body["metadata"]["namespace"]
    if cause == "Disabled":
        stands = not gate.quality.calibration.enabled
    elif cause == "ImageNotAllowed":
        stands = gate.quality.calibration.enabled \
            and not _calibration_image_allowed(spec, gate.quality.calibration.image)
    elif cause == "NoImage":
        kvtune_runtime = spec.runtime.image if spec.runtime.entrypoint == "kvtune" else None
        stands = gate.quality.calibration.enabled and all(
            calibration.image_for(gate.quality.calibration.image, kvtune_runtime,
                                  p.gpu_class) is None for p in spec.pools)
    else:
        stands = gate.quality.calibration.enabled and not _may_create_jobs(kube, namespace)
    if stands:
        gate.unverified, gate.unverified_cause = list(before.unverified), cause
        gate.notes.append(_unmeasurable_note(cause, namespace, gate.quality.calibration.image,
                                             spec.runtime.image))


def _may_create_jobs(kube: kapply.Kube, namespace: str) -> bool:
    """Whether kvtune may create Jobs in ``namespace`` now (a SelfSubjectAccessReview, which
    every authenticated user may make): the chart's runtime.namespaces may have changed."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"group": "batch", "resource": "jobs",
                                              "verb": "create", "namespace": namespace}}}
    try:
        answer = kube.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                              body=review)
    except ApiException:
        return False  # cannot tell: stay held, as the last reconcile was
    return bool((answer.get("status") or {}).get("allowed"))


def _calibration_image_allowed(spec: InferenceDeploymentSpec, image: str | None) -> bool:
    """Whether the Job may run ``image``: the operator runs it with its own rights, so a
    tenant's image must be on the chart's podPolicy.allowedImages (operator/render/tenant_reach.py)
    like any container of the pods."""
    return image is None or tenant_reach.image_allowed(
        image, tenant_reach.allowed_images(spec.runtime.image))


def _unmeasurable_note(cause: UnverifiedCause, namespace: str, image: str | None = None,
                       spec_image: str = "") -> str:
    """Why no calibration can run here, and the fix."""
    if cause == "Disabled":
        return "spec.quality.calibration.enabled is false"
    if cause == "ImageNotAllowed":
        allowed = ", ".join(tenant_reach.allowed_images(spec_image))
        return (f"spec.quality.calibration.image={image!r} is not an allowed image (allowed: "
                f"{allowed}): the operator would run it with its own rights; leave it unset, or "
                f"ask the platform team to add it to the chart's podPolicy.allowedImages")
    if cause == "NoImage":
        return ("no calibration image: set the chart value calibration.image or "
                "spec.quality.calibration.image to an image with kvtune, torch and "
                "transformers, or use runtime.entrypoint: kvtune")
    return (f"kvtune may not run calibration Jobs in namespace {namespace} (403): add it to "
            f"the chart value runtime.namespaces; until then the narrower dtype is "
            f"unverified and the wider one stays")


def maybe_start(kube: kapply.Kube, body: Mapping[str, Any], spec: InferenceDeploymentSpec,
                gate: Gate, pool_plan: PoolPlan, deployment: Mapping[str, Any], *,
                pool_name: str) -> bool:
    """Start the calibration Job when the pool's plan chose a narrower dtype no measurement
    covers. True: the caller must plan the pool again with the held policy (a Job started,
    or none can run here and the spec does not accept an unverified dtype)."""
    quality = gate.quality
    if gate.hold:
        return _unverified(pool_plan, gate)
    if not _unverified(pool_plan, gate):
        return False
    if not quality.calibration.enabled:
        _note_unverified(gate, pool_name, pool_plan, "Disabled")
        return gate.hold
    image = calibration.job_image(deployment, quality.calibration.image,
                                  gpu_class=pool_plan.gpu_class)
    if image is None:
        _note_unverified(gate, pool_name, pool_plan, "NoImage")
        return gate.hold
    if not _calibration_image_allowed(spec, quality.calibration.image):
        _note_unverified(gate, pool_name, pool_plan, "ImageNotAllowed",
                         image=quality.calibration.image, spec_image=spec.runtime.image)
        return gate.hold
    dtypes = calibration.dtypes_to_measure(pool_plan, gate.evidence)
    meta = body["metadata"]
    name = calibration.job_name(meta["name"], gate.model, gate.revision, dtypes)
    model_arg = (deployment["spec"]["template"]["spec"]["containers"][0].get("args")
                 or [gate.model])[0]
    job = calibration.render_job(
        deployment=deployment, name=name, namespace=meta["namespace"], model=model_arg,
        revision=gate.revision, dtypes=dtypes, image=image,
        timeout_seconds=quality.calibration.timeout_seconds(),
        max_prompt_tokens=quality.calibration.max_prompt_tokens,
        labels={calibration.LABEL_DEPLOYMENT: meta["name"]})
    try:
        kapply.apply_owned(kube, job, body)  # NameCollision: someone else's Job of that name
    except kapply.Forbidden:
        # Calibration Jobs are granted per runtime namespace (the chart's Role), not
        # cluster-wide: here the dtype stays unverified, as without a calibration image.
        _note_unverified(gate, pool_name, pool_plan, "Forbidden")
        return gate.hold
    gate.started_jobs.append(name)
    return True


def _note_unverified(gate: Gate, pool_name: str, pool_plan: PoolPlan,
                     cause: UnverifiedCause, image: str | None = None,
                     spec_image: str = "") -> None:
    """The pool keeps an unmeasured narrower dtype, and ``cause`` says why none is measured."""
    note = _unmeasurable_note(cause, gate.namespace, image, spec_image)
    if note not in gate.notes:
        gate.notes.append(note)
    gate.unverified_cause = gate.unverified_cause or cause
    entry = f"{pool_name}: {pool_plan.plan.kv_cache_dtype}"
    if entry not in gate.unverified:
        gate.unverified.append(entry)


def _unverified(pool_plan: PoolPlan, gate: Gate) -> bool:
    verdict = kv_quality.gate_one(pool_plan.plan.kv_cache_dtype, gate.evidence,
                                  kv_quality.KVQualityPolicy(
                                      max_kv_quantization_kl=gate.quality.max_kv_quantization_kl))
    return verdict.code == kv_quality.UNVERIFIED
