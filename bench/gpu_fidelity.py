"""A GPU check of kvtune's memory and timing models, for a lent GPU (built for one H200 with
torch and transformers, no vLLM, no network; about 20 s on an H200).

What it measures, each beside what kvtune assumes for that GPU class:

1. memory totals: CUDA's (``torch.cuda.mem_get_info``, what vLLM's fraction is taken of) and
   NVML's (``nvmlDeviceGetMemoryInfo``; the device properties' total when pynvml is absent)
   against ``gpus.json``'s ``cuda_total_bytes`` / ``nvml_total_bytes``;
2. activation peak: a randomly initialised transformers model of a catalog shape (default
   Llama 3.1 8B, bf16, SDPA attention) runs one forward pass over the planned batched-token
   budget, then the sampler's work over max-num-seqs logits as vLLM 0.33's PyTorch path does
   it (fp32 logits, sort, top-k/top-p masks, softmax, exponential noise); the allocator's peak
   increase of each phase against the planner's activation estimate and its two branches
   (the forward-pass term, the sampler term). vLLM itself
   is not run: on CUDA it samples with a Triton kernel that needs less than the sort, so the
   sampler phase here is an upper bound of vLLM's;
3. decode-attention bandwidth: SDPA with one query token per sequence over a bf16 KV cache
   (the bytes a decode step reads), and a plain device copy, as fractions of the datasheet HBM
   bandwidth, against ``tuner/simulator/efficiency.json``'s ``bandwidth_efficiency``;
4. prefill GEMM throughput: the catalog shape's MLP up-projection at the batched-token budget
   (bf16, and fp8 through ``torch._scaled_mm`` where the GPU has it) as a fraction of the dense
   datasheet rate, against ``compute_efficiency``;
5. prefill steps: the whole model's forward pass over one prompt chunk of 2,048 and of the
   batched-token budget (from an empty cache; the logits of its last token only, as vLLM),
   against the simulator's step time for it without the per-step overhead (the roofline of
   ``tuner/simulator/timing.py``), and the compute efficiency that would make the two agree.
   transformers' eager forward with SDPA is not vLLM's (fused kernels, FlashAttention 3), so
   the measured time is an upper bound of vLLM's GPU time for the step.
6. decode steps: a batch of sequences, one token each, over a context of cached tokens: the
   shape's linear layers and SDPA attention over a bf16 KV cache for every layer, and the
   LM head, replayed as one CUDA graph (vLLM captures its decode steps too); norms, rotary
   and sampling are left out, so the measured time is a lower bound of vLLM's. Against the
   simulator's step time without overhead, and the bandwidth efficiency that would make the
   two agree. (One layer's weights and KV serve every layer: each is far larger than the
   L2 cache, so every layer still reads them from memory.)

Results go to ``bench/results/gpu_fidelity-<gpu>-<date>.json`` and are printed.

    .venv/bin/python bench/gpu_fidelity.py                  # on the GPU machine, kvtune importable
    .venv/bin/python bench/gpu_fidelity.py --prepare build/gpu_fidelity_inputs.json
    python bench/gpu_fidelity.py --inputs build/gpu_fidelity_inputs.json   # no kvtune there

``--prepare`` writes what kvtune expects (GPU facts, efficiency factors, the model's config
and the planner's estimate) for a machine where kvtune (pydantic) cannot be imported.
``--device cpu --tiny`` runs the same logic on a tiny shape (what the tests do).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import platform
import re
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

GiB = 1 << 30
# Decode steps timed (sequences, context tokens each): from one sequence (the weights alone)
# to a batch whose KV reads outweigh them.
DECODE_POINTS = ((1, 2048), (32, 2048), (128, 2048), (256, 4096))
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# A Llama-shaped model small enough for a CPU test: the same code paths as the catalog shape.
TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 512,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


# --- what kvtune expects ------------------------------------------------------------------------


def kvtune_inputs(model_id: str, gpu_name: str, batched_tokens: int | None = None,
                  max_num_seqs: int | None = None, config: dict[str, Any] | None = None,
                  ) -> dict[str, Any]:
    """The figures kvtune assumes for this GPU class and model (needs kvtune importable)."""
    from kvtune.tuner.facts.capabilities import PINNED_VLLM_VERSION, get_runtime
    from kvtune.tuner.facts.catalog import get_model
    from kvtune.tuner.facts.gpus import get_gpu_class
    from kvtune.tuner.facts.models import ModelArchitecture
    from kvtune.tuner.facts.vllm_memory import version_memory
    from kvtune.tuner.planner import budget
    from kvtune.tuner.planner.planning import PlanRequest
    from kvtune.tuner.planner.presets import preset_profile
    from kvtune.tuner.simulator.engine import step_cost_for
    from kvtune.tuner.simulator.timing import efficiency_for

    gpu = get_gpu_class(gpu_name)
    if config is None:
        model = get_model(model_id)
        raw = _catalog_config(model.hf_id)
    else:
        model = ModelArchitecture.from_hf_config(config, model_id)
        raw = config
    tokens, seqs = get_runtime().defaults_for_memory(gpu.cuda_total_bytes, gpu.name)
    tokens = batched_tokens or tokens
    seqs = max_num_seqs or seqs
    terms = budget.model_activation_terms(model, 1, tokens, seqs, model.torch_dtype)
    coefs = budget.coefficients()
    eff = efficiency_for(gpu.name)
    # The step time depends on the model and GPU only (the profile is a placeholder).
    cost = step_cost_for(PlanRequest(model=model, gpu=gpu, profile=preset_profile("chat")),
                         "auto")
    prefill = []
    for chunk in sorted({min(2048, tokens), tokens}):
        pairs = chunk * (chunk + 1) / 2.0  # causal: token i attends to i + 1 tokens
        prefill.append({
            "tokens": chunk,
            "model_flops": cost.flops_per_token * chunk
            + cost.attention_flops_per_token_pair * pairs,
            "model_bytes": cost.weights_bytes + cost.kv_bytes_per_token * chunk,
            "model_gpu_seconds": cost.step_seconds(chunk, chunk, pairs, num_seqs=1)
            - eff.step_overhead_seconds,
        })
    decode = []
    for seqs_now, context in ((2, 32), (4, 64)) if tokens <= 64 else DECODE_POINTS:
        decode.append({
            "seqs": seqs_now, "context": context,
            "model_bytes": cost.weights_bytes + cost.kv_bytes_per_token * seqs_now * context,
            "model_gpu_seconds": cost.step_seconds(seqs_now, seqs_now * context,
                                                   float(seqs_now * context), num_seqs=seqs_now)
            - eff.step_overhead_seconds,
        })
    return {
        "gpu_class": gpu.name,
        "cuda_total_bytes": gpu.cuda_total_bytes,
        "nvml_total_bytes": gpu.nvml_total_bytes,
        "hbm_bytes_per_second": gpu.hbm_bandwidth_bytes_per_second,
        "dense_bf16_flops_per_second": gpu.dense_bf16_flops_per_second,
        "dense_fp8_flops_per_second": gpu.dense_fp8_flops_per_second,
        "bandwidth_efficiency": eff.bandwidth_efficiency,
        "compute_efficiency": eff.compute_efficiency,
        "model": model.hf_id,
        "config": raw,
        "batched_tokens": tokens,
        "max_num_seqs": seqs,
        "vllm_version": PINNED_VLLM_VERSION,
        "prefill_steps": prefill,
        "decode_steps": decode,
        "planner_activation_bytes": budget.activation_bytes(
            model, 1, tokens, seqs, model_dtype=model.torch_dtype),
        "planner_terms": {
            "sampler_bytes": round(coefs.sampler_bytes_per_logit[
                version_memory(PINNED_VLLM_VERSION).sampler] * terms.logits),
            "hidden_bytes": round(coefs.hidden_state_copies * terms.hidden_bytes),
            "moe_workspace_bytes": round(coefs.moe_workspace_factor * terms.moe_workspace_bytes),
            "forward_bytes": terms.forward_bytes,
            "base_bytes": round(coefs.activation_base_gib * GiB),
        },
    }


def _catalog_config(hf_id: str) -> dict[str, Any]:
    """The catalog's copy of the model's ``config.json``."""
    from importlib import resources

    name = hf_id.replace("/", "--") + ".json"
    entry = resources.files("kvtune.tuner.facts").joinpath("data", "models", name)
    doc: dict[str, Any] = json.loads(entry.read_text("utf-8"))
    return dict(doc["config"])


# --- 1. memory totals ---------------------------------------------------------------


def compare_totals(cuda_total: int, nvml_total: int, expected: dict[str, Any]) -> dict[str, Any]:
    """Measured totals against the catalog's, in bytes and as ratios."""
    return {
        "cuda_total_bytes": cuda_total,
        "expected_cuda_total_bytes": expected["cuda_total_bytes"],
        "cuda_ratio": cuda_total / expected["cuda_total_bytes"],
        "nvml_total_bytes": nvml_total,
        "expected_nvml_total_bytes": expected["nvml_total_bytes"],
        "nvml_ratio": nvml_total / expected["nvml_total_bytes"],
        "cuda_matches": cuda_total == expected["cuda_total_bytes"],
        "nvml_matches": nvml_total == expected["nvml_total_bytes"],
    }


