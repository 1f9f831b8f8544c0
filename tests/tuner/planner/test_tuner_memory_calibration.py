"""The start-up log table, the fit shipped from it, and the version differences of the non-KV
memory model (issue 13: memory calibration, --vllm-version)."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from kvtune.tuner.errors import InvalidInput, UnknownName
from kvtune.tuner.facts.capabilities import get_runtime
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.vllm_memory import (
    coefficients,
    graph_capture_sizes,
    memory_data,
    supported_versions,
    version_memory,
)
from kvtune.tuner.facts.weights import rope_cache_bytes, weights_bytes_per_gpu
from kvtune.tuner.planner import budget, memory_fit

GiB = 1 << 30
ROWS = memory_fit.startup_logs()


def _number_in(value: float, text: str) -> bool:
    """``value`` is printed in ``text`` (as vLLM prints it: 58.11, 476,016, 14.9888)."""
    plain = text.replace(",", "")
    # Negative figures (a failed start's KV budget) stand after a space, not inside a date.
    tokens = re.findall(r"\d+(?:\.\d+)?", plain) + re.findall(r"(?<![\w.])-\d+(?:\.\d+)?", plain)
    return any(float(token) == value for token in tokens)


def test_the_table_has_at_least_30_sourced_rows_across_models_tp_and_versions() -> None:
    assert len(ROWS) >= 30
    assert all(r.source_url.startswith("https://") and r.quote for r in ROWS)
    assert len({r.id for r in ROWS}) == len(ROWS)
    assert len({r.gpu for r in ROWS}) >= 4
    assert len({r.vllm_version for r in ROWS if r.vllm_version}) >= 6
    assert {r.tensor_parallel for r in ROWS} >= {1, 2, 4}
    kinds = {get_model(r.shape_of).moe is not None for r in ROWS if r.shape_of}
    assert kinds == {True, False}  # dense and MoE catalog models
    assert any(r.shape_of and get_model(r.shape_of).is_mla for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_every_logged_figure_is_in_the_quoted_lines(row: memory_fit.StartupLog) -> None:
    text = "\n".join(row.quote)
    for field, value in row.logged.model_dump().items():
        if value is None or field in row.derived:
            continue
        assert _number_in(value, text), f"{row.id}: {field}={value} is not in the quote"


def test_repeats_name_a_row_with_the_same_memory_figures() -> None:
    by_id = {r.id: r for r in ROWS}
    for row in ROWS:
        if row.repeat_of is None:
            continue
        first = by_id[row.repeat_of]
        assert row.model == first.model and row.tensor_parallel == first.tensor_parallel
        assert row.logged.available_kv_gib == first.logged.available_kv_gib
        assert row.logged.activation_gib == first.logged.activation_gib


def test_the_shipped_coefficients_are_the_fit_of_the_shipped_table() -> None:
    # Derived, not pasted: bench/memory_calibration.py --write stores exactly this fit.
    assert memory_fit.fit(ROWS) == coefficients()


def test_the_fit_reproduces_the_logged_components_of_the_0_19_rows() -> None:
    c = coefficients()
    checked = 0
    for row in ROWS:
        if memory_fit.predictable(row) is not None or row.vllm_version != "0.19.0":
            continue
        model = row.model_arch()
        assert model is not None and row.logged.activation_gib is not None
        act = budget.activation_bytes(
            model, row.tensor_parallel, row.batched_tokens, row.seqs,
            vllm_version="0.19.0", model_dtype=row.model_dtype(model)) / GiB
        # Multimodal checkpoints profile their vision encoder too (Gemma 3: +0.1 GiB; Mistral
        # Small 3.1 W8A8: +0.23 GiB), which the activation model leaves out.
        vision = (row.shape or {}).get("vision_tower", False)
        assert abs(act - row.logged.activation_gib) < (0.25 if vision else 0.15), row.id
        non_torch = budget.non_torch_bytes(row.tensor_parallel, "0.19.0") / GiB
        assert row.logged.non_torch_gib is not None
        # Within 0.05 GiB at TP 1, 2 and 4 (the TP > 1 buffers grow with the peer ranks: 2.07
        # GiB median at TP 2, 2.17 at TP 4; a flat extra missed TP 4 by up to 0.12 GiB).
        assert abs(non_torch - row.logged.non_torch_gib) < 0.05, row.id
        checked += 1
    assert checked >= 15
    assert c.sampler_bytes_per_logit["v0.15"] > 2 * c.sampler_bytes_per_logit["v0.17"]


def test_leave_one_out_kv_tokens_within_3_percent_given_the_logged_weights() -> None:
    # The calibration's goal, on every predictable row, each predicted by a fit without it.
    # (With the planner's own weights the misses left are weights: Gemma 3's vision tower,
    # Qwen2.5-72B's 0.08 GiB; bench/memory_calibration.py prints both.)
    errors = []
    versions = set()
    for row in ROWS:
        if memory_fit.predictable(row) is not None:
            continue
        versions.add(row.vllm_version)
        loo = memory_fit.fit([r for r in ROWS if r.id != row.id and r.repeat_of != row.id])
        predicted = memory_fit.predict(row, loo, logged_weights=True).kv_tokens
        assert row.logged.kv_tokens is not None
        errors.append(abs(predicted / row.logged.kv_tokens - 1))
    assert len(errors) >= 25
    assert versions == {"0.15.0", "0.16.0", "0.17.0", "0.18.0", "0.19.0"}
    assert max(errors) < 0.03


def test_quantized_checkpoints_are_planned_from_their_quantization_config() -> None:
    # RedHatAI's int8 / int4 checkpoints of catalog models: kvtune sizes them from the
    # checkpoint's quantization_config, as vLLM loaded them (Llama 3.3 70B W8A8 at TP 2:
    # logged 33.88 GiB per GPU).
    rows = [r for r in ROWS if r.shape and "quantization_config" in r.shape]
    assert {r.weights_dtype for r in rows} == {"int8", "int4"}
    for row in rows:
        assert memory_fit.predictable(row) is None, row.id
        model = row.model_arch()
        assert model is not None and model.quantization is not None
        planned = (weights_bytes_per_gpu(model, row.weights_dtype, row.tensor_parallel)
                   + rope_cache_bytes(model)) / GiB  # as "Model loading took" counts them
        assert row.logged.weights_gib is not None
        assert abs(planned - row.logged.weights_gib) < 0.07, row.id


def test_tensor_parallel_buffers_grow_with_the_peer_ranks() -> None:
    # The 0.19 logs' non-torch increase: 2.06-2.11 GiB at TP 2, 2.13-2.21 GiB at TP 4.
    tp2, tp4, tp8 = (budget.non_torch_bytes(tp, "0.19.0") / GiB for tp in (2, 4, 8))
    assert abs(tp2 - 2.07) < 0.02 and abs(tp4 - 2.17) < 0.02
    assert tp8 - tp4 == pytest.approx(2 * (tp4 - tp2), abs=1e-6)  # linear in peer ranks
    assert budget.non_torch_bytes(1, "0.19.0") / GiB == pytest.approx(0.25, abs=0.01)


def test_cuda_graphs_are_subtracted_only_by_the_versions_that_do() -> None:
    model, gpu = get_model("meta-llama/Llama-3.1-8B-Instruct"), get_gpu_class("H100")
    kept = budget.non_kv_bytes(model, 0, 1, 8192, 1024, vllm_version="0.19.0", gpu=gpu)
    taken = budget.non_kv_bytes(model, 0, 1, 8192, 1024, vllm_version="0.21.0", gpu=gpu)
    assert kept.cuda_graph_bytes == 0
    assert taken.cuda_graph_bytes == budget.cuda_graph_estimate_bytes(32, 1024, 8192)
    assert 0.5 * GiB < taken.cuda_graph_bytes < 1.2 * GiB  # logged: 0.84 GiB (0.19, H100)
    assert version_memory("0.33.0").cuda_graph_deducted
    assert not any(version_memory(v).cuda_graph_deducted
                   for v in ("0.15.0", "0.16.0", "0.17.0", "0.18.0", "0.19.0"))


def test_capture_sizes_follow_vllms_list() -> None:
    assert graph_capture_sizes(1024, 8192) == (51, 51)  # "PIECEWISE=51 ..., FULL=51"
    assert graph_capture_sizes(256, 8192) == (51, 35)  # "PIECEWISE=51 ..., FULL=35"
    assert graph_capture_sizes(2, 8192) == (3, 2)


def test_tensor_parallel_does_not_shrink_the_sampler_peak() -> None:
    # Llama 3.1 8B logs 1.89 GiB at TP 1, 2 and 4: the logits are gathered on every rank.
    model = get_model("meta-llama/Llama-3.1-8B-Instruct")
    peaks = {budget.activation_bytes(model, tp, 8192, 1024) for tp in (1, 2, 4)}
    assert len(peaks) == 1


def test_an_uncalibrated_version_is_refused_with_the_field_value_and_fix() -> None:
    with pytest.raises(UnknownName) as info:
        get_runtime("0.20.0")
    message = str(info.value)
    assert "\n" not in message
    assert "vllm_version='0.20.0'" in message
    assert "0.19.0" in message and "0.33.0" in message and "--vllm-version" in message
    with pytest.raises(InvalidInput, match=re.escape("vllm_version='0.9.1'")):
        version_memory("0.9.1")


def test_an_older_version_plans_with_the_kv_dtypes_it_has() -> None:
    old = get_runtime("0.19.0")
    assert old.vllm_version == "0.19.0"
    assert set(old.kv_cache_dtype_names) == {"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"}
    assert all(set(b.kv_cache_dtypes) <= set(old.kv_cache_dtype_names) for b in old.backends)
    assert "int8_per_token_head" in get_runtime("0.33.0").kv_cache_dtype_names
    assert set(supported_versions()) == set(memory_data().versions)


def test_the_data_files_name_their_sources() -> None:
    folder = resources.files("kvtune.tuner.facts").joinpath("data")
    table = json.loads(folder.joinpath("vllm_startup_logs.json").read_text("utf-8"))
    assert "llm-d-incubation/llm-d-planner" in table["sources"]
    memory = json.loads(folder.joinpath("vllm_memory.json").read_text("utf-8"))
    assert all(v["evidence"] for v in memory["versions"].values())
    assert set(memory["coefficients"]["fitted_on"]) == {
        "activation", "non_torch", "cuda_graphs", "cuda_graph_pools"}


def test_plan_cli_takes_a_calibrated_version_and_refuses_others_in_one_line() -> None:
    from click.testing import CliRunner

    from kvtune.cli.main import cli

    base = ["plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100", "-o", "json"]
    old = CliRunner().invoke(cli, [*base, "--vllm-version", "0.19.0"])
    new = CliRunner().invoke(cli, [*base, "--vllm-version", "0.33.0"])
    assert old.exit_code == 0 and new.exit_code == 0, old.output + new.output
    old_exp, new_exp = json.loads(old.output)["expected"], json.loads(new.output)["expected"]
    # 0.19 leaves its CUDA graphs in the KV budget; 0.33 subtracts them.
    assert old_exp["kv_cache_bytes"] > new_exp["kv_cache_bytes"]
    bad = CliRunner().invoke(cli, [*base, "--vllm-version", "0.20.0"])
    assert bad.exit_code != 0
    lines = [ln for ln in bad.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "vllm_version='0.20.0'" in lines[0] and "0.33.0" in lines[0]


def test_the_operator_api_refuses_an_uncalibrated_vllm_version() -> None:
    from pydantic import ValidationError

    from kvtune.operator.api import RuntimeSpec

    assert RuntimeSpec(vllm_version="0.19.0").vllm_version == "0.19.0"
    with pytest.raises(ValidationError, match=re.escape("spec.runtime.vllmVersion='0.20.0'")):
        RuntimeSpec(vllm_version="0.20.0")


def test_0_33_deducts_the_measured_pool_and_0_21_the_sampled_estimate() -> None:
    # 0.33's V2 model runner captures the graphs to measure them (fitted on the logged real
    # pools); 0.21's V1 runner samples two captures per mode and extrapolates.
    assert version_memory("0.33.0").cuda_graph_estimator == "measured"
    assert version_memory("0.21.0").cuda_graph_estimator == "sampled"
    model, gpu = get_model("meta-llama/Llama-3.1-8B-Instruct"), get_gpu_class("H100")
    pinned = budget.non_kv_bytes(model, 0, 1, 8192, 1024, vllm_version="0.33.0", gpu=gpu)
    assert pinned.cuda_graph_bytes == budget.cuda_graph_estimate_bytes(
        32, 1024, 8192, measured=True)
    # Llama 3.1 8B's logged pool on an H100 (0.19): 0.91 GiB.
    assert abs(pinned.cuda_graph_bytes / GiB - 0.91) < 0.1


def test_simulate_cli_runs_vllm_0_19_defaults_and_refuses_an_unknown_version() -> None:
    from click.testing import CliRunner

    from kvtune.cli.main import cli
    from kvtune.e2e.traces import MOONCAKE_TRACE

    base = ["simulate", "--trace", str(MOONCAKE_TRACE), "--model",
            "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--limit", "20",
            "--score-sample", "0", "--compare", "defaults", "-o", "json"]
    ok = CliRunner().invoke(cli, [*base, "--vllm-version", "0.19.0"])
    assert ok.exit_code == 0, ok.output
    defaults = json.loads(ok.output)["configurations"][0]
    # vLLM 0.19's default fraction (0.9), and its KV cache: 0.9 x 79.19 GiB less weights,
    # activations and non-torch memory, no CUDA graphs (logged at 0.95: 29,751 blocks).
    assert "--gpu-memory-utilization=0.9" in defaults["vllm_args"]
    assert 27_000 < defaults["engine"]["num_gpu_blocks"] < 28_500
    bad = CliRunner().invoke(cli, [*base, "--vllm-version", "0.20.0"])
    assert bad.exit_code != 0 and "vllm_version='0.20.0'" in bad.output


def test_the_forward_pass_term_reproduces_the_forward_bound_profiles() -> None:
    # vLLM 0.6 profiled Llama 3.1 8B over max-model-len tokens with 256 sequences: the forward
    # pass set the peak (logged 2.07 GiB at 20,000 tokens, 2.99 at 29,000).
    model = get_model("meta-llama/Llama-3.1-8B-Instruct")
    by_tokens = {r.max_model_len: r for r in ROWS if r.id.startswith("vllm-10517-")}
    for tokens, row in by_tokens.items():
        assert tokens is not None and row.logged.activation_gib is not None
        forward = budget.model_activation_terms(model, 1, tokens, 256).forward_bytes / GiB
        assert abs(forward / row.logged.activation_gib - 1) < 0.01, tokens
    # At a large budget the forward pass, not the sampler, is the peak kvtune plans for.
    at_32k = budget.activation_bytes(model, 1, 32768, 1024)
    terms = budget.model_activation_terms(model, 1, 32768, 1024)
    assert at_32k > budget.activation_bytes(model, 1, 8192, 1024)
    assert abs(at_32k - terms.forward_bytes - coefficients().activation_base_gib * GiB) < 2
