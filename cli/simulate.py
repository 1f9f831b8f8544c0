"""`kvtune simulate`: replay a request trace through the KV-cache simulator under several
configurations and compare them.

    kvtune simulate --trace AzureLLMInferenceTrace_conv.csv \\
        --model meta-llama/Llama-3.1-8B-Instruct \\
        --gpu H100 --compare defaults,planned,contiguous,no-prefix-cache --plot out.png

``defaults`` is vLLM 0.33's behaviour with no KV flags, ``planned`` is ``kvtune plan
--trace``'s plan for the same trace (the same capacity search, on the trace at ``--speed``,
within the same search budget; ``--no-search``: the planner's rules alone, as ``kvtune plan
--no-search``), ``contiguous`` the planned plan with every request reserving max-model-len up
front (equal memory), ``no-prefix-cache`` the planned plan without prefix caching, and
``custom`` vLLM's defaults with the ``--config K=V`` overrides.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import click

from kvtune.cli import serve_line
from kvtune.cli.options import gpu_option, model_option, tp_option, weights_dtype_option
from kvtune.cli.outputs import plot_file, writable_file
from kvtune.cli.params import POSITIVE, finite
from kvtune.cli.progress import Progress, progress_option
from kvtune.cli.search_budget_options import budget_from, search_budget_options
from kvtune.tuner.errors import InvalidInput, KVTuneError
from kvtune.tuner.facts import catalog, gpus
from kvtune.tuner.facts.capabilities import PINNED_VLLM_VERSION
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.planner.search_budget import SearchBudget
from kvtune.tuner.simulator import compare
from kvtune.tuner.simulator.engine import SimulatedPlan
from kvtune.tuner.simulator.goodput_search import plan_by_goodput
from kvtune.tuner.simulator.metrics import SimResult, SLOTargets
from kvtune.tuner.simulator.scheduler import ProgressHook
from kvtune.tuner.simulator.scheduler import simulate as simulate_requests
from kvtune.tuner.simulator.workload import SimRequest, requests_from_trace
from kvtune.tuner.traces import Trace, load_trace

# --speed: from a thousandth (a 1,000 s gap becomes 11.6 days of simulated time, still a
# bounded number of steps) to a million (a day of traffic in a tenth of a second: every
# request at once), beyond which the arrival times stop meaning anything.
MIN_SPEED, MAX_SPEED = 1e-3, 1e6

_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, summary key, format); a key missing from a row (no SLO given) is left out
    ("SLO met", "slo_attainment", "{:.1%}"),
    ("req/s", "throughput_requests_per_second", "{:.2f}"),
    ("out tok/s", "throughput_output_tokens_per_second", "{:.0f}"),
    ("TTFT p50", "ttft_p50_seconds", "{:.3f}"),
    ("TTFT p95", "ttft_p95_seconds", "{:.3f}"),
    ("TPOT p95", "tpot_p95_seconds", "{:.4f}"),
    ("preempt", "preemptions", "{}"),
    ("hit rate", "prefix_hit_rate", "{:.1%}"),
    ("peak seqs", "peak_concurrent_sequences", "{}"),
    ("mean seqs", "mean_concurrent_sequences", "{:.1f}"),
    ("KV use", "mean_kv_usage", "{:.1%}"),
    ("frag", "fragmentation_fraction", "{:.1%}"),
    ("rejected", "rejected", "{}"),
)


def _fmt(fmt: str, value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt.format(value)


def render_table(rows: list[dict[str, Any]]) -> str:
    columns = [c for c in _COLUMNS if any(c[1] in row for row in rows)]
    headers = ["config", "block", "seqs", "KV tokens", *(h for h, _, _ in columns)]
    body: list[list[str]] = []
    notes: list[str] = []
    for row in rows:
        if not row.get("starts", True):
            notes.append(f"{row['name']}: does not start: {row['start_error']}")
            continue
        e = row["engine"]
        body.append([
            row["name"], str(e["block_size"]), str(e["max_num_seqs"]),
            str(row["kv_cache_tokens"]),
            *(_fmt(f, row[k]) for _, k, f in columns),
        ])
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines + notes)


def _row(config: SimulatedPlan, result: SimResult | None, tensor_parallel: int,
         slo: SLOTargets | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": config.name, "starts": config.starts,
        # As `kvtune plan -o json` has them: the TP flag, the weights flags, the KV knobs.
        "vllm_args": serve_line.serve_args(tensor_parallel, config.plan),
        "engine": {
            "num_gpu_blocks": config.engine.num_gpu_blocks,
            "block_size": config.engine.block_size,
            "max_num_seqs": config.engine.max_num_seqs,
            "max_num_batched_tokens": config.engine.max_num_batched_tokens,
            "max_model_len": config.engine.max_model_len,
            "enable_prefix_caching": config.engine.enable_prefix_caching,
            "allocation": config.engine.allocation,
            "cpu_offload_blocks": config.engine.cpu_offload_blocks,
        },
    }
    if not config.starts:
        row["start_error"] = config.start_error
    if result is not None:
        summary = result.summary(slo)
        summary.pop("config", None)
        row.update(summary)
    return row


@click.command("simulate")
@click.option("--trace", "trace_path", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), required=True, help="Azure CSV or Mooncake JSONL trace.")
@model_option(required=True)
@gpu_option("gpu_name", required=True)
@tp_option("tensor_parallel")
@weights_dtype_option()
@click.option("--vllm-version", default=PINNED_VLLM_VERSION, show_default=True,
              help="vLLM version whose memory accounting and defaults to model "
              "(the versions kvtune is calibrated for).")
@click.option("--speed", type=finite(MIN_SPEED, MAX_SPEED), default=1.0, show_default=True,
              help="Replay X times faster than recorded (find where a configuration saturates).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Replay only the first N requests (default: all).")
@click.option("--config", "config_pairs", multiple=True, metavar="K=V",
              help="Overrides for the 'custom' configuration (vLLM defaults + these), e.g. "
              "--config block_size=32 --config max_num_seqs=128. Adds 'custom' to --compare.")
@click.option("--compare", "compare_names", default="defaults,planned,contiguous,no-prefix-cache",
              show_default=True, help="Comma-separated configurations: "
              + ", ".join(compare.CONFIGURATION_NAMES))
@click.option("--search/--no-search", default=True, show_default=True,
              help="'planned' is kvtune plan --trace's plan: the capacity search on this trace "
              "(at --speed); --no-search: the planner's rules alone.")
@click.option("--score-sample", type=click.IntRange(min=0), default=None, hidden=True,
              help="Before the capacity search planned 'planned': 0 is --no-search.")
@search_budget_options
@click.option("--ttft-p95", "ttft_slo", type=POSITIVE, default=None, metavar="S",
              help="TTFT target in seconds: each configuration reports its SLO attainment at the "
              "trace's rate (steady state: requests meeting both targets, after the "
              "warm-up); the planner plans for it.")
@click.option("--tpot-p95", "tpot_slo", type=POSITIVE, default=None, metavar="S",
              help="TPOT target in seconds (per request: (finish - first token) / (output - 1)).")
@click.option("--per-request", "per_request_path", type=click.Path(dir_okay=False,
              path_type=Path), default=None,
              help="Write one JSON line per configuration and request: arrival, TTFT, TPOT, "
              "whether it met the SLO.")
@click.option("--engine", type=click.Choice(["simulator", "vllm"]), default="simulator",
              show_default=True,
              help="Who schedules: kvtune's simulator, or vLLM 0.33.0's own scheduler (the "
              "exact reference, 20-230x slower; needs pip install 'kvtune[vllm]'). Both use "
              "kvtune's step-time model and vLLM's default async scheduling; with "
              "kv_offloading_size_gib, vLLM runs its own OffloadingConnector (the CPU tier).")
@click.option("-o", "--output", "output_format", type=click.Choice(["table", "json"]),
              default="table", show_default=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write a PNG: KV usage and hit rate over time, TTFT CDF.")
@progress_option()
def simulate(
    trace_path: Path, model: str, gpu_name: str, tensor_parallel: int, weights_dtype: str,
    vllm_version: str, speed: float, limit: int | None, config_pairs: tuple[str, ...],
    compare_names: str, search: bool, score_sample: int | None, ttft_slo: float | None,
    tpot_slo: float | None, per_request_path: Path | None, engine: str, output_format: str,
    plot_path: Path | None, progress: bool | None, **budget_opts: Any,
) -> None:
    """Replay a trace through the KV-cache simulator and compare configurations."""
    if score_sample is not None:
        # Scripts written before 'planned' became kvtune plan's own plan: 0 meant the rules.
        if score_sample != 0:
            raise click.BadParameter(
                f"{score_sample}: 'planned' is now kvtune plan --trace's capacity search, which "
                "replays its own stream; drop --score-sample (or use --no-search for the rules "
                "alone)", param_hint="--score-sample")
        search = False
    budget = budget_from(budget_opts)
    # Outputs are checked before the replay, which can take a while on a long trace.
    if plot_path is not None:
        plot_file(plot_path)
    if per_request_path is not None:
        writable_file(per_request_path, "--per-request")
    names, overrides = _configurations_asked(compare_names, config_pairs)
    if engine == "vllm" and "contiguous" in names:
        raise click.BadParameter("'contiguous': vLLM only allocates paged blocks; drop it with "
                                 "--engine vllm", param_hint="--compare")
    shown = Progress("simulate", progress)
    try:
        slo = (SLOTargets(ttft_seconds=ttft_slo, tpot_seconds=tpot_slo)
               if ttft_slo is not None or tpot_slo is not None else None)
        trace = load_trace(trace_path)
        request = PlanRequest(
            model=catalog.get_model(model), gpu=gpus.get_gpu_class(gpu_name),
            tensor_parallel=tensor_parallel, weights_dtype=weights_dtype,
            profile=profile_from_trace(trace), vllm_version=vllm_version,
            policy=PlanPolicy(slo=SLO(ttft_p95_seconds=ttft_slo, tpot_p95_seconds=tpot_slo)),
        )
        planned = _planned(request, trace, speed, search, budget, shown) \
            if "planned" in names else None
        configs = compare.configurations(request, names, overrides, planned_plan=planned)
        requests = requests_from_trace(trace, speed=speed, limit=limit)
        rows = []
        results: list[SimResult] = []
        for i, config in enumerate(configs):
            t0 = time.perf_counter()
            what = f"replaying {config.name} ({i + 1}/{len(configs)}), requests finished"
            result = (_replay(engine, requests, config, shown.counter(what))
                      if config.starts else None)
            row = _row(config, result, tensor_parallel, slo)
            row["wall_seconds"] = round(time.perf_counter() - t0, 3)
            rows.append(row)
            if result is not None:
                results.append(result)
    except KVTuneError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        shown.close()

    if per_request_path is not None:
        _write_per_request(per_request_path, results, slo)
    header = (f"{trace.name}: {len(requests)} requests at {speed:g}x, {model} on "
              f"{request.gpu.name} x{tensor_parallel}")
    if output_format == "json":
        json.dump(_finite({
            "trace": trace.name, "requests": len(requests), "speed": speed, "model": model,
            "gpu": request.gpu.name, "tensor_parallel": tensor_parallel,
            "configurations": rows,
        }), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        click.echo(header + (f"; SLO {_slo_text(slo)}" if slo is not None else ""))
        click.echo(render_table(rows))
        for config in configs:
            click.echo(f"  {config.name}: " + serve_line.serve_command(
                request.model.hf_id, tensor_parallel, config.plan))
    if plot_path is not None:
        from kvtune.tuner.simulator.plot import plot_comparison

        plot_comparison(results, plot_path, title=header)
        click.echo(f"wrote {plot_path}", err=output_format == "json")


def _planned(request: PlanRequest, trace: Trace, speed: float, search: bool,
              budget: SearchBudget, shown: Progress) -> KVPlan:
    """'planned': the plan ``kvtune plan --trace`` gives for this trace (one function for
    both commands and the operator: ``plan_by_goodput``), or the rules' with ``--no-search``."""
    if not search:
        return plan_pool(request).plan
    return plan_by_goodput(request, trace=trace, speed=speed, budget=budget,
                           progress=lambda step: shown(step.text())).plan