def measure_totals(torch: Any) -> tuple[int, int, str, str]:
    """(CUDA total, NVML total, NVML name, where the NVML figure came from) of device 0."""
    _, cuda_total = torch.cuda.mem_get_info(0)
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        name = pynvml.nvmlDeviceGetName(handle)
        return int(cuda_total), total, str(name), "nvml"
    except Exception:  # pynvml absent or NVML unusable: the CUDA device properties' figure
        props = torch.cuda.get_device_properties(0)
        return int(cuda_total), int(props.total_memory), str(props.name), "device_properties"


# --- 2. activation peak --------------------------------------------------------------------------


class _LiveBytes:
    """Peak bytes of tensors alive on a device, tracked through torch's dispatcher (the CPU has
    no allocator statistics). Storage is counted once however many views share it."""

    def __init__(self, torch: Any) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class Mode(TorchDispatchMode):  # type: ignore[misc]
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        tracker._see(t)
                return out

        self.mode = Mode()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _see(self, t: Any) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._seen or storage.nbytes() == 0:
            return
        self._seen.add(key)
        nbytes = storage.nbytes()
        self.live += nbytes
        self.peak = max(self.peak, self.live)

        def _free(k: int = key, n: int = nbytes) -> None:
            self._seen.discard(k)
            self.live -= n

        weakref.finalize(storage, _free)


