"""The search Job's pure parts (operator/search/search_jobs.py): the settings the chart passes, when
``auto`` sends a search to a Job, the names, the least-privilege Job, and which termination
message counts as the answer (only the current digest's, from a pod the Job controls)."""

from __future__ import annotations

from typing import Any

import pytest

from kvtune.operator.search import search_jobs
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.simulator.search_job import SearchError, SearchInput, SearchOutcome, encode


def _doc(rate: float = 3.0, cpu_seconds: float = 30.0) -> SearchInput:
    profile = preset_profile("chat").model_copy(update={"request_rate_per_second": rate})
    return SearchInput(request=PlanRequest(model=get_model("meta-llama/Llama-3.1-8B-Instruct"),
                                           gpu=get_gpu_class("H100"), profile=profile),
                       cpu_seconds=cpu_seconds, memory_bytes=256 * 2**20)


def test_settings_default_to_in_process_and_read_the_charts_values() -> None:
    assert search_jobs.settings({}).mode == "inProcess"
    s = search_jobs.settings({
        search_jobs.ENV_MODE: "job", search_jobs.ENV_IMAGE: "ghcr.io/kvtune/kvtune:1.2",
        search_jobs.ENV_RESOURCES: '{"limits": {"cpu": "2"}}',
        search_jobs.ENV_BACKOFF_LIMIT: "4", search_jobs.ENV_TTL_SECONDS: "60"})
    assert (s.mode, s.image, dict(s.resources), s.backoff_limit, s.ttl_seconds) == (
        "job", "ghcr.io/kvtune/kvtune:1.2", {"limits": {"cpu": "2"}}, 4, 60)


@pytest.mark.parametrize(("env", "words"), [
    ({search_jobs.ENV_MODE: "sometimes"}, ["search.mode='sometimes'", "inProcess, job, auto"]),
    ({search_jobs.ENV_RESOURCES: "{cpu"}, ["search.job.resources", "not JSON"]),
    ({search_jobs.ENV_RESOURCES: "[1]"}, ["search.job.resources", "mapping"]),
    ({search_jobs.ENV_BACKOFF_LIMIT: "-1"}, [search_jobs.ENV_BACKOFF_LIMIT, "0 to 20"]),
    ({search_jobs.ENV_TTL_SECONDS: "soon"}, [search_jobs.ENV_TTL_SECONDS, "integer"]),
    # The answer goes with the Job's pod: a Job must outlive the operator's next look.
    ({search_jobs.ENV_TTL_SECONDS: "0"}, [search_jobs.ENV_TTL_SECONDS, "60 to 604800"]),
])
def test_a_bad_setting_is_one_line_naming_the_value(env: dict[str, str],
                                                    words: list[str]) -> None:
    with pytest.raises(search_jobs.SettingsError) as info:
        search_jobs.settings(env)
    text = str(info.value)
    assert "\n" not in text and all(w in text for w in words), text


@pytest.mark.parametrize(("mode", "pools", "candidates", "cpu", "job"), [
    ("inProcess", 64, 48, 30.0, False), ("job", 1, 1, 30.0, True),
    # auto: pools x candidates x 0.5 s against the operator's budget of one search
    ("auto", 1, 24, 30.0, False), ("auto", 2, 24, 30.0, False), ("auto", 3, 24, 30.0, True),
    ("auto", 16, 24, 600.0, False), ("auto", 64, 24, 600.0, True), ("auto", 64, 48, None, False),
])
def test_when_a_search_goes_to_a_job(mode: str, pools: int, candidates: int,
                                     cpu: float | None, job: bool) -> None:
    s = search_jobs.settings({search_jobs.ENV_MODE: mode})
    assert search_jobs.use_job(s, pools=pools, candidates=candidates, cpu_seconds=cpu) is job


def test_names_and_labels_carry_the_digest_and_fit_kubernetes_limits() -> None:
    digest = _doc().digest()
    name = search_jobs.resource_name("a" * 60, "h100", digest)
    assert len(name) <= 63 and name.endswith(f"-search-{digest[:10]}")
    labels = search_jobs.labels("chat", "h100", digest)
    assert labels[search_jobs.LABEL_SEARCH] == digest[:40]
    assert all(len(v) <= 63 for v in labels.values())
    assert search_jobs.resource_name("chat", "h100", _doc(rate=4.0).digest()) != \
        search_jobs.resource_name("chat", "h100", digest)


