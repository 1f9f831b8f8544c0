"""Derive ``tuner/facts/data/step_kernels.json`` from NVIDIA's measured-kernel database for vLLM.

The database ships in the ``aiconfigurator-core`` wheel (the data package of ``aiconfigurator``,
Apache-2.0, https://github.com/ai-dynamo/aiconfigurator): per system, parquet tables of kernel
latencies that NVIDIA measured with vLLM's own kernels (``systems/data/<system>/<op>/vllm/
<version>/``). Nothing of it is committed; this script reads it and writes compact facts:

- ``linear``: a dense linear layer's time at M tokens, for M = 1, 2, 4, ..., 32768 (as far as
  measured), as ``seconds_per_gemm + seconds_per_param x N K``: a least-squares fit (relative
  error) over every GEMM shape (N, K) of the database with N and K in ``SHAPE_DIMS`` (LLM
  projections after tensor-parallel sharding). Small M is the time to read the weights (and
  launch the kernel), large M the matrix rate; what lies between is measured, not a roofline.
  Per weight dtype: ``bf16`` (torch linear), ``fp8`` (per-tensor scaled FP8, Cutlass).
- ``attention``: one layer's fixed time, per-sequence time and KV bandwidth efficiency (the
  decode kernel as ``fixed + per_seq x batch + KV bytes / (HBM x efficiency)``,
  ``_fit_decode``), and the prefill kernel's fraction of the dense BF16 rate by the mean
  context per query token (1, 2, 4, ... tokens; causal prefill of L tokens: (L + 1) / 2; the
  median over batches and heads, from prompts of ``MIN_PREFILL_ISL`` tokens or more whose
  kernels take at least twice the fixed cost, held at the first such context below it and
  never falling as the context grows).
- ``all_reduce_seconds``: vLLM's custom all-reduce under CUDA graphs, per TP size, at message
  sizes 2^7 .. 2^29 bytes.

    pip download aiconfigurator-core==0.12.0 --no-deps -d /tmp/aic && unzip -q -d /tmp/aic/x \\
        /tmp/aic/aiconfigurator_core-0.12.0-*.whl
    python bench/derive_step_kernels.py --data /tmp/aic/x/aiconfigurator_core/systems/data

Needs pyarrow (``pip install pyarrow``); without ``--data`` it looks for an installed
``aiconfigurator_core``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tuner" / "facts" / "data" / "step_kernels.json"
PACKAGE = "aiconfigurator-core"
PACKAGE_VERSION = "0.12.0"

# kvtune GPU class -> the database's system (only those with vLLM data).
SYSTEMS = {
    "H100": "h100_sxm", "H200": "h200_sxm", "B200": "b200_sxm", "B300": "b300_sxm",
    "GB200": "gb200", "A100-80GB": "a100_sxm", "L40S": "l40s",
}
# N and K of the GEMM shapes that stand for LLM projections (hidden 2K-16K, sharded).
SHAPE_DIMS = (2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 16384)
M_POINTS = tuple(2**i for i in range(16))  # 1 .. 32768 tokens
CTX_POINTS = tuple(2**i for i in range(14))  # 1 .. 8192 mean context tokens per query
MESSAGE_POINTS = tuple(2**i for i in range(7, 30))  # 128 B .. 512 MiB
# Which kernel stands for vLLM 0.33's default, in order of preference.
GEMM_KERNELS = {
    "bf16": ("bfloat16", ("torch.nn.functional.linear", "vllm_default")),
    "fp8": ("fp8", ("CutlassFP8ScaledMMLinearKernel",)),
}
PREFILL_KERNELS = ("vllm_flash_attn_fa3", "vllm_flashinfer_trtllmprefill", "vllm_flash_attn",
                   "vllm_flash_attn_fa2", "vllm_flashinfer", "vllm_triton_attn")
DECODE_KERNELS = ("vllm_flash_attn_fa3", "vllm_flashinfer_trtllmdecode", "vllm_flash_attn",
                  "vllm_flash_attn_fa2", "vllm_flashinfer", "vllm_triton_attn")
# Shorter prompts' attention is latency-bound: the fixed and per-sequence costs carry it, and
# its rate is held at that of the shortest prompt measured past this.
MIN_PREFILL_ISL = 128
# Attention shapes that stand for GQA models: head_dim 128, 8 KV heads, BF16 KV.
ATTN_HEADS = (8, 16, 32, 64)
LICENSE = ("Apache-2.0 (aiconfigurator-core 0.12.0 METADATA 'License-Expression: Apache-2.0'; "
           "SPDX headers of its system files); derived figures, not the package's files")


def _latest(dirpath: Path) -> Path | None:
    versions = [p for p in dirpath.glob("*") if p.is_dir() and any(p.glob("*.parquet"))]
    if not versions:
        return None

    def key(p: Path) -> tuple[int, ...]:
        return tuple(int(x) if x.isdigit() else -1 for x in p.name.split("."))

    return max(versions, key=key)


def _rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def _pick(rows: list[dict[str, Any]], preferred: tuple[str, ...]) -> str:
    present = {r["kernel_source"] for r in rows}
    for k in preferred:
        if k in present:
            return k
    raise SystemExit(f"none of {preferred} in {sorted(present)}")


def _gemm(gemm_dir: Path) -> tuple[dict[str, dict[str, list[float]]], dict[str, str]]:
    rows = _rows(gemm_dir / "gemm_perf.parquet")
    dims = set(SHAPE_DIMS)
    tables: dict[str, dict[str, list[float]]] = {}
    kernels: dict[str, str] = {}
    for name, (dtype, preferred) in GEMM_KERNELS.items():
        sel = [r for r in rows if r["gemm_dtype"] == dtype]
        if not sel:
            continue
        kernel = _pick(sel, preferred)
        lat: dict[tuple[int, int, int], float] = {
            (r["m"], r["n"], r["k"]): r["latency"] * 1e-3 for r in sel
            if r["kernel_source"] == kernel and r["n"] in dims and r["k"] in dims}
        shapes = {(n, k) for (_, n, k) in lat}
        per_gemm: list[float] = []
        per_param: list[float] = []
        for m in M_POINTS:
            common = [(n, k) for (n, k) in shapes if (m, n, k) in lat]
            if not common:
                break  # not measured this far (A100: up to 8192); kvtune extrapolates
            c, s = _fit_gemm([(n * k, lat[(m, n, k)]) for (n, k) in common])
            per_gemm.append(float(f"{c:.5g}"))
            per_param.append(float(f"{s:.5g}"))
        tables[name] = {"seconds_per_gemm": per_gemm, "seconds_per_param": per_param}
        kernels[name] = f"{kernel} ({len(shapes)} shapes)"
    return tables, kernels


def _fit_gemm(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``latency = per_gemm + per_param x N K`` by least squares on relative error; the
    fixed part no less than 0."""
    import numpy as np

    a = np.array([[1.0 / y, x / y] for x, y in points])
    c, s = (float(v) for v in np.linalg.lstsq(a, np.ones(len(points)), rcond=None)[0])
    if c < 0:
        c = 0.0
        s = float(np.mean([y / x for x, y in points]))
    return c, s