@contextlib.contextmanager
def peak_increase(torch: Any, device: str) -> Iterator[dict[str, int]]:
    """The peak of allocated bytes above the level at entry, while the block runs."""
    out: dict[str, int] = {}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        yield out
        torch.cuda.synchronize()
        out["peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
    else:
        tracker = _LiveBytes(torch)
        with tracker.mode:
            yield out
        out["peak_bytes"] = int(tracker.peak)


def build_model(torch: Any, config: dict[str, Any], device: str) -> Any:
    """A randomly initialised transformers causal LM of this ``config.json`` on ``device``."""
    import transformers

    cfg = transformers.AutoConfig.for_model(**{
        k: v for k, v in config.items() if k not in ("architectures", "quantization_config")})
    dtype = torch.bfloat16
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, dtype=dtype, attn_implementation="sdpa")
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, torch_dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def sampler_like_vllm(torch: Any, logits: Any) -> Any:
    """vLLM 0.33's dummy sampler run on its PyTorch path (``apply_top_k_top_p_pytorch`` and
    ``random_sample``): temperature 0.5, top-k vocab-1, top-p 0.9."""
    logits = logits.float().div_(0.5)
    vocab = logits.size(1)
    k = torch.full((logits.size(0),), vocab - 1, device=logits.device)
    p = torch.full((logits.size(0),), 0.9, device=logits.device)
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    top_k = logits_sort.gather(1, (vocab - k.to(torch.long)).unsqueeze(dim=1))
    logits_sort.masked_fill_(logits_sort < top_k, -float("inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    logits = logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def activation_check(torch: Any, model: Any, inputs: dict[str, Any],
                     device: str) -> dict[str, Any]:
    tokens, seqs = int(inputs["batched_tokens"]), int(inputs["max_num_seqs"])
    ids = torch.randint(0, int(inputs["config"]["vocab_size"]), (1, tokens), device=device)
    with torch.inference_mode():
        with peak_increase(torch, device) as fwd:
            hidden = model.model(input_ids=ids).last_hidden_state
        with peak_increase(torch, device) as smp:
            # One logit row per sequence, as vLLM's sampler run (min(seqs, tokens) rows).
            rows = hidden[0, : min(seqs, tokens)]
            sampler_like_vllm(torch, model.lm_head(rows))
    hidden_bytes = int(hidden.numel() * hidden.element_size())
    del hidden
    planner = int(inputs["planner_activation_bytes"])
    measured = max(fwd["peak_bytes"], hidden_bytes + smp["peak_bytes"])
    return {
        "model": inputs["model"], "batched_tokens": tokens, "max_num_seqs": seqs,
        "forward_peak_bytes": fwd["peak_bytes"],
        "sampler_peak_bytes": smp["peak_bytes"],
        "hidden_states_bytes": hidden_bytes,
        "measured_peak_bytes": measured,
        "planner_activation_bytes": planner,
        "planner_terms": inputs["planner_terms"],
        "planner_over_measured": planner / measured if measured else math.nan,
    }


# --- 3/4. bandwidth and GEMM rate ---------------------------------------------------


def _timed(torch: Any, device: str, fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn`` after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def decode_attention_bandwidth(torch: Any, device: str, *, batch: int, context: int,
                               q_heads: int, kv_heads: int, head_dim: int,
                               repeats: int = 10) -> dict[str, float]:
    """Bytes per second a decode step's attention reads: one query token per sequence over
    ``context`` cached tokens of bf16 K and V."""
    f = torch.nn.functional
    q = torch.randn(batch, q_heads, 1, head_dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, context, head_dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seconds = _timed(torch, device, lambda: f.scaled_dot_product_attention(
        q, k, v, enable_gqa=q_heads != kv_heads), repeats)
    kv_bytes = 2 * k.numel() * k.element_size()
    return {"kv_bytes": float(kv_bytes), "seconds": seconds,
            "bytes_per_second": kv_bytes / seconds}


def copy_bandwidth(torch: Any, device: str, nbytes: int, repeats: int = 10) -> dict[str, float]:
    """A device-to-device copy: reads and writes ``nbytes`` each."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _timed(torch, device, lambda: dst.copy_(src), repeats)
    return {"bytes": float(2 * nbytes), "seconds": seconds,
            "bytes_per_second": 2 * nbytes / seconds}


def gemm_rate(torch: Any, device: str, m: int, k: int, n: int, *, fp8: bool = False,
              repeats: int = 10) -> dict[str, float]:
    """FLOP/s of an [m, k] x [k, n] matrix product (bf16, or fp8 with per-tensor scales)."""
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device=device, dtype=torch.float32)

        def run() -> Any:
            return torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                    out_dtype=torch.bfloat16)
    else:
        def run() -> Any:
            return a @ b.t()
    seconds = _timed(torch, device, run, repeats)
    flops = 2.0 * m * k * n
    return {"flops": flops, "seconds": seconds, "flops_per_second": flops / seconds}


# --- 5. prefill steps ----------------------------------------------------------------------


def prefill_steps(torch: Any, model: Any, inputs: dict[str, Any], device: str,
                  repeats: int = 5) -> list[dict[str, Any]]:
    """Seconds of the whole model's forward over each ``prefill_steps`` chunk, beside the
    simulator's roofline for it (``kvtune_inputs``)."""
    vocab = int(inputs["config"]["vocab_size"])
    rate = float(inputs["dense_bf16_flops_per_second"])
    rows = []
    for point in inputs.get("prefill_steps", []):
        ids = torch.randint(0, vocab, (1, int(point["tokens"])), device=device)

        def forward(ids: Any = ids) -> Any:
            with torch.inference_mode():
                hidden = model.model(input_ids=ids).last_hidden_state
                return model.lm_head(hidden[:, -1:])

        seconds = _timed(torch, device, forward, repeats)
        rows.append({
            **point, "measured_seconds": seconds,
            "model_over_measured": point["model_gpu_seconds"] / seconds,
            # The compute efficiency at which the roofline's compute time is the measured time.
            "implied_compute_efficiency": point["model_flops"] / (seconds * rate),
            "assumed_compute_efficiency": inputs["compute_efficiency"],
        })
    return rows


# --- 6. decode steps -----------------------------------------------------------------------


def decode_steps(torch: Any, inputs: dict[str, Any], device: str,
                 repeats: int = 20) -> list[dict[str, Any]]:
    """Seconds of one decode step of each ``decode_steps`` point (module doc, 6.), beside
    the simulator's roofline for it."""
    cfg = inputs["config"]
    f = torch.nn.functional
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter, layers = int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])

    def weight(out_features: int, in_features: int) -> Any:
        # Random, not zeros (zeros can run faster than real data).
        return torch.randn(out_features, in_features, device=device,
                           dtype=torch.bfloat16) * 0.02

    qkv_w = weight((heads + 2 * kv_heads) * head_dim, hidden)
    o_w = weight(hidden, heads * head_dim)
    up_w = weight(2 * inter, hidden)
    down_w = weight(hidden, inter)
    head_w = weight(int(cfg["vocab_size"]), hidden)
    bandwidth = float(inputs["hbm_bytes_per_second"])
    rows = []
    for point in inputs.get("decode_steps", []):
        seqs, context = int(point["seqs"]), int(point["context"])
        x = torch.randn(seqs, hidden, device=device, dtype=torch.bfloat16)
        k = torch.randn(seqs, kv_heads, context, head_dim, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)

        def step(x: Any = x, k: Any = k, v: Any = v, seqs: int = seqs) -> Any:
            h = x
            for _ in range(layers):
                q = f.linear(h, qkv_w)[:, :heads * head_dim].reshape(seqs, heads, 1, head_dim)
                a = f.scaled_dot_product_attention(q, k, v, enable_gqa=heads != kv_heads)
                h = f.linear(a.reshape(seqs, heads * head_dim), o_w)
                gate_up = f.linear(h, up_w)
                h = f.linear(f.silu(gate_up[:, :inter]) * gate_up[:, inter:], down_w)
            return f.linear(h, head_w)

        how, run = "eager", step
        if device.startswith("cuda"):
            with torch.inference_mode():
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(side)
                try:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step()
                    how, run = "cuda graph", graph.replay
                except RuntimeError:  # a kernel that cannot be captured: eager launches
                    pass
        with torch.inference_mode():
            seconds = _timed(torch, device, run, repeats)
        rows.append({
            **point, "timed_as": how, "measured_seconds": seconds,
            "model_over_measured": point["model_gpu_seconds"] / seconds,
            # The bandwidth efficiency at which the roofline's memory time is the measured time.
            "implied_bandwidth_efficiency": point["model_bytes"] / (seconds * bandwidth),
            "assumed_bandwidth_efficiency": inputs["bandwidth_efficiency"],
        })
        del x, k, v
    return rows


# --- the run --------------------------------------------------------------------------------------


def run(torch: Any, inputs: dict[str, Any], device: str, *, tiny: bool = False) -> dict[str, Any]:
    cfg = inputs["config"]
    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads")
                                                         or cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    out: dict[str, Any] = {
        "inputs": {k: v for k, v in inputs.items() if k != "config"},
        "device": device, "torch": torch.__version__, "python": platform.python_version(),
    }
    started = time.perf_counter()
    if device.startswith("cuda"):
        cuda_total, nvml_total, name, nvml_source = measure_totals(torch)
        out["gpu_name"] = name
        out["totals"] = compare_totals(cuda_total, nvml_total, inputs)
        out["totals"]["nvml_source"] = nvml_source
    # One randomly initialised model for the activation peak and the prefill steps.
    model = build_model(torch, cfg, device)
    out["activation"] = activation_check(torch, model, inputs, device)
    out["prefill_steps"] = prefill_steps(torch, model, inputs, device)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    # Decode: a batch of sequences at a 4K context (tiny: a few hundred tokens) per layer.
    batch, context = (4, 256) if tiny else (64, 4096)
    decode = decode_attention_bandwidth(
        torch, device, batch=batch, context=context, q_heads=heads, kv_heads=kv_heads,
        head_dim=head_dim)
    copy = copy_bandwidth(torch, device, (1 << 20) if tiny else (4 * GiB))
    peak_bw = float(inputs["hbm_bytes_per_second"])
    out["bandwidth"] = {
        "decode_attention": decode, "copy": copy,
        "decode_fraction_of_datasheet": decode["bytes_per_second"] / peak_bw,
        "copy_fraction_of_datasheet": copy["bytes_per_second"] / peak_bw,
        "assumed_bandwidth_efficiency": inputs["bandwidth_efficiency"],
    }
    m = 64 if tiny else int(inputs["batched_tokens"])
    gemm = gemm_rate(torch, device, m, int(cfg["hidden_size"]), 2 * int(cfg["intermediate_size"]))
    out["gemm"] = {
        "shape": [m, int(cfg["hidden_size"]), 2 * int(cfg["intermediate_size"])],
        "bf16": gemm,
        "bf16_fraction_of_datasheet":
            gemm["flops_per_second"] / float(inputs["dense_bf16_flops_per_second"]),
        "assumed_compute_efficiency": inputs["compute_efficiency"],
    }
    fp8_rate = inputs.get("dense_fp8_flops_per_second")
    if device.startswith("cuda") and fp8_rate and hasattr(torch, "_scaled_mm"):
        try:
            g8 = gemm_rate(torch, device, m, int(cfg["hidden_size"]),
                           2 * int(cfg["intermediate_size"]), fp8=True)
            out["gemm"]["fp8"] = g8
            out["gemm"]["fp8_fraction_of_datasheet"] = g8["flops_per_second"] / float(fp8_rate)
        except RuntimeError as exc:  # fp8 GEMM not available on this GPU/torch build
            out["gemm"]["fp8_error"] = str(exc).splitlines()[0]
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    out["decode_steps"] = decode_steps(torch, inputs, device)
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out


def result_path(gpu_name: str, when: dt.date, folder: Path = RESULTS) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu_name).strip("-") or "gpu"
    return folder / f"gpu_fidelity-{slug}-{when.isoformat()}.json"