def test_the_job_runs_the_operators_image_with_no_privilege() -> None:
    doc = _doc(cpu_seconds=30.0)
    s = search_jobs.settings({search_jobs.ENV_IMAGE: "ghcr.io/kvtune/kvtune:1.2",
                              search_jobs.ENV_BACKOFF_LIMIT: "3"})
    job = search_jobs.render_job(name="chat-h100-search-x", namespace="llm", doc=doc, s=s,
                                 labels=search_jobs.labels("chat", "h100", doc.digest()))
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"],
            spec["ttlSecondsAfterFinished"]) == (3, 2 * 30 + 300, 3600)
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["restartPolicy"] == "Never" and pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/kvtune/kvtune:1.2"
    assert c["command"] == ["kvtune", "search-worker", "--input", "/inputs/search.json",
                            "--termination-log", "/dev/termination-log"]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert c["resources"] == search_jobs.DEFAULT_RESOURCES
    assert {"name": "inputs", "mountPath": "/inputs", "readOnly": True} in c["volumeMounts"]
    assert pod["volumes"][0]["configMap"]["name"] == "chat-h100-search-x"
    assert job["metadata"]["annotations"][search_jobs.ANNOTATION_DIGEST] == doc.digest()


def _job(uid: str = "job-uid", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "uid": uid}, "status": status}


def _pod(message: str | None, owner: str = "job-uid", reason: str = "Completed"
         ) -> dict[str, Any]:
    terminated = {"reason": reason, **({"message": message} if message else {})}
    return {"metadata": {"ownerReferences": [{"controller": True, "uid": owner}]},
            "status": {"containerStatuses": [{"name": "search",
                                              "state": {"terminated": terminated}}]}}


COMPLETE = {"conditions": [{"type": "Complete", "status": "True"}]}


def test_the_answer_for_the_current_digest_is_read_and_a_stale_one_is_not() -> None:
    doc = _doc()
    current = SearchOutcome(digest=doc.digest(), error=SearchError(kind="NoFeasiblePlan",
                                                                   message="nothing fits"))
    stale = SearchOutcome(digest=_doc(rate=9.0).digest(), error=current.error)
    answer = search_jobs.job_answer(_job(**COMPLETE), [_pod(encode(current))], doc.digest())
    assert answer.phase == "succeeded" and answer.outcome == current
    answer = search_jobs.job_answer(_job(**COMPLETE), [_pod(encode(stale))], doc.digest())
    assert answer.phase == "failed" and answer.outcome is None
    assert "no answer for these inputs" in answer.message
    # A pod the Job does not control (only the label) does not count.
    answer = search_jobs.job_answer(_job(**COMPLETE), [_pod(encode(current), owner="x")],
                                    doc.digest())
    assert answer.outcome is None


def test_a_failed_job_says_why_and_the_fix() -> None:
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                              "message": "Job was active longer than specified deadline"}]}
    answer = search_jobs.job_answer(_job(**failed), [_pod("Traceback ...", reason="Error")],
                                    "d" * 64)
    assert answer.phase == "failed" and "DeadlineExceeded" in answer.message
    assert "Traceback" in answer.message
    assert "search.job.resources" in search_jobs.fix_for(answer.message)
    oom = search_jobs.job_answer(_job(**{"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}),
        [_pod(None, reason="OOMKilled")], "d" * 64)
    assert "OOMKilled" in oom.message and "memory" in search_jobs.fix_for(oom.message)
    running = search_jobs.job_answer(_job(), [{"metadata": {"ownerReferences": [
        {"controller": True, "uid": "job-uid"}]}, "status": {"containerStatuses": [
            {"name": "search", "image": "nope:1",
             "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}}], "d" * 64)
    assert running.phase == "failed" and "search.job.image" in running.message
    assert search_jobs.job_answer(_job(), [], "d" * 64).phase == "running"


def test_a_kept_result_counts_only_from_our_config_map_for_this_digest() -> None:
    doc = _doc()
    outcome = SearchOutcome(digest=doc.digest(), error=SearchError(kind="NoFeasiblePlan",
                                                                   message="x"))
    cm = search_jobs.result_config_map(search_jobs.input_config_map(
        name="n", namespace="ns", doc=doc, labels={}), encode(outcome))
    cm["metadata"]["ownerReferences"] = [{"controller": True, "uid": "infd"}]
    assert search_jobs.stored_result(cm, "infd", doc.digest()) == outcome
    assert search_jobs.stored_result(cm, "someone", doc.digest()) is None
    assert search_jobs.stored_result(cm, "infd", "e" * 64) is None
    assert set(cm["data"]) == {search_jobs.INPUT_KEY, search_jobs.RESULT_KEY}