def _configurations_asked(compare_names: str, config_pairs: tuple[str, ...]
                          ) -> tuple[list[str], dict[str, Any]]:
    """``--compare`` and ``--config`` as the comparison takes them; a usage error (exit 2)
    for an unknown name, a malformed pair or a value out of its bounds, before any work."""
    names = [n.strip() for n in compare_names.split(",") if n.strip()]
    unknown = [n for n in names if n not in compare.CONFIGURATION_NAMES]
    if unknown or not (names or config_pairs):
        raise click.BadParameter(
            f"{compare_names!r}: " + (f"unknown {', '.join(unknown)}" if unknown else "empty")
            + f"; choose from {', '.join(compare.CONFIGURATION_NAMES)}",
            param_hint="--compare")
    try:
        overrides = compare.parse_overrides(config_pairs)
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from None
    if overrides and "custom" not in names:
        names.append("custom")
    return names, overrides


def _slo_text(slo: SLOTargets) -> str:
    parts = []
    if slo.ttft_seconds is not None:
        parts.append(f"TTFT <= {slo.ttft_seconds:g} s")
    if slo.tpot_seconds is not None:
        parts.append(f"TPOT <= {slo.tpot_seconds * 1000:g} ms")
    return " and ".join(parts) + " per request"


def _write_per_request(path: Path, results: list[SimResult], slo: SLOTargets | None) -> None:
    """One JSON line per configuration and request (NaN -> null)."""
    try:
        with path.open("w") as out:
            for result in results:
                per = result.per_request(slo)
                for i in range(result.num_requests):
                    out.write(json.dumps(_finite({
                        "config": result.name, "request": i,
                        "arrival_seconds": float(per.arrival_seconds[i]),
                        "prompt_tokens": result.prompt_tokens[i],
                        "output_tokens": result.output_tokens[i],
                        "ttft_seconds": float(per.ttft_seconds[i]),
                        "tpot_seconds": float(per.tpot_seconds[i]),
                        "met_slo": bool(per.met_slo[i]),
                    })) + "\n")
    except OSError as exc:
        raise click.ClickException(
            f"--per-request={str(path)!r}: cannot write ({exc.strerror}); pass a writable "
            "file path") from exc


def _replay(engine: str, requests: list[SimRequest], config: SimulatedPlan,
            progress: ProgressHook) -> SimResult:
    if engine == "vllm":
        # Lazy: vLLM and torch are an optional extra, and take ~10-20 s to import.
        from kvtune.oracle.vllm_engine import simulate_vllm

        progress(0, len(requests))  # vLLM's scheduler reports nothing until it is done
        result = simulate_vllm(requests, config.engine, config.cost, name=config.name)
        progress(len(requests), len(requests))
        return result
    return simulate_requests(requests, config.engine, config.cost, name=config.name,
                             on_progress=progress)


def _finite(value: Any) -> Any:
    """NaN/inf (no request finished) become null: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
