"""``kvtune search-worker`` (cli/search_worker.py): a search Job's command. It reads the search
document, runs the search and leaves the answer in the termination message; a bad input is a
one-line reason there and exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.simulator import search_job


def _doc() -> search_job.SearchInput:
    profile = preset_profile("chat").model_copy(update={"request_rate_per_second": 3.0})
    return search_job.SearchInput(
        request=PlanRequest(model=get_model("meta-llama/Llama-3.1-8B-Instruct"),
                            gpu=get_gpu_class("H100"), profile=profile,
                            policy=PlanPolicy(slo=SLO(ttft_p95_seconds=2.0))),
        cpu_seconds=60.0, stream_requests=40)


def test_the_worker_leaves_the_answer_in_the_termination_message(tmp_path: Path) -> None:
    doc = _doc()
    (tmp_path / "search.json").write_text(doc.canonical_json())
    log = tmp_path / "termination-log"
    result = CliRunner().invoke(cli, ["search-worker", "--input", str(tmp_path / "search.json"),
                                      "--termination-log", str(log)])
    assert result.exit_code == 0, result.output
    outcome = search_job.decode(log.read_text())
    assert outcome is not None and outcome.digest == doc.digest()
    assert outcome.plan == search_job.run(doc).plan
    assert log.read_text() in result.stdout  # the pod's log has it too


def test_a_bad_input_is_one_line_in_the_termination_message(tmp_path: Path) -> None:
    bad = tmp_path / "search.json"
    bad.write_text('{"version": 9}')
    log = tmp_path / "termination-log"
    result = CliRunner().invoke(cli, ["search-worker", "--input", str(bad),
                                      "--termination-log", str(log)])
    assert result.exit_code == 1
    text = log.read_text()
    assert "\n" not in text and "search document v1" in text and str(bad) in text
    assert result.stderr.strip() == f"Error: {text}"
    assert search_job.decode(text) is None


def test_the_operator_refuses_bad_search_job_settings_before_it_connects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """search.mode and search.job come from the environment the chart sets: a value kvtune
    cannot use stops ``kvtune operator`` at once, in one line (no API server is reached)."""
    from kvtune.operator.search import search_jobs

    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.setenv(search_jobs.ENV_MODE, "sometimes")
    result = CliRunner().invoke(cli, ["operator"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: search.mode='sometimes' (KVTUNE_SEARCH_MODE): not one of inProcess, job, "
        "auto; set one of them"]
    monkeypatch.setenv(search_jobs.ENV_MODE, "job")
    monkeypatch.delenv(search_jobs.ENV_IMAGE, raising=False)
    result = CliRunner().invoke(cli, ["operator"])
    assert result.exit_code == 1 and "KVTUNE_SEARCH_JOB_IMAGE" in result.stderr, result.stderr
