"""How long the KV-quality measurement (the calibration Job's work) takes, against the bare
16-bit forward passes of the same prompts measured in the same run.

The model is 8B-shaped by default: Llama 3.1 8B's config.json from kvtune's catalog,
initialised with random weights on the device (the timing depends on the shapes, not on the
weights; the KL figures it prints prove nothing about Llama's quality). Written for an H200:

    .venv/bin/python bench/quality_bench.py --device cuda            # 8B shape, bf16
    .venv/bin/python bench/quality_bench.py --shape tiny --device cpu # a smoke run anywhere

It prints the baseline (one plain 16-bit forward pass per prompt, no hooks), the
measurement's total and its phases (16-bit passes with the per-layer side computations,
quantized passes, numpy KV round trips), and the ratio measurement / baseline.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

SHAPES = {
    "llama-3.1-8b": "meta-llama--Llama-3.1-8B-Instruct.json",
    "tiny": None,
}
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 2048,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def shape_config(shape: str) -> dict[str, object]:
    name = SHAPES[shape]
    if name is None:
        return dict(TINY)
    text = resources.files("kvtune.tuner.facts").joinpath("data", "models", name).read_text()
    config: dict[str, object] = json.loads(text)["config"]
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompts", type=int, default=4, help="calibration prompts to use")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per prompt")
    parser.add_argument("--dtypes", default="fp8,int8_per_token_head,int4_per_token_head")
    args = parser.parse_args()

    import torch

    from kvtune.quality import measure

    dtypes = [d for d in args.dtypes.split(",") if d]
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps(shape_config(args.shape)))
        t0 = time.perf_counter()
        loaded = measure.load_model(config_path, device=args.device)
        load_s = time.perf_counter() - t0
    # Long prompts first: the long-context ones reach --tokens, chat and code are shorter.
    prompts = sorted(measure.calibration_prompts(), key=lambda p: -len(p.text))[:args.prompts]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    print(f"model: {args.shape} shape, random weights, {loaded.activation_dtype} on "
          f"{args.device} (torch {torch.__version__}); loaded in {load_s:.1f} s")

    # Baseline: plain forward passes of the same token ids, no hooks.
    ids = [measure.tokenize(loaded, p.text, args.tokens) for p in prompts]
    with torch.inference_mode():
        loaded.model(torch.tensor([ids[0][:16]], device=args.device))  # warm-up
        sync()
        t0 = time.perf_counter()
        for row in ids:
            loaded.model(torch.tensor([row], device=args.device))
        sync()
        baseline_s = time.perf_counter() - t0
    tokens = sum(len(r) for r in ids)
    print(f"baseline: {len(ids)} plain 16-bit forward passes, {tokens} tokens: "
          f"{baseline_s:.2f} s ({tokens / baseline_s:,.0f} tokens/s)")

    t0 = time.perf_counter()
    report = measure.measure(loaded, dtypes, prompts=prompts, max_prompt_tokens=args.tokens,
                             progress=lambda m: print(f"  {m}", file=sys.stderr))
    sync()
    total_s = time.perf_counter() - t0
    print(f"measurement of {len(dtypes)} dtype(s): {total_s:.2f} s = "
          f"{total_s / baseline_s:.1f}x the baseline "
          f"(one 16-bit pass + {len(dtypes)} quantized passes per prompt would be "
          f"{1 + len(dtypes)}x)")
    for phase, seconds in report.seconds_by_phase.items():
        print(f"  {phase}: {seconds:.2f} s")
    per_dtype = total_s / max(1, len(dtypes))
    print(f"per dtype: {per_dtype:.2f} s for {tokens} tokens")
    for m in report.measurements:
        print(f"  {m.summary()}  (random weights: mechanics only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
