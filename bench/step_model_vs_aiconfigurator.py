"""kvtune's TTFT and TPOT against NVIDIA's measured-kernel database for vLLM, on static points.

A static point is (model, GPU class, TP, weights dtype, batch, input length, output length):
the batch's prompts prefill in one step (TTFT) and then decode together (TPOT, the mean step
over the output at the mean context). The reference adds up the database's measured kernels
for those steps, layer by layer, at the model's exact shapes: the four projections' GEMMs
(interpolated over the measured N, K and M as aiconfigurator does), the attention kernel
(context attention for the prefill, generation attention for decode, at the per-GPU heads),
two custom all-reduces per layer under TP (CUDA-graph figures), and the LM head over one row per
sequence. Neither side counts norms, rotary, activations or sampling. kvtune's side is
``StepCostModel``'s GPU time (``step_cost_for``, without the CPU overhead).

The database ships in ``aiconfigurator-core`` (0.12.0, Apache-2.0; module doc of
``bench/derive_step_kernels.py``). Without it the script says so and stops.

    D=<unzipped wheel>/aiconfigurator_core/systems/data
    .venv/bin/python bench/step_model_vs_aiconfigurator.py --data $D
    .venv/bin/python bench/step_model_vs_aiconfigurator.py --data $D --write   # the test's points

``--write`` stores the reference figures in ``tests/simulator/aiconfigurator_points.json``,
which ``tests/simulator/test_sim_step_kernels.py`` checks kvtune against without the package.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import derive_step_kernels as dsk

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.simulator.engine import step_cost_for
from kvtune.tuner.simulator.timing import StepCostModel

POINTS_FILE = dsk.REPO / "tests" / "simulator" / "aiconfigurator_points.json"
L8B = "meta-llama/Llama-3.1-8B-Instruct"
L70B = "meta-llama/Llama-3.3-70B-Instruct"


@dataclass(frozen=True)
class Point:
    model: str
    gpu: str
    tp: int
    weights: str  # "auto" (BF16) or "fp8"
    batch: int
    isl: int
    osl: int


POINTS = tuple(
    [Point(L8B, g, 1, "auto", b, isl, 256) for g in ("H100", "H200", "B200", "A100-80GB")
     for (b, isl) in ((1, 2048), (1, 8192), (4, 4096), (16, 1024), (64, 1024))]
    + [Point(L8B, g, 2, "auto", b, isl, 256) for g in ("H100", "H200")
       for (b, isl) in ((1, 8192), (16, 1024), (64, 2048))]
    + [Point(L70B, "H200", tp, "fp8", b, isl, 256) for tp in (1, 2, 4)
       for (b, isl) in ((1, 4096), (4, 4096), (32, 2048))]
    + [Point(L70B, "H100", 4, "fp8", b, isl, 256) for (b, isl) in ((1, 4096), (64, 2048))]
    + [Point(L8B, "L40S", 1, "fp8", b, isl, 256) for (b, isl) in ((1, 2048), (16, 1024))]
)


class Database:
    """The measured tables of one system, as lookups in seconds."""

    def __init__(self, data: Path, system: str) -> None:
        base = data / system
        gemm_v = dsk._latest(base / "gemm" / "vllm")
        attn_v = dsk._latest(base / "attention" / "vllm")
        comm_v = dsk._latest(base / "comm" / "vllm")
        assert gemm_v and attn_v and comm_v, system
        self.gemm: dict[str, dict[int, dict[tuple[int, int], float]]] = {}
        rows = dsk._rows(gemm_v / "gemm_perf.parquet")
        for name, (dtype, preferred) in dsk.GEMM_KERNELS.items():
            sel = [r for r in rows if r["gemm_dtype"] == dtype]
            if not sel:
                continue
            kernel = dsk._pick(sel, preferred)
            table: dict[int, dict[tuple[int, int], float]] = {}
            for r in sel:
                if r["kernel_source"] == kernel:
                    table.setdefault(r["m"], {})[(r["n"], r["k"])] = r["latency"] * 1e-3
            self.gemm[name] = table
        ctx = dsk._rows(attn_v / "context_attention_perf.parquet")
        ck = dsk._pick(ctx, dsk.PREFILL_KERNELS)
        self.ctx = {(r["batch_size"], r["isl"], r["num_heads"], r["num_key_value_heads"]):
                    r["latency"] * 1e-3 for r in ctx
                    if r["kernel_source"] == ck and r["head_dim"] == 128
                    and r.get("window_size", 0) == 0 and r["kv_cache_dtype"] == "bfloat16"}
        gen = dsk._rows(attn_v / "generation_attention_perf.parquet")
        gk = dsk._pick(gen, dsk.DECODE_KERNELS)
        self.gen = {(r["batch_size"], r["step"], r["num_heads"], r["num_key_value_heads"]):
                    r["latency"] * 1e-3 for r in gen
                    if r["kernel_source"] == gk and r["head_dim"] == 128
                    and r.get("window_size", 0) == 0 and r["kv_cache_dtype"] == "bfloat16"}
        comm = dsk._rows(comm_v / "custom_allreduce_perf.parquet")
        self.ar = {(r["num_gpus"], r["message_size"]): r["latency"] * 1e-3 for r in comm
                   if r["backend"] == "vllm_graph"}
        self.versions = f"gemm {gemm_v.name}, attention {attn_v.name}, comm {comm_v.name}"

    def gemm_seconds(self, dtype: str, m: int, n: int, k: int) -> float:
        table = self.gemm[dtype if dtype in self.gemm else "bf16"]
        ms = sorted(table)
        i = min(max(1, bisect.bisect_left(ms, m)), len(ms) - 1)
        m0, m1 = ms[i - 1], ms[i]
        v0, v1 = _bilinear(table[m0], n, k), _bilinear(table[m1], n, k)
        if m > m1:  # beyond the measured M: proportional
            return v1 * m / m1
        return v0 + (v1 - v0) * (m - m0) / (m1 - m0)

    def context_seconds(self, batch: int, isl: int, heads: int, kv_heads: int) -> float:
        return self.ctx[(batch, isl, heads, kv_heads)]

    def generation_seconds(self, batch: int, context: int, heads: int, kv_heads: int) -> float:
        steps = sorted({s for (b, s, h, kv) in self.gen
                        if (b, h, kv) == (batch, heads, kv_heads)})
        i = min(max(1, bisect.bisect_left(steps, context)), len(steps) - 1)
        s0, s1 = steps[i - 1], steps[i]
        v0 = self.gen[(batch, s0, heads, kv_heads)]
        v1 = self.gen[(batch, s1, heads, kv_heads)]
        return v0 + (v1 - v0) * (context - s0) / (s1 - s0)

    def all_reduce_seconds(self, tp: int, message_bytes: int) -> float:
        sizes = sorted(s for (g, s) in self.ar if g == tp)
        i = min(max(1, bisect.bisect_left(sizes, message_bytes)), len(sizes) - 1)
        s0, s1 = sizes[i - 1], sizes[i]
        v0, v1 = self.ar[(tp, s0)], self.ar[(tp, s1)]
        return max(v0, v0 + (v1 - v0) * (message_bytes - s0) / (s1 - s0))


def _bilinear(grid: dict[tuple[int, int], float], n: int, k: int) -> float:
    ns = sorted({a for (a, _) in grid})
    ks = sorted({b for (_, b) in grid})

    def bracket(xs: list[int], x: int) -> tuple[int, int, float]:
        i = min(max(1, bisect.bisect_left(xs, x)), len(xs) - 1)
        return xs[i - 1], xs[i], (x - xs[i - 1]) / (xs[i] - xs[i - 1])

    n0, n1, tn = bracket(ns, n)
    k0, k1, tk = bracket(ks, k)
    top = grid[(n0, k0)] + (grid[(n1, k0)] - grid[(n0, k0)]) * tn
    bottom = grid[(n0, k1)] + (grid[(n1, k1)] - grid[(n0, k1)]) * tn
    return top + (bottom - top) * tk


def reference(db: Database, p: Point) -> tuple[float, float]:
    """The database's TTFT and TPOT (seconds) for the static point (module doc)."""
    m = get_model(p.model)
    h, tp = m.hidden_size, p.tp
    heads, kv = m.num_attention_heads // tp, max(1, m.num_kv_heads // tp)
    d = m.head_dim
    dtype = "fp8" if p.weights == "fp8" else "bf16"
    shapes = (((heads + 2 * kv) * d, h), (h, heads * d),
              (2 * m.intermediate_size // tp, h), (h, m.intermediate_size // tp))

    def step(tokens: int, attention: float) -> float:
        layer = sum(db.gemm_seconds(dtype, tokens, n, k) for (n, k) in shapes) + attention
        if tp > 1:
            layer += 2 * db.all_reduce_seconds(tp, tokens * h * 2)
        head = db.gemm_seconds("bf16", p.batch, m.vocab_size // tp, h)
        return m.num_hidden_layers * layer + head

    ttft = step(p.batch * p.isl, db.context_seconds(p.batch, p.isl, heads, kv))
    tpot = step(p.batch, db.generation_seconds(p.batch, p.isl + p.osl // 2, heads, kv))
    return ttft, tpot


def cost_for(p: Point) -> StepCostModel:
    request = PlanRequest(model=get_model(p.model), gpu=get_gpu_class(p.gpu),
                          profile=preset_profile("chat"), tensor_parallel=p.tp,
                          weights_dtype=p.weights)
    return step_cost_for(request, "auto")


def kvtune_times(p: Point) -> tuple[float, float]:
    """kvtune's GPU time of the point's prefill step and mean decode step (no overhead)."""
    cost = cost_for(p)
    overhead = cost.efficiency.step_overhead_seconds
    tokens = p.batch * p.isl
    ttft = cost.step_seconds(tokens, tokens, p.batch * p.isl * (p.isl + 1) / 2.0,
                             num_seqs=p.batch) - overhead
    run = cost.decode_run_seconds(p.batch, p.batch * (p.isl + 1), p.osl)
    return ttft, run / p.osl - overhead


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, help="aiconfigurator_core/systems/data")
    ap.add_argument("--write", action="store_true", help=f"write {POINTS_FILE.name}")
    args = ap.parse_args()
    try:
        data = args.data or dsk.find_data()
    except SystemExit as e:
        print(f"skipped: {e}")
        return
    dbs: dict[str, Database] = {}
    rows: list[dict[str, Any]] = []
    worst = 0.0
    print(f"{'point':58s} {'ref TTFT ms':>11s} {'kvtune/ref':>10s} {'ref TPOT ms':>11s} "
          f"{'kvtune/ref':>10s}")
    for p in POINTS:
        system = dsk.SYSTEMS[p.gpu]
        db = dbs.setdefault(system, Database(data, system))
        ref_ttft, ref_tpot = reference(db, p)
        ttft, tpot = kvtune_times(p)
        worst = max(worst, abs(ttft / ref_ttft - 1), abs(tpot / ref_tpot - 1))
        label = (f"{p.model.split('/')[1][:18]} {p.weights} {p.gpu} TP{p.tp} "
                 f"b{p.batch} in{p.isl} out{p.osl}")
        print(f"{label:58s} {ref_ttft * 1e3:11.2f} {ttft / ref_ttft:10.3f} "
              f"{ref_tpot * 1e3:11.3f} {tpot / ref_tpot:10.3f}")
        rows.append({**p.__dict__, "ttft_seconds": float(f"{ref_ttft:.5g}"),
                     "tpot_seconds": float(f"{ref_tpot:.5g}"), "database": db.versions})
    print(f"largest deviation: {worst:.1%}")
    if args.write:
        POINTS_FILE.write_text(json.dumps({
            "_comment": ("Reference TTFT/TPOT of static points: NVIDIA's measured vLLM kernels "
                         "summed per step by bench/step_model_vs_aiconfigurator.py (module doc)."),
            "source": f"{dsk.PACKAGE} {dsk.PACKAGE_VERSION} (PyPI), {dsk.LICENSE}",
            "points": rows}, indent=1) + "\n")
        print(f"wrote {POINTS_FILE}")


if __name__ == "__main__":
    main()