def _fit_decode(rows: list[dict[str, Any]], hbm: float) -> tuple[float, float, float]:
    """The decode kernel as ``fixed + per_seq x batch + KV bytes / (HBM x efficiency)``: the
    first two by least squares (relative error) over small caches (under 8 MB a layer, where
    the bytes cost little), the efficiency as the median over caches of 256 MB or more a layer
    (far beyond L2, which would flatter the smaller ones)."""
    import numpy as np

    def kv_bytes(r: dict[str, Any]) -> float:
        return float(r["batch_size"] * (r["step"] + 1) * r["num_key_value_heads"]
                     * r["head_dim"] * 2 * 2)

    small = [r for r in rows if kv_bytes(r) < 8e6]
    a = [[1.0 / (r["latency"] * 1e-3), r["batch_size"] / (r["latency"] * 1e-3)] for r in small]
    fixed, per_seq = (max(0.0, float(c)) for c in
                      np.linalg.lstsq(np.array(a), np.ones(len(a)), rcond=None)[0])
    effs = sorted(kv_bytes(r) / (r["latency"] * 1e-3 - fixed - per_seq * r["batch_size"]) / hbm
                  for r in rows if kv_bytes(r) >= 256e6)
    return fixed, per_seq, effs[len(effs) // 2]


def _attention(attn_dir: Path, hbm: float, bf16_peak: float) -> dict[str, Any]:
    def shape_ok(r: dict[str, Any]) -> bool:
        return (r["head_dim"] == 128 and r["num_key_value_heads"] == 8
                and r["num_heads"] in ATTN_HEADS and r.get("window_size", 0) == 0
                and r["kv_cache_dtype"] == "bfloat16")

    gen = [r for r in _rows(attn_dir / "generation_attention_perf.parquet") if shape_ok(r)]
    gk = _pick(gen, DECODE_KERNELS)
    gen = [r for r in gen if r["kernel_source"] == gk and r["batch_size"] <= 1024]
    fixed, per_seq, bw_eff = _fit_decode(gen, hbm)
    ctx = [r for r in _rows(attn_dir / "context_attention_perf.parquet") if shape_ok(r)]
    ck = _pick(ctx, PREFILL_KERNELS)
    by_ctx: dict[float, list[float]] = {}
    for r in ctx:
        if r["kernel_source"] != ck or r["batch_size"] > 64 or r["isl"] < MIN_PREFILL_ISL:
            continue
        isl = r["isl"]
        pairs = r["batch_size"] * isl * (isl + 1) / 2.0
        gpu = r["latency"] * 1e-3 - fixed
        if gpu < fixed:
            continue  # latency-bound: the fixed cost is that, the rate would be noise
        flops = 4.0 * r["num_heads"] * r["head_dim"] * pairs
        by_ctx.setdefault((isl + 1) / 2.0, []).append(flops / gpu / bf16_peak)
    known = sorted((c, sorted(v)[len(v) // 2]) for c, v in by_ctx.items())
    effs: list[float] = []
    for c in CTX_POINTS:  # non-decreasing: more context per query never runs slower
        effs.append(max(effs[-1] if effs else 0.0, float(f"{_interp_log(known, c):.4g}")))
    return {
        "decode_kernel": gk, "prefill_kernel": ck,
        "fixed_seconds_per_layer": float(f"{fixed:.4g}"),
        "seconds_per_seq_per_layer": float(f"{per_seq:.4g}"),
        "kv_bandwidth_efficiency": float(f"{bw_eff:.4g}"),
        "prefill_bf16_efficiency_by_context": effs,
    }


def _interp_log(points: list[tuple[float, float]], x: float) -> float:
    """Linear in log x between known points, clamped at both ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return points[-1][1]


def _all_reduce(comm_dir: Path) -> dict[str, list[float]]:
    rows = [r for r in _rows(comm_dir / "custom_allreduce_perf.parquet")
            if r["backend"] == "vllm_graph"]
    out: dict[str, list[float]] = {}
    for tp in sorted({r["num_gpus"] for r in rows}):
        lat = {r["message_size"]: r["latency"] * 1e-3 for r in rows if r["num_gpus"] == tp}
        if all(m in lat for m in MESSAGE_POINTS):
            out[str(tp)] = [float(f"{lat[m]:.4g}") for m in MESSAGE_POINTS]
    return out


def derive(data: Path) -> dict[str, Any]:
    gpus = {g["name"]: g for g in json.loads(
        (REPO / "tuner" / "facts" / "data" / "gpus.json").read_text())["gpu_classes"]}
    classes: dict[str, Any] = {}
    for cls, system in SYSTEMS.items():
        base = data / system
        gemm_v = _latest(base / "gemm" / "vllm")
        attn_v = _latest(base / "attention" / "vllm")
        comm_v = _latest(base / "comm" / "vllm")
        if gemm_v is None or attn_v is None:
            continue
        linear, kernels = _gemm(gemm_v)
        gpu = gpus[cls]
        row: dict[str, Any] = {
            "system": system,
            "vllm_versions": {"gemm": gemm_v.name, "attention": attn_v.name,
                              "all_reduce": comm_v.name if comm_v else None},
            "gemm_kernels": kernels,
            "linear": linear,
            "attention": _attention(attn_v, float(gpu["hbm_bandwidth_bytes_per_second"]),
                                    float(gpu["dense_bf16_flops_per_second"])),
        }
        if comm_v is not None:
            row["all_reduce_seconds"] = _all_reduce(comm_v)
        classes[cls] = row
        print(f"{cls}: {system} gemm {gemm_v.name} attention {attn_v.name} "
              f"comm {comm_v.name if comm_v else '-'}")
    return {
        "_comment": (
            "Step-time facts derived by bench/derive_step_kernels.py from NVIDIA's measured "
            "kernels for vLLM (module doc there says how each figure is made). Tokens M at "
            "1, 2, 4, ... 32768 for linear (a GEMM of N x K weights at M tokens takes "
            "seconds_per_gemm + seconds_per_param x N K); mean context per query token at "
            "1, 2, 4, ... 8192 for prefill_bf16_efficiency_by_context (fraction of "
            "gpus.json's dense BF16 rate); message sizes 2^7 .. 2^29 bytes for "
            "all_reduce_seconds (per TP size). "
            "Measured on vLLM 0.14-0.24 kernels, not 0.33."),
        "source": f"{PACKAGE} {PACKAGE_VERSION} (PyPI), systems/data/<system>/*/vllm/<version>",
        "license": LICENSE,
        "m_points": list(M_POINTS),
        "context_points": list(CTX_POINTS),
        "message_bytes_points": list(MESSAGE_POINTS),
        "gpu_classes": classes,
    }


def find_data() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("aiconfigurator_core is not installed; pass --data (module doc)")
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, help="aiconfigurator_core/systems/data")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    facts = derive(args.data or find_data())
    args.out.write_text(json.dumps(facts, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
