"""The fail-closed KV-quality gate across reconciles, on the real control plane (issue 25).

A plan that wants fp8 KV where no calibration can run (no image with kvtune; calibration
disabled; an image off the allow-list) keeps the wider dtype and says Unverified with its
cause. The next reconciles hold from that status while the cause stands: each pool is planned
once, the plan-in-force digest stays, and no second CalibrationUnavailable is posted. Once the
cause is gone (an allowed image set, calibration enabled) the narrower dtype is planned again
and its calibration Job starts."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_cluster_helpers import create_infd, get_infd, patch_spec, prepare_namespaces
from op_samples import SAMPLE_SPEC

from kvtune.operator import reconcile as rec
from kvtune.operator.calibration import calibration_job as calibration
from kvtune.operator.kube import apply as kapply
from kvtune.operator.rollout import plan as plan_stage

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS = "op-kv-unverified"


@pytest.fixture(scope="module")
def api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, NS)


def _spec(calibration_spec: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["pools"] = [{"gpuClass": "H100", "replicas": 1}]
    spec.pop("rollout")
    spec["workload"] = {"profile": "chat",
                        "contextTokens": {"p50": 1000, "p99": 4000, "max": 8192}}
    spec["quality"] = {"lowestKVPrecision": "fp8", "calibration": calibration_spec}
    return spec


def _counted_reconcile(api: Any, name: str, monkeypatch: pytest.MonkeyPatch
                       ) -> tuple[rec.ReconcileResult, int]:
    """One reconcile, and how many times it planned the pool."""
    calls = []
    real = plan_stage.plan_one_pool

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(plan_stage, "plan_one_pool", counting)
        result = rec.reconcile(get_infd(api, NS, name), kube=kapply.Kube(api))
    return result, len(calls)


def _jobs(api: Any, name: str) -> list[dict[str, Any]]:
    selector = f"{calibration.LABEL_DEPLOYMENT}={name}"
    items: list[dict[str, Any]] = kapply.Kube(api).request(
        "GET", kapply.path("Job", NS), query={"labelSelector": selector}).get("items", [])
    return items


# kvtune's own registry namespace is on the default podPolicy.allowedImages (issue 25).
IMAGE = "ghcr.io/kvtune/kvtune-vllm-h100:test"


@pytest.mark.parametrize(("name", "unmeasurable", "cause", "fix"), [
    ("no-image", {"enabled": True}, "NoImage",
     {"quality": {"calibration": {"image": IMAGE}}}),
    ("disabled", {"enabled": False}, "Disabled",
     {"quality": {"calibration": {"enabled": True, "image": IMAGE}}}),
    # A tenant's image the operator may not run with its rights.
    ("not-allowed", {"enabled": True, "image": "registry.example/mine:1"}, "ImageNotAllowed",
     {"quality": {"calibration": {"image": IMAGE}}}),
])
def test_an_unmeasurable_dtype_is_held_from_status_until_its_cause_is_gone(
    api: Any, monkeypatch: pytest.MonkeyPatch, name: str, unmeasurable: dict[str, Any],
    cause: str, fix: dict[str, Any],
) -> None:
    monkeypatch.delenv(calibration.DEFAULT_IMAGE_ENV, raising=False)
    create_infd(api, NS, name, _spec(unmeasurable))

    # First reconcile: the planner wants fp8, nothing can measure it: held, said once.
    first, _ = _counted_reconcile(api, name, monkeypatch)
    said = [e for e in first.events if e.reason == "CalibrationUnavailable"]
    assert len(said) == 1 and "fp8" in said[0].message, first.events
    obj = get_infd(api, NS, name)
    kvq, (pool,) = obj["status"]["kvQuality"], obj["status"]["pools"]
    assert (kvq["phase"], kvq["unverifiedCause"], kvq["unverified"]) == \
        ("Unverified", cause, ["h100: fp8"]), kvq
    assert pool["plan"]["kvCacheDtype"] == "auto", pool["plan"]
    assert not _jobs(api, name)

    # Later reconciles hold from status: one planning pass, the same digest, nothing said again.
    for _ in range(2):
        again, passes = _counted_reconcile(api, name, monkeypatch)
        assert passes == 1
        assert not [e for e in again.events if e.reason == "CalibrationUnavailable"]
        held = get_infd(api, NS, name)["status"]
        assert held["pools"][0]["planInputs"] == pool["planInputs"]
        assert held["pools"][0]["revision"] == pool["revision"]
        assert (held["kvQuality"]["phase"], held["kvQuality"]["unverifiedCause"]) == \
            ("Unverified", cause)
        assert not [w for w in held["pools"][0]["warnings"]
                    if w.startswith(plan_stage.KEPT_WARNING)], held["pools"][0]["warnings"]

    # The cause is gone: fp8 is planned again and its calibration Job starts.
    patch_spec(api, NS, name, fix)
    started, _ = _counted_reconcile(api, name, monkeypatch)
    assert [e for e in started.events if e.reason == "CalibrationStarted"], started.events
    kvq = get_infd(api, NS, name)["status"]["kvQuality"]
    assert kvq["phase"] == "Calibrating" and not kvq.get("unverified"), kvq
    (job,) = _jobs(api, name)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
