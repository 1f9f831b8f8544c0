"""How close kvtune's KV-cache size is to vLLM's own, on published vLLM start-up logs
(``tuner/facts/data/vllm_startup_logs.json``): the leave-one-out error of the calibrated
non-KV model against the model kvtune used before the calibration (the baseline, computed in
the same run on the same rows).

Leave-one-out: for each row kvtune can predict, the coefficients are refitted without that row
(and without the rows that repeat it), then the row's KV tokens ("GPU KV cache size") and its
non-KV GiB (weights + activation + non-torch [+ CUDA graphs where deducted]) are predicted the
way ``kvtune plan`` figures them: the planner's weights, vLLM's page layout. A second column
uses the logged weights instead, to separate the non-KV model from the weights model (rows
whose model is not in the catalog, but whose config facts the table carries, always use them).

    .venv/bin/python bench/memory_calibration.py [--rows] [--write]

``--rows`` prints every row; ``--write`` stores the fit on all rows as the shipped
coefficients (``tuner/facts/data/vllm_memory.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from importlib import resources
from typing import Any

from kvtune.tuner.errors import KVTuneError
from kvtune.tuner.facts.kvmemory import block_bytes, request_blocks
from kvtune.tuner.facts.vllm_memory import MemoryCoefficients
from kvtune.tuner.facts.weights import weight_bits, weights_bytes_per_gpu
from kvtune.tuner.planner import memory_fit
from kvtune.tuner.planner.memory_fit import BLOCK_SIZE, StartupLog

GiB = 1 << 30
MiB = 1 << 20


def baseline_non_kv_bytes(row: StartupLog, weights: int) -> int:
    """kvtune's non-KV model before the calibration (``tuner/planner/budget.py`` up to commit
    80d81b9): activations N x (4h + 2 ffn/TP) x 2 B + logits min(S, N) x V x 8 B, CUDA graphs
    256 MiB + 8 MiB per layer always deducted, non-torch 256 MiB + 512 MiB NCCL at TP > 1."""
    model = row.model_arch()
    assert model is not None
    tp, n, s = row.tensor_parallel, row.batched_tokens, row.seqs
    if model.moe is not None:
        ffn = model.moe.expert_intermediate_size * model.moe.experts_per_token
        if model.moe.dense_intermediate_size:
            ffn = max(ffn, model.moe.dense_intermediate_size)
    else:
        ffn = model.intermediate_size
    act = n * (4 * model.hidden_size + 2 * -(-ffn // tp)) * 2 + min(s, n) * model.vocab_size * 8
    graphs = 256 * MiB + model.num_hidden_layers * 8 * MiB
    non_torch = 256 * MiB + (512 * MiB if tp > 1 else 0)
    return weights + act + graphs + non_torch


def baseline_tokens(row: StartupLog, *, logged_weights: bool = False) -> tuple[int, float]:
    model = row.model_arch()
    total = memory_fit.cuda_total_bytes(row)
    assert model is not None and total is not None and row.gpu_memory_utilization is not None
    assert row.max_model_len is not None
    if (logged_weights or row.shape_of is None) and row.logged.weights_gib is not None:
        weights = round(row.logged.weights_gib * GiB)
    else:
        weights = weights_bytes_per_gpu(model, row.weights_dtype, row.tensor_parallel)
    non_kv = baseline_non_kv_bytes(row, weights)
    budget = math.ceil(total * row.gpu_memory_utilization) - non_kv
    page = block_bytes(model, row.kv_cache_dtype, row.tensor_parallel, BLOCK_SIZE,
                       model_dtype=row.model_dtype(model))
    blocks = max(0, budget) // page
    per_request = request_blocks(model, row.max_model_len, BLOCK_SIZE, row.batched_tokens,
                                 row.max_model_len)
    return int(blocks / per_request * row.max_model_len), non_kv / GiB


def _pct(predicted: float, logged: float) -> float:
    return 100.0 * (predicted / logged - 1.0)


def _summary(errors: list[float]) -> str:
    a = sorted(abs(e) for e in errors)
    p90 = a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)]
    return f"{statistics.median(a):6.2f} {p90:6.2f} {a[-1]:6.2f}"


def _row_classes(row: StartupLog) -> list[str]:
    """The classes a row's error is reported under: its weights (dense / MoE, and quantized
    when the served weights are under 16 bits), its tensor parallelism and its GPU."""
    model = row.model_arch()
    assert model is not None
    classes = ["MoE" if model.moe is not None else "dense"]
    try:
        bits = weight_bits(model, row.weights_dtype)
    except KVTuneError:
        bits = 16
    if bits < 16:
        classes.append("quantized")
    classes.append("TP1" if row.tensor_parallel == 1 else "TP>1")
    total = memory_fit.cuda_total_bytes(row)
    kv = row.logged.available_kv_gib
    if kv is not None and total and row.gpu_memory_utilization:
        # The case: the KV cache is what is left after large weights, so every
        # non-KV GiB missed is a large share of it.
        share = kv * GiB / (total * row.gpu_memory_utilization)
        classes.append("KV < 35 % of budget" if share < 0.35 else "KV >= 35 % of budget")
    classes.append(f"GPU {row.gpu}")
    return classes


def _print_classes(results: list[dict[str, Any]]) -> None:
    by_class: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        for c in _row_classes(r["row"]):
            by_class.setdefault(c, []).append(r)
    print("\nleave-one-out |error| % of KV tokens per class, median / p90 / max")
    print(f"{'class':20s} {'n':>3s} {'planner weights':>22s} {'logged weights':>22s}")
    order = ["dense", "MoE", "quantized", "TP1", "TP>1", "KV < 35 % of budget",
             "KV >= 35 % of budget"]
    for c, rs in sorted(by_class.items(),
                        key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0])):
        print(f"{c:20s} {len(rs):3d} {_summary([r['kv_cal'] for r in rs]):>22s} "
              f"{_summary([r['kv_cal_w'] for r in rs]):>22s}")


def _leave_out(rows: tuple[StartupLog, ...], row: StartupLog) -> list[StartupLog]:
    return [r for r in rows if r.id != row.id and r.repeat_of != row.id]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", action="store_true", help="print every predicted row")
    ap.add_argument("--write", action="store_true",
                    help="store the fit on all rows as the shipped coefficients")
    args = ap.parse_args()

    rows = memory_fit.startup_logs()
    full = memory_fit.fit(rows)
    skipped: dict[str, int] = {}
    results = []
    for row in rows:
        why = memory_fit.predictable(row)
        if why is not None:
            key = why if not why.startswith("repeats") else "repeats another row"
            skipped[key] = skipped.get(key, 0) + 1
            continue
        loo = memory_fit.fit(_leave_out(rows, row))
        cal = memory_fit.predict(row, loo)
        cal_w = memory_fit.predict(row, loo, logged_weights=True)
        base_tokens, base_non_kv = baseline_tokens(row)
        base_tokens_w, _ = baseline_tokens(row, logged_weights=True)
        logged = row.logged
        assert logged.kv_tokens is not None
        results.append({
            "row": row, "cal": cal, "base_tokens": base_tokens,
            "kv_base": _pct(base_tokens, logged.kv_tokens),
            "kv_cal": _pct(cal.kv_tokens, logged.kv_tokens),
            "kv_base_w": _pct(base_tokens_w, logged.kv_tokens),
            "kv_cal_w": _pct(cal_w.kv_tokens, logged.kv_tokens),
            "nk_base": _pct(base_non_kv, logged.non_kv_gib) if logged.non_kv_gib else None,
            "nk_cal": _pct(cal.non_kv_gib, logged.non_kv_gib) if logged.non_kv_gib else None,
        })

    print(f"vLLM start-up logs: {len(rows)} rows; predicted: {len(results)}; not predicted: "
          + ", ".join(f"{n} ({why})" for why, n in sorted(skipped.items())))
    gpus = sorted({str(r['row'].gpu) for r in results})
    versions = sorted({str(r['row'].vllm_version) for r in results})
    print(f"predicted rows cover GPUs {', '.join(gpus)}; vLLM {', '.join(versions)}; "
          f"TP {sorted({r['row'].tensor_parallel for r in results})}")
    if args.rows:
        print(f"\n{'row':58s} {'logged':>9s} {'baseline':>9s} {'err%':>6s} {'LOO':>9s} "
              f"{'err%':>6s} {'LOO(w)':>6s}")
        for r in results:
            row = r["row"]
            print(f"{row.id[:58]:58s} {row.logged.kv_tokens:9d} {r['base_tokens']:9d} "
                  f"{r['kv_base']:+6.1f} {r['cal'].kv_tokens:9d} {r['kv_cal']:+6.1f} "
                  f"{r['kv_cal_w']:+6.1f}")
    print("\nleave-one-out |error| %, median / p90 / max "
          f"(n={len(results)}; goal: KV tokens within 3 %)")
    print(f"{'':38s} {'baseline (uncalibrated)':>24s}   {'calibrated':>20s}")
    print(f"{'KV tokens, planner weights':38s} {_summary([r['kv_base'] for r in results]):>24s}"
          f"   {_summary([r['kv_cal'] for r in results]):>20s}")
    print(f"{'KV tokens, logged weights':38s} {_summary([r['kv_base_w'] for r in results]):>24s}"
          f"   {_summary([r['kv_cal_w'] for r in results]):>20s}")
    nk = [r for r in results if r["nk_cal"] is not None]
    print(f"{'non-KV GiB, planner weights':38s} {_summary([r['nk_base'] for r in nk]):>24s}"
          f"   {_summary([r['nk_cal'] for r in nk]):>20s}")
    within = sum(1 for r in results if abs(r["kv_cal"]) <= 3.0)
    print(f"KV tokens within 3 %: calibrated {within}/{len(results)}, baseline "
          f"{sum(1 for r in results if abs(r['kv_base']) <= 3.0)}/{len(results)}")
    worst = sorted(results, key=lambda r: -abs(r["kv_cal"]))[:3]
    print("largest calibrated misses: " + "; ".join(
        f"{r['row'].id} {r['kv_cal']:+.1f} % (logged weights: {r['kv_cal_w']:+.1f} %)"
        for r in worst))
    _print_classes(results)

    if args.write:
        _write(full)


def _write(coefs: MemoryCoefficients) -> None:
    path = resources.files("kvtune.tuner.facts").joinpath("data", "vllm_memory.json")
    doc = json.loads(path.read_text("utf-8"))
    doc["coefficients"] = coefs.model_dump(mode="json")
    with open(str(path), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print(f"\nwrote the fit on all rows to {path}")


if __name__ == "__main__":
    main()