def summary(result: dict[str, Any]) -> str:
    act, bw, gemm = result["activation"], result["bandwidth"], result["gemm"]
    lines = [f"gpu_fidelity on {result.get('gpu_name', result['device'])} "
             f"({result['seconds']} s)"]
    if "totals" in result:
        t = result["totals"]
        lines.append(
            f"  CUDA total {t['cuda_total_bytes'] / GiB:.2f} GiB (kvtune "
            f"{t['expected_cuda_total_bytes'] / GiB:.2f}, x{t['cuda_ratio']:.4f}); "
            f"NVML {t['nvml_total_bytes'] / GiB:.2f} GiB (kvtune "
            f"{t['expected_nvml_total_bytes'] / GiB:.2f}, x{t['nvml_ratio']:.4f}, "
            f"{t['nvml_source']})")
    lines.append(
        f"  activation peak at {act['batched_tokens']} tokens / {act['max_num_seqs']} seqs: "
        f"measured {act['measured_peak_bytes'] / GiB:.2f} GiB (forward "
        f"{act['forward_peak_bytes'] / GiB:.2f}, sampler {act['sampler_peak_bytes'] / GiB:.2f}),"
        f" planner {act['planner_activation_bytes'] / GiB:.2f} GiB "
        f"(x{act['planner_over_measured']:.2f}; its forward term "
        f"{act['planner_terms']['forward_bytes'] / GiB:.2f}, sampler term "
        f"{act['planner_terms']['sampler_bytes'] / GiB:.2f})")
    lines.append(
        f"  decode attention {bw['decode_attention']['bytes_per_second'] / 1e12:.2f} TB/s = "
        f"{bw['decode_fraction_of_datasheet']:.2f} of datasheet, copy "
        f"{bw['copy_fraction_of_datasheet']:.2f}; kvtune assumes "
        f"{bw['assumed_bandwidth_efficiency']}")
    fp8 = (f", fp8 {gemm['fp8_fraction_of_datasheet']:.2f}"
           if "fp8_fraction_of_datasheet" in gemm else "")
    lines.append(
        f"  prefill GEMM {gemm['shape']}: bf16 {gemm['bf16_fraction_of_datasheet']:.2f} of "
        f"datasheet{fp8}; kvtune assumes {gemm['assumed_compute_efficiency']}")
    for step in result.get("prefill_steps", []):
        lines.append(
            f"  prefill step of {step['tokens']} tokens: measured "
            f"{step['measured_seconds'] * 1e3:.1f} ms, simulator "
            f"{step['model_gpu_seconds'] * 1e3:.1f} ms without overhead "
            f"(x{step['model_over_measured']:.2f}); agree at compute "
            f"efficiency {step['implied_compute_efficiency']:.2f}, kvtune assumes "
            f"{step['assumed_compute_efficiency']}")
    for step in result.get("decode_steps", []):
        lines.append(
            f"  decode step of {step['seqs']} x {step['context']} tokens ({step['timed_as']}): "
            f"measured {step['measured_seconds'] * 1e3:.2f} ms, simulator "
            f"{step['model_gpu_seconds'] * 1e3:.2f} ms without overhead "
            f"(x{step['model_over_measured']:.2f}); agree at bandwidth efficiency "
            f"{step['implied_bandwidth_efficiency']:.2f}, kvtune assumes "
            f"{step['assumed_bandwidth_efficiency']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--gpu", default=None, help="kvtune GPU class (default: from the device name)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny Llama shape (CPU logic check)")
    ap.add_argument("--inputs", type=Path, default=None,
                    help="kvtune's expectations written by --prepare (no kvtune import)")
    ap.add_argument("--prepare", type=Path, default=None,
                    help="write kvtune's expectations for --gpu/--model to this file and stop")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    if args.prepare is not None:
        inputs = kvtune_inputs("tiny-llama" if args.tiny else args.model, args.gpu or "H200",
                               config=TINY_CONFIG if args.tiny else None,
                               batched_tokens=64 if args.tiny else None,
                               max_num_seqs=16 if args.tiny else None)
        args.prepare.parent.mkdir(parents=True, exist_ok=True)
        args.prepare.write_text(json.dumps(inputs, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.prepare}")
        return

    import torch

    if args.inputs is not None:
        inputs = json.loads(args.inputs.read_text(encoding="utf-8"))
    else:
        gpu = args.gpu
        if gpu is None and args.device.startswith("cuda"):
            gpu = torch.cuda.get_device_name(0)
        inputs = kvtune_inputs("tiny-llama" if args.tiny else args.model, gpu or "H200",
                               config=TINY_CONFIG if args.tiny else None,
                               batched_tokens=64 if args.tiny else None,
                               max_num_seqs=16 if args.tiny else None)
    result = run(torch, inputs, args.device, tiny=args.tiny)
    name = result.get("gpu_name") or f"{args.device}-{inputs['gpu_class']}-expectations"
    path = result_path(name, dt.date.today(), args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=float) + "\n", encoding="utf-8")
    print(summary(result))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
