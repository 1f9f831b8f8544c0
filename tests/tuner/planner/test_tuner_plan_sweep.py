"""The plan sweep, sampled (bench/plan_sweep.py runs all 13,000-odd cases): every catalog model
and every GPU class, each tensor-parallel degree and weights dtype, through the planner that
``kvtune plan`` and the operator call. Each case is planned (passing vLLM's pre-flight, with
flags the pinned vLLM's own parser accepts: its source, read with ast) or refused with a
reason; never a traceback, never a plan vLLM would refuse."""

from __future__ import annotations

import collections

import pytest

from kvtune.e2e.plan_sweep import TENSOR_PARALLEL, WEIGHTS_DTYPES, VllmCli, run_case
from kvtune.tuner.facts.catalog import list_models
from kvtune.tuner.facts.gpus import list_gpu_classes

pytestmark = pytest.mark.vllm_source


def _sample() -> list[tuple[str, str, int, str]]:
    """Every (model, GPU) pair once, with the TP degree and weights dtype rotating so that
    each appears with every model and every GPU class."""
    models, gpus = list_models(), list_gpu_classes()
    return [(m, g, TENSOR_PARALLEL[(i + j) % len(TENSOR_PARALLEL)],
             WEIGHTS_DTYPES[(3 * i + j) % len(WEIGHTS_DTYPES)])
            for i, m in enumerate(models) for j, g in enumerate(gpus)]


@pytest.fixture(scope="module")
def cli() -> VllmCli:
    parsed = VllmCli()
    if not (parsed.root / "engine" / "arg_utils.py").is_file():
        pytest.fail(f"{parsed.root} missing: run `python scripts/fetch_vllm_source.py`")
    return parsed


def test_every_case_is_planned_or_refused_with_a_reason(cli: VllmCli) -> None:
    outcomes = [run_case(cli, *case) for case in _sample()]
    bugs = [o for o in outcomes if o.kind == "bug"]
    assert not bugs, "\n".join(f"{o.model} {o.gpu} TP{o.tensor_parallel} {o.weights_dtype}: "
                               f"{o.reason}: {o.detail}" for o in bugs)
    for o in outcomes:
        if o.kind == "refused":
            named = "=" in o.detail.split(":")[0]  # field=value, then the fix
            sized = "GiB" in o.detail  # does not fit: bytes needed and available
            assert named or sized, o
    kinds = collections.Counter(o.kind for o in outcomes)
    # The sample is not all refusals: the planner plans for every GPU class and many models.
    assert kinds["planned"] > len(outcomes) // 5
    planned_gpus = {o.gpu for o in outcomes if o.kind == "planned"}
    assert planned_gpus == set(list_gpu_classes())


def test_the_checker_catches_what_vllm_refuses(cli: VllmCli) -> None:
    # So that a clean sweep means something: the checks refuse what vLLM 0.33 refuses.
    assert cli.problems(["--quantization=fp8_per_tensor", "--dtype=bfloat16",
                         "--allow-deprecated-quantization", "--kv-cache-dtype=fp8"]) == []
    assert cli.problems(["--quantization=bitsandbytes"])  # removed from 0.33
    assert cli.problems(["--kv-cache-dtype=fp6"])
    assert cli.problems(["--weights-dtype=fp8"])  # kvtune's word, not a vLLM flag
    assert cli.problems(["--swap-space=4"])  # removed in 0.18


def test_the_sweep_catches_weights_vllm_would_not_load_as_sized() -> None:
    from kvtune.e2e.plan_sweep import _weights_mismatch
    from kvtune.tuner.facts.catalog import get_model
    from kvtune.tuner.facts.gpus import get_gpu_class
    from kvtune.tuner.planner.planning import PlanRequest
    from kvtune.tuner.planner.presets import preset_profile

    def request(model: str, weights: str) -> PlanRequest:
        return PlanRequest(model=get_model(model), gpu=get_gpu_class("H200"),
                           weights_dtype=weights, profile=preset_profile("chat"))

    # What main rendered before: fp8 sized, no flag, so vLLM loads 16-bit weights.
    llama = request("meta-llama/Llama-3.3-70B-Instruct", "fp8")
    assert "16 bits" in _weights_mismatch(llama, ["--block-size=16"])
    assert _weights_mismatch(llama, ["--quantization=fp8_per_tensor"]) == ""
    v3 = request("deepseek-ai/DeepSeek-V3", "auto")
    assert "refuses" in _weights_mismatch(v3, ["--quantization=fp8_per_tensor"])


def test_a_length_that_fits_is_not_lowered_to_itself(cli: VllmCli) -> None:
    """Qwen2.5-72B at 16 bits on two H100s: the first dtype choice fails, and the length is
    checked again at fp8, where it fits. The plan used to warn "max-model-len lowered from
    11264 to 11264" (17 cases of the full sweep)."""
    from kvtune.e2e.plan_sweep import _warning_that_says_nothing

    assert _warning_that_says_nothing(["max-model-len lowered from 8192 to 8192: x"])
    assert not _warning_that_says_nothing(["max-model-len lowered from 8192 to 4096: x"])
    outcome = run_case(cli, "Qwen/Qwen2.5-72B-Instruct", "H100", 2, "auto")
    assert outcome.kind == "planned", outcome
