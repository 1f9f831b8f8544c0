"""The search document of a search Job (tuner/simulator/search_job.py): it round-trips through
JSON, its digest is stable and moves with every input, the Job's answer fits the kubelet's
termination message or says why not, and ``run`` is the in-process search."""

from __future__ import annotations

import base64
import json
import zlib

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.search_budget import SearchBudget
from kvtune.tuner.simulator import search_job
from kvtune.tuner.simulator.goodput_search import plan_by_goodput

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# A short stream keeps each search to about a second.
STREAM = 40


def _doc(rate: float = 4.0, **update: object) -> search_job.SearchInput:
    profile = preset_profile("chat").model_copy(update={"request_rate_per_second": rate})
    request = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class("H100"), profile=profile,
                          policy=PlanPolicy(slo=SLO(ttft_p95_seconds=2.0,
                                                    tpot_p95_seconds=0.08)))
    fields: dict[str, object] = dict(request=request, replicas=2, cpu_seconds=60.0,
                                     memory_bytes=256 * 2**20, stream_requests=STREAM)
    fields.update(update)
    return search_job.SearchInput.model_validate(fields)


def test_the_document_round_trips_through_json() -> None:
    doc = _doc(running=KVPlan(block_size=16, kv_cache_dtype="fp8", gpu_memory_utilization=0.9,
                              max_model_len=32768, max_num_seqs=128,
                              max_num_batched_tokens=8192, enable_prefix_caching=True))
    again = search_job.parse_input(doc.canonical_json())
    assert again == doc
    assert again.digest() == doc.digest()
    # Whatever the key order or spacing of the file, the same document and digest.
    shuffled = json.dumps(dict(reversed(list(json.loads(doc.model_dump_json()).items()))),
                          indent=2)
    assert search_job.parse_input(shuffled).digest() == doc.digest()


def test_the_digest_is_stable_across_processes_and_pinned_by_its_text() -> None:
    doc = _doc()
    assert len(doc.digest()) == 64 and doc.digest() == _doc().digest()
    import hashlib

    assert doc.digest() == hashlib.sha256(doc.canonical_json().encode()).hexdigest()
    assert '"version":1' in doc.canonical_json()


@pytest.mark.parametrize("update", [
    {"replicas": 3}, {"seed": 1}, {"cpu_seconds": 61.0}, {"memory_bytes": 2**29},
    {"stream_requests": STREAM + 1},
])
def test_every_input_moves_the_digest(update: dict[str, object]) -> None:
    assert _doc(**update).digest() != _doc().digest()


def test_the_profile_and_the_slo_move_the_digest() -> None:
    assert _doc(rate=5.0).digest() != _doc().digest()
    base = _doc()
    other = base.model_copy(update={"request": base.request.model_copy(update={
        "policy": PlanPolicy(slo=SLO(ttft_p95_seconds=1.0, tpot_p95_seconds=0.08))})})
    assert other.digest() != base.digest()


def test_a_document_of_another_version_or_shape_is_refused_in_one_line() -> None:
    text = json.loads(_doc().canonical_json())
    for bad in ({**text, "version": 2}, {**text, "surprise": 1}, {"request": {}}):
        with pytest.raises(search_job.InvalidSearchInput) as info:
            search_job.parse_input(json.dumps(bad))
        message = str(info.value)
        assert "\n" not in message and "search document v1" in message, message
        assert "same kvtune image" in message


def test_run_is_the_in_process_search_and_its_answer_fits_the_termination_message() -> None:
    doc = _doc()
    outcome = search_job.run(doc)
    assert outcome.error is None and outcome.plan is not None
    assert outcome.digest == doc.digest()
    in_process = plan_by_goodput(doc.request, replicas=doc.replicas, seed=doc.seed,
                                 budget=SearchBudget(cpu_seconds=60.0,
                                                     memory_bytes=256 * 2**20,
                                                     stream_requests=STREAM))
    assert outcome.plan == in_process
    message = search_job.encode(outcome)
    assert len(message.encode()) <= search_job.TERMINATION_MESSAGE_MAX_BYTES
    back = search_job.decode(message)
    assert back == outcome and back is not None and back.plan == in_process


def test_an_answer_over_the_kubelets_cap_is_an_error_that_names_sizes_and_fix() -> None:
    outcome = search_job.run(_doc())
    message = search_job.encode(outcome, limit_bytes=600)
    assert len(message.encode()) <= search_job.TERMINATION_MESSAGE_MAX_BYTES
    back = search_job.decode(message)
    assert back is not None and back.plan is None and back.error is not None
    assert back.error.kind == "ResultTooLarge"
    assert "600-byte termination message" in back.error.message
    assert "search.mode: inProcess" in back.error.message


def test_an_answer_just_over_the_cap_leaves_out_the_front_and_says_so() -> None:
    outcome = search_job.run(_doc())
    assert outcome.plan is not None and outcome.plan.search is not None
    assert outcome.plan.search.front  # detail the operator does not act on
    full = len(search_job.encode(outcome).encode())
    message = search_job.encode(outcome, limit_bytes=full - 1)
    assert len(message.encode()) < full
    back = search_job.decode(message)
    assert back is not None and back.error is None and back.plan is not None
    assert back.plan.search is not None and back.plan.search.front == ()
    assert back.plan.search.alternatives == ()
    # Everything the operator acts on is kept: the knobs, the capacity, the replicas.
    assert back.plan.plan == outcome.plan.plan
    assert back.plan.search.capacity_requests_per_second == (
        outcome.plan.search.capacity_requests_per_second)
    assert "leaves out the CPU tier sizes weighed, the Pareto front and the runners-up" in (
        back.plan.warnings[-1])


def test_a_spent_budget_is_an_error_outcome_not_a_crash() -> None:
    outcome = search_job.run(_doc(rate=1e5, cpu_seconds=1e-9))
    assert outcome.plan is None and outcome.error is not None
    assert outcome.error.kind == "SearchBudgetSpent", outcome.error


@pytest.mark.parametrize("message", [
    "", "Traceback (most recent call last): ...", '{"format": "other"}',
    '{"format": "kvtune.search-result/v1", "digest": "x", "z": "not base64!"}',
])
def test_anything_but_an_answer_decodes_to_none(message: str) -> None:
    assert search_job.decode(message) is None


def test_an_answer_whose_outer_digest_disagrees_is_not_read() -> None:
    outcome = search_job.SearchOutcome(digest="a" * 64, error=search_job.SearchError(
        kind="NoFeasiblePlan", message="nothing fits"))
    wrapper = json.loads(search_job.encode(outcome))
    assert search_job.decode(json.dumps(wrapper)) == outcome
    wrapper["digest"] = "b" * 64
    assert search_job.decode(json.dumps(wrapper)) is None
    # The payload is plain zlib + base64 of the outcome's JSON (readable by hand).
    inner = json.loads(zlib.decompress(base64.b64decode(json.loads(
        search_job.encode(outcome))["z"])))
    assert inner["error"]["kind"] == "NoFeasiblePlan"
