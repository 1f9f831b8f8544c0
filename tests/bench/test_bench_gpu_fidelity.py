"""bench/gpu_fidelity.py's logic on the CPU, with a tiny Llama shape: it runs end to end, its
measurements are the sizes they should be, and it compares with what kvtune assumes. (On a
GPU the same code measures with CUDA's allocator and events; no GPU is needed here.)"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kvtune.tuner.facts.gpus import get_gpu_class

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_fidelity.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_fidelity", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_fidelity"] = mod
    spec.loader.exec_module(mod)
    return mod


GF = _module()


def test_totals_are_compared_with_the_catalog() -> None:
    h200 = get_gpu_class("H200")
    expected = {"cuda_total_bytes": h200.cuda_total_bytes,
                "nvml_total_bytes": h200.nvml_total_bytes}
    same = GF.compare_totals(h200.cuda_total_bytes, h200.nvml_total_bytes, expected)
    assert same["cuda_matches"] and same["nvml_matches"] and same["cuda_ratio"] == 1.0
    off = GF.compare_totals(h200.cuda_total_bytes - (1 << 30), h200.nvml_total_bytes, expected)
    assert not off["cuda_matches"] and off["cuda_ratio"] < 1.0


@pytest.mark.slow
def test_the_peak_tracker_counts_live_tensors_once() -> None:
    with GF.peak_increase(torch, "cpu") as out:
        a = torch.empty(1000, dtype=torch.float32)  # 4,000 bytes
        b = a.view(10, 100)  # a view: no new storage
        c = torch.empty(500, dtype=torch.float32)  # 2,000 bytes
        del a, b, c
        d = torch.empty(250, dtype=torch.float32)  # 1,000 bytes, after the others are freed
        del d
    assert out["peak_bytes"] == 6000


def test_the_sampler_emulation_keeps_the_shape_and_picks_valid_tokens() -> None:
    logits = torch.randn(8, 100, dtype=torch.bfloat16)
    tokens = GF.sampler_like_vllm(torch, logits)
    assert tokens.shape == (8,) and int(tokens.min()) >= 0 and int(tokens.max()) < 100


@pytest.mark.slow
def test_a_tiny_run_end_to_end(tmp_path: Path) -> None:
    inputs = GF.kvtune_inputs("tiny-llama", "H200", batched_tokens=64, max_num_seqs=16,
                              config=GF.TINY_CONFIG)
    assert inputs["batched_tokens"] == 64 and inputs["max_num_seqs"] == 16
    result = GF.run(torch, inputs, "cpu", tiny=True)
    act = result["activation"]
    vocab, hidden = GF.TINY_CONFIG["vocab_size"], GF.TINY_CONFIG["hidden_size"]
    # The sampler work holds at least the fp32 logits of 16 rows, and no more than the
    # handful of [rows x vocab] copies vLLM's PyTorch path makes.
    assert 16 * vocab * 4 <= act["sampler_peak_bytes"] <= 16 * vocab * 64
    # The forward pass keeps at least the bf16 hidden states of 64 tokens.
    assert act["forward_peak_bytes"] >= 64 * hidden * 2
    assert act["hidden_states_bytes"] == 64 * hidden * 2
    assert act["measured_peak_bytes"] >= act["sampler_peak_bytes"]
    assert result["bandwidth"]["decode_attention"]["kv_bytes"] == 2 * 4 * 2 * 256 * 16 * 2
    assert result["bandwidth"]["decode_attention"]["bytes_per_second"] > 0
    assert result["gemm"]["bf16"]["flops"] == 2 * 64 * hidden * 2 * 128
    assert result["gemm"]["assumed_compute_efficiency"] == inputs["compute_efficiency"]
    # Prefill steps: the chunks asked for, each timed and set beside the simulator's roofline
    # (compute-bound at these sizes: its FLOPs over the assumed rate, at least).
    steps = result["prefill_steps"]
    assert [s["tokens"] for s in steps] == [64]
    rate = inputs["dense_bf16_flops_per_second"] * inputs["compute_efficiency"]
    for s in steps:
        assert s["measured_seconds"] > 0
        assert s["model_gpu_seconds"] >= s["model_flops"] / rate * (1 - 1e-9)
        assert s["implied_compute_efficiency"] == s["model_flops"] / (
            s["measured_seconds"] * inputs["dense_bf16_flops_per_second"])
    # Decode steps: the tiny points, each timed beside the simulator's roofline (memory-bound:
    # weights and the points' KV over the assumed bandwidth, at least).
    decode = result["decode_steps"]
    assert [(s["seqs"], s["context"]) for s in decode] == [(2, 32), (4, 64)]
    bandwidth = inputs["hbm_bytes_per_second"] * inputs["bandwidth_efficiency"]
    for s in decode:
        assert s["timed_as"] == "eager" and s["measured_seconds"] > 0
        assert s["model_gpu_seconds"] >= s["model_bytes"] / bandwidth * (1 - 1e-9)
    assert decode[1]["model_bytes"] > decode[0]["model_bytes"]
    path = GF.result_path("NVIDIA H200", dt.date(2026, 11, 30), tmp_path)
    assert path.name == "gpu_fidelity-NVIDIA-H200-2026-11-30.json"
    path.write_text(json.dumps(result, default=float))
    assert "activation peak" in GF.summary(json.loads(path.read_text()))


def test_prepare_writes_what_a_machine_without_kvtune_needs(tmp_path: Path) -> None:
    inputs = GF.kvtune_inputs("meta-llama/Llama-3.1-8B-Instruct", "H200")
    # vLLM 0.33's server defaults on a 139.81 GiB GPU, and the planner's own figure.
    assert (inputs["batched_tokens"], inputs["max_num_seqs"]) == (8192, 1024)
    assert inputs["config"]["hidden_size"] == 4096
    assert 1.5 * (1 << 30) < inputs["planner_activation_bytes"] < 2.5 * (1 << 30)
    assert json.loads(json.dumps(inputs)) == inputs


def test_the_planner_terms_name_both_branches_of_the_peak() -> None:
    inputs = GF.kvtune_inputs("meta-llama/Llama-3.1-8B-Instruct", "H200")
    terms = inputs["planner_terms"]
    # 8,192 tokens x (3 x 14,336 + 3 x 4,096) x 2 B: what the GPU run's forward pass is held to.
    assert terms["forward_bytes"] == 8192 * (3 * 14336 + 3 * 4096) * 2
    assert terms["sampler_bytes"] > terms["forward_bytes"]
