"""`kvtune plan`: plan one pool's vLLM KV-cache configuration offline.

The command is three steps, each its own function so other sources and formats plug in
without touching the rest: build a ``PlanRequest`` from the options (``build_request``),
plan it (``kvtune.tuner.planner.planning.plan_pool``), render it (``render``; formats in
``RENDERERS``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kvtune.cli.options import (
    gpu_option,
    in_option_terms,
    model_option,
    pin_options,
    pins_from,
    tp_option,
    weights_dtype_option,
)
from kvtune.cli.params import POSITIVE, finite
from kvtune.cli.plan_calibration import model_calibration_for
from kvtune.cli.plan_compare import with_comparison
from kvtune.cli.plan_disagg import (
    check_disagg_options,
    disagg_options,
    plan_disaggregated,
    render_disagg,
    wants_disagg,
)
from kvtune.cli.plan_layout import (
    layout_options,
    layout_rows,
    plan_with_layout,
    print_layouts,
    request_for,
    wants_layout,
)
from kvtune.cli.plan_reuse import print_reuse
from kvtune.cli.plan_tiers import check as check_tiers
from kvtune.cli.plan_tiers import tier_document, tier_options, with_tiers
from kvtune.cli.plan_tp import (
    check_auto_options,
    max_replicas_option,
    plan_auto,
    print_tp_choice,
    tp_rows,
    wants_auto,
)
from kvtune.cli.progress import Progress, progress_option
from kvtune.cli.search_budget_options import budget_from, search_budget_options
from kvtune.tuner.errors import KVTuneError, NoFeasiblePlan
from kvtune.tuner.facts import catalog, gpus
from kvtune.tuner.facts.capabilities import PINNED_VLLM_VERSION, get_runtime
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token
from kvtune.tuner.facts.prices import parse_overrides, price_for
from kvtune.tuner.facts.weights import weights_load
from kvtune.tuner.kv_quality import (
    DEFAULT_MAX_KV_QUANTIZATION_KL,
    KVQualityEvidence,
    KVQualityPolicy,
    checkpoint_scheme,
    evidence_from_report,
    gate_one,
)
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.cost import priced
from kvtune.tuner.planner.planning import PlanRequest, kv_capacity_by_dtype, plan_pool
from kvtune.tuner.planner.policy import (
    MAX_PIN_OFFLOAD_GIB,
    MAX_PIN_SEQUENCES,
    MAX_PIN_TOKENS,
    SLO,
    PlanPolicy,
)
from kvtune.tuner.planner.presets import (
    PRESET_KINDS,
    fixed_session_profile,
    preset_profile,
    profile_from_trace,
)
from kvtune.tuner.planner.reuse_money import with_host_price
from kvtune.tuner.simulator.goodput_search import plan_by_goodput
from kvtune.tuner.traces import load_trace
from kvtune.tuner.units import GiB
from kvtune.tuner.workload import WorkloadProfile

# --request-rate's ceiling: more than one vLLM replica serves of any traffic, so a larger
# pool is planned on one replica's share (--request-rate RATE/REPLICAS). The stream the search
# simulates no longer grows with the rate (profile_traffic caps the warm-up, the search budget
# caps the requests per candidate): 1e5 ran a normal search in ~25 s; the ceiling is about
# meaning, not memory (1e9 used to ask numpy for 7 TiB).
MAX_REQUEST_RATE_PER_SECOND = 10_000.0


def build_profile(
    context_tokens: int | None, workload: str | None, trace: Path | None
) -> WorkloadProfile:
    """``--trace`` > ``--workload`` (optionally rescaled by ``--context-tokens``) >
    ``--context-tokens`` alone (fixed sessions) > the chat preset."""
    if trace is not None:
        if workload is not None or context_tokens is not None:
            raise click.UsageError("--trace replaces --workload and --context-tokens; pass one")
        return profile_from_trace(load_trace(trace))
    if workload is not None:
        return preset_profile(workload, context_tokens)
    if context_tokens is not None:
        return fixed_session_profile(context_tokens)
    return preset_profile("chat")


def build_request(opts: dict[str, Any]) -> PlanRequest:
    pins = pins_from(opts)
    policy = PlanPolicy(
        slo=SLO(ttft_p95_seconds=opts["ttft_p95"], tpot_p95_seconds=opts["tpot_p95"]),
        lowest_kv_precision=opts["lowest_kv_precision"],
        pins=pins,
        target_concurrent_sequences=opts["target_sequences"],
        min_max_model_len_tokens=opts["min_max_model_len"],
        cpu_offload_budget_bytes=int((opts["cpu_offload_gib"] or 0) * GiB),
        kv_quality=KVQualityPolicy(
            max_kv_quantization_kl=opts["max_kv_quantization_kl"],
            require_measurement=opts["require_kv_measurement"]),
    )
    request = PlanRequest(
        model=catalog.get_model(opts["model"]),
        gpu=gpus.get_gpu_class(opts["gpu"]),
        # --tp auto: each degree is planned in turn (cli/plan_tp.py); 1 until then.
        tensor_parallel=1 if opts["tp"] == "auto" else opts["tp"],
        weights_dtype=opts["weights_dtype"],
        profile=build_profile(opts["context_tokens"], opts["workload"], opts["trace"]),
        policy=policy,
        vllm_version=opts["vllm_version"],
        kv_quality_evidence=kv_quality_evidence(opts["kv_quality_report"]),
    )
    calibration = model_calibration_for(request, opts.get("calibration"))
    return request if calibration is None else request.model_copy(
        update={"calibration": calibration})


def kv_quality_evidence(path: Path | None) -> KVQualityEvidence | None:
    """``--kv-quality-report``: a report written by ``kvtune quality -o``."""
    if path is None:
        return None
    try:
        report = json.loads(path.read_text())
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
        return evidence_from_report(report, source=f"kvtune quality report {path.name}")
    except (ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"{path}: not a kvtune quality report ({exc}); write one "
                                 "with `kvtune quality --model … -o FILE`",
                                 param_hint="--kv-quality-report") from None


# --- rendering ---------------------------------------------------------------------------------


def dtype_comparison(request: PlanRequest) -> list[dict[str, Any]]:
    """Per usable KV dtype: bytes per token, scale overhead over the pure element width, and
    the concurrent p95 sessions (the article's 16/8/4-bit comparison)."""
    runtime = get_runtime(request.vllm_version)
    sessions = kv_capacity_by_dtype(request)
    served = weights_load(request.model, request.weights_dtype).served_dtype
    # 16-bit KV: "auto", or by name where the checkpoint's KV scheme makes auto fp8.
    kv16 = served if request.model.auto_kv_cache_dtype is not None else "auto"
    base = kv_bytes_per_token(request.model, kv16, request.tensor_parallel,
                              model_dtype=served)
    base_sessions = sessions.get(kv16) or 0
    rows = []
    for name, count in sessions.items():
        bits = runtime.dtype(name).bits
        per_token = kv_bytes_per_token(request.model, name, request.tensor_parallel,
                                       model_dtype=served)
        pure = base * bits // 16
        rows.append({
            "kv_cache_dtype": name,
            "bits": bits,
            "kv_bytes_per_token": per_token,
            "scale_overhead": round(per_token / pure - 1.0, 6) if pure else 0.0,
            "concurrent_sequences": count,
            "vs_16bit": round(count / base_sessions, 2) if base_sessions else None,
            # The KV-quality gate's verdict on this dtype (docs/quality.md).
            "quality": gate_one(name, request.kv_quality_evidence, request.policy.kv_quality,
                                checkpoint_scheme(request.model.quantization, name)
                                ).model_dump(
                                    include={"allowed", "code", "detail"}),
        })
    return rows


def plan_document(pool: PoolPlan, request: PlanRequest) -> dict[str, Any]:
    """The stable JSON/YAML document (top-level keys are a contract for scripts)."""
    return {
        "model": pool.model_id,
        "gpu_class": pool.gpu_class,
        "tensor_parallel": pool.tensor_parallel,
        **({"layout": pool.layout.model_dump(mode="json") | {"label": pool.layout.label}}
           if pool.layout is not None else {}),
        **({"layouts_considered": layout_rows(pool)} if pool.layouts_considered else {}),
        **({"tp_choice": tp_rows(pool)} if pool.tp_choice is not None else {}),
        "weights_dtype": request.weights_dtype,
        "vllm_version": pool.vllm_version,
        "kv_bytes_per_token": pool.expected.kv_bytes_per_token,
        "kv_cache_tokens": pool.expected.kv_cache_tokens,
        "concurrent_sequences": pool.expected.concurrent_sequences,
        "concurrent_sequences_context_tokens": pool.expected.concurrent_sequences_context_tokens,
        "plan": pool.plan.model_dump(mode="json"),
        "vllm_args": pool.vllm_args(),
        # An LMCache tier: its sizes and the LMCACHE_* variables the pod runs with.
        **({"kv_tier": tier_document(pool)} if pool.kv_tier is not None else {}),
        "expected": pool.expected.model_dump(mode="json"),
        "reasons": [r.model_dump(mode="json") for r in pool.reasons],
        "warnings": list(pool.warnings),
        "kv_dtype_comparison": dtype_comparison(request),
        "search": pool.search.model_dump(mode="json") if pool.search is not None else None,
        # No configuration meets the SLO at any rate (a closed-form bound; no search ran).
        "slo_unreachable": (pool.slo_unreachable.model_dump(mode="json")
                            if pool.slo_unreachable is not None else None),
        "profile": request.profile.model_dump(mode="json"),
    }


def render_json(pool: PoolPlan, request: PlanRequest) -> str:
    return json.dumps(plan_document(pool, request), indent=2) + "\n"


def render_yaml(pool: PoolPlan, request: PlanRequest) -> str:
    import yaml

    return str(yaml.safe_dump(plan_document(pool, request), sort_keys=False))


def render_args(pool: PoolPlan, request: PlanRequest) -> str:
    # The pool's own flags (the layout's, then the plan's): the same list as -o json.
    return " \\\n  ".join([f"vllm serve {pool.model_id}", *pool.vllm_args()]) + "\n"


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def render_table(pool: PoolPlan, request: PlanRequest) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=120, file=open("/dev/null", "w"))  # noqa: SIM115
    e, p = pool.expected, pool.plan
    console.print(
        f"[bold]{pool.model_id}[/] on [bold]{pool.gpu_class}[/] x "
        + (pool.layout.label if pool.layout is not None else f"TP {pool.tensor_parallel}")
        + (" (figures per GPU of one engine)" if pool.layout is not None else "") + ", "
        f"{request.weights_dtype} weights, vLLM {pool.vllm_version}"
    )
    knobs = Table(title="Plan", show_lines=False, expand=True)
    knobs.add_column("knob", style="cyan", no_wrap=True)
    knobs.add_column("value", style="bold", no_wrap=True)
    knobs.add_column("why")
    seen: set[str] = set()
    for r in pool.reasons:
        if r.knob in seen:
            continue
        seen.add(r.knob)
        knobs.add_row(r.knob, r.choice, r.message)
    console.print(knobs)

    figures = Table(title="Expected per GPU")
    figures.add_column("figure", style="cyan")
    figures.add_column("value", justify="right")
    figures.add_row("KV bytes per token", f"{e.kv_bytes_per_token:,}")
    figures.add_row("weights", _gib(e.weights_bytes_per_gpu))
    figures.add_row("non-KV (weights, activations, graphs)", _gib(e.non_kv_bytes_per_gpu))
    figures.add_row("KV cache", f"{_gib(e.kv_cache_bytes)} = {e.num_gpu_blocks:,} blocks")
    figures.add_row("KV cache tokens", f"{e.kv_cache_tokens:,}")
    figures.add_row(
        f"concurrent sequences at {e.concurrent_sequences_context_tokens:,} tokens",
        f"{e.concurrent_sequences:,}",
    )
    if e.prefix_hit_rate is not None:
        figures.add_row("predicted prefix hits (GPU / CPU tier)", f"{e.prefix_hit_rate:.1%} / "
                        f"{e.cpu_prefix_hit_rate or 0.0:.1%}")
    if e.decode_step_seconds is not None:
        figures.add_row(
            f"decode step at {p.max_num_seqs} sequences", f"{e.decode_step_seconds * 1000:.1f} ms"
        )
    console.print(figures)
    print_layouts(console, pool)
    print_tp_choice(console, pool)

    cmp_rows = dtype_comparison(request)
    if cmp_rows:
        cmp = Table(title="KV dtypes on this GPU (concurrent p95 sessions)")
        for col in ("kv-cache-dtype", "bits", "bytes/token", "scale overhead", "sessions",
                    "vs 16-bit"):
            cmp.add_column(col, justify="right" if col != "kv-cache-dtype" else "left")
        for row in cmp_rows:
            mark = " *" if row["kv_cache_dtype"] == p.kv_cache_dtype else ""
            cmp.add_row(
                row["kv_cache_dtype"] + mark, str(row["bits"]), f"{row['kv_bytes_per_token']:,}",
                f"{row['scale_overhead']:+.1%}", f"{row['concurrent_sequences']:,}",
                f"{row['vs_16bit']}x" if row["vs_16bit"] is not None else "-",
            )
        console.print(cmp)
    if pool.search is not None:
        _print_search(console, pool)
    for w in pool.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print("[dim]vllm serve flags:[/] " + " ".join(pool.vllm_args()))
    return console.export_text()


def _print_search(console: Any, pool: PoolPlan) -> None:
    """The capacity search: the chosen plan's predicted figures, then the runners-up."""
    from rich.table import Table

    s = pool.search
    assert s is not None
    line = (f"capacity search: {s.candidates} configurations passed pre-flight, "
            f"{s.simulated_requests:,} requests simulated; traffic at "
            f"{s.observed_rate_per_second:.2f} req/s needs ~{s.littles_law_sequences} "
            f"sequences in flight (Little's law)")
    console.print(line)
    console.print(f"capacity at SLO: {s.capacity_requests_per_second:.2f} req/s per replica "
                  f"(the highest rate of this traffic at which 95% of requests meet both "
                  f"targets); at the observed {s.rate_per_replica_per_second:.2f} req/s per "
                  f"replica {s.slo_attainment:.1%} meet them; replicas needed: "
                  + ("-" if s.replicas_needed is None else str(s.replicas_needed)))
    table = Table(title="Predicted on the traffic (capacity: req/s per replica at SLO; SLO "
                  "met: at the observed rate)")
    for col in ("configuration", "capacity req/s", "SLO met", "TTFT p95 s", "TPOT p95 ms",
                "why not chosen"):
        table.add_column(col, justify="left" if col in ("configuration", "why not chosen")
                         else "right")
    chosen = set(pool.plan.vllm_args())
    table.add_row("chosen", f"{s.capacity_requests_per_second:.2f}", f"{s.slo_attainment:.1%}",
                  f"{s.ttft_p95_seconds:.3f}", f"{s.tpot_p95_seconds * 1000:.1f}", "")
    for alt in s.alternatives:
        diff = " ".join(a for a in alt.vllm_args if a not in chosen) or "(same flags)"
        table.add_row(diff, f"{alt.capacity_requests_per_second:.2f}",
                      f"{alt.slo_attainment:.1%}", f"{alt.ttft_p95_seconds:.3f}",
                      f"{alt.tpot_p95_seconds * 1000:.1f}", alt.why_lost)
    console.print(table)
    if s.slo_met:
        console.print(f"SLO met: {s.slo_attainment:.1%} of requests meet both targets at the "
                      "observed rate")
    _print_front(console, pool)
    print_reuse(console, pool)


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.3f}" if x < 10 else f"${x:,.2f}"


def _print_front(console: Any, pool: PoolPlan) -> None:
    """Capacity against cost and latency over the configurations scored on the full stream."""
    from rich.table import Table

    s = pool.search
    assert s is not None
    if not s.front:
        return
    c = s.cost
    title = (f"Pareto front on {pool.gpu_class}: capacity vs cost vs latency"
             + (f" (${c.usd_per_gpu_hour:g}/GPU-hour x {c.gpus_per_replica} GPU; "
                f"{c.price_source})" if c is not None else
                " (no price for this GPU class: pass --gpu-price CLASS=USD)"))
    table = Table(title=title)
    for col in ("configuration", "capacity req/s", "output tok/s", "$/M output tok",
                "$/M good req", "TTFT p95 s", "TPOT p95 ms"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    chosen = set(pool.plan.vllm_args())
    for p in s.front:
        diff = " ".join(a for a in p.vllm_args if a not in chosen)
        if p.chosen:
            diff = "chosen" + ("" if p.on_front else " (dominated; kept by a tie rule)")
        table.add_row(diff, f"{p.capacity_requests_per_second:.2f}",
                      f"{p.output_tokens_per_second:,.0f}",
                      _money(p.cost_per_million_output_tokens_usd),
                      _money(p.cost_per_million_good_requests_usd),
                      f"{p.ttft_p95_seconds:.3f}", f"{p.tpot_p95_seconds * 1000:.1f}")
    console.print(table)


Renderer = Callable[[PoolPlan, PlanRequest], str]
# Output formats; another source (e.g. a live cluster) may register more.
RENDERERS: dict[str, Renderer] = {
    "table": render_table,
    "json": render_json,
    "yaml": render_yaml,
    "args": render_args,
}


def render(pool: PoolPlan, request: PlanRequest, fmt: str) -> str:
    return RENDERERS[fmt](pool, request)


def _models_help() -> str:
    return "Catalog models: " + ", ".join(catalog.list_models()) + ". GPU classes: " + ", ".join(
        gpus.list_gpu_classes()) + "."


def _show_disaggregated(request: PlanRequest, opts: dict[str, Any]) -> None:
    """``--disaggregate``: every prefill:decode split and co-located serving, replayed."""
    with Progress("plan", opts["progress"]) as shown:
        shown("replaying every prefill:decode split and co-located serving")
        choice = plan_disaggregated(request, opts)
    click.echo(render_disagg(choice, request, opts["output"]), nl=False)


def _priced(pool: PoolPlan, request: PlanRequest, prices: dict[str, float],
            opts: dict[str, Any]) -> PoolPlan:
    """The GPU's price (and the host memory's, when given) beside the searched plan."""
    pool = priced(pool, price_for(request.gpu.name, prices))
    if opts["host_memory_price"] is not None:
        pool = with_host_price(pool, opts["host_memory_price"],
                               f"--host-memory-price {opts['host_memory_price']:g}")
    return pool


@click.command(
    "plan",
    epilog="MODEL is a catalog id (Hugging Face id, or its last part) or a path to a "
    "config.json. Run `kvtune plan --list` to see the catalog and GPU classes.",
)
@model_option()
@gpu_option()
@tp_option(allow_auto=True)
@layout_options
@disagg_options
@weights_dtype_option()
@click.option("--context-tokens", type=click.IntRange(2, MAX_PIN_TOKENS),
              help="Session length (prompt+output). With --workload: rescales its p95.")
@click.option("--workload", type=click.Choice(PRESET_KINDS), help="Workload preset.")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Azure CSV or Mooncake JSONL trace to profile (and to replay in the "
              "capacity search).")
@click.option("--request-rate", type=finite(0, MAX_REQUEST_RATE_PER_SECOND, min_open=True,
                                            fix="pass one replica's share, RATE/REPLICAS"),
              help="Arrival rate, requests/s: with --workload or --context-tokens the capacity "
              "search replays traffic made from the profile at this rate (at most "
              f"{MAX_REQUEST_RATE_PER_SECOND:g}: above it, pass one replica's share, "
              "RATE/REPLICAS).")
@click.option("--compare-gpu", "compare_gpu", multiple=True, metavar="CLASS",
              help="Also plan the traffic on this GPU class (repeat) and rank the classes by "
              "the cost of a million requests meeting the SLO (needs --trace or "
              "--request-rate; prices from --gpu-price or the list prices).")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Replicas sharing the traffic's rate (--trace, --request-rate): each is "
              "planned on its share, and SLO at risk counts the replicas the traffic needs.")
@max_replicas_option
@click.option("--search/--no-search", default=True, show_default=True,
              help="Choose the knobs by simulated capacity at SLO when the traffic's rate is "
              "known (--trace, --request-rate); --no-search: the rules alone.")
@search_budget_options
@pin_options
@click.option("--lowest-kv-precision", type=click.Choice(["bf16", "fp8", "int8", "fp4", "int4"]),
              default="fp8", show_default=True, help="Never quantize the KV cache below this.")
@click.option("--kv-quality-report", type=click.Path(exists=True, dir_okay=False,
                                                      path_type=Path),
              help="A `kvtune quality -o` report: narrower KV dtypes are gated on it.")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The operator's model calibration (its ConfigMap kvtune-model-calibration "
              "as YAML, or its calibrations.json): plan with the correction terms of this "
              "model, GPU class, vLLM version and layout, as the operator does.")
@click.option("--max-kv-quantization-kl", type=POSITIVE,
              default=DEFAULT_MAX_KV_QUANTIZATION_KL, show_default=True,
              help="Exclude KV dtypes whose measured mean next-token KL exceeds this (nats).")
@click.option("--require-kv-measurement", is_flag=True,
              help="Keep 16-bit KV unless a measurement allows a narrower dtype.")
@click.option("--ttft-p95", type=POSITIVE,
              help="TTFT p95 SLO, seconds.")
@click.option("--tpot-p95", type=POSITIVE,
              help="TPOT p95 SLO, seconds.")
@click.option("--target-sequences", type=click.IntRange(1, MAX_PIN_SEQUENCES),
              help="Sequences that must fit at the p95 session.")
@click.option("--min-max-model-len", type=click.IntRange(1, MAX_PIN_TOKENS),
              help="max-model-len never goes below this.")
@click.option("--cpu-offload-gib", type=finite(0, MAX_PIN_OFFLOAD_GIB),
              help="CPU memory per GPU that may hold offloaded KV blocks.")
@tier_options
@click.option("--vllm-version", default=PINNED_VLLM_VERSION, show_default=True)
@click.option("--gpu-price", "gpu_price", multiple=True, metavar="CLASS=USD",
              help="Price of one GPU of a class per hour, for the cost figures of the capacity "
              "search (repeat, or comma-separate). Defaults: tuner/facts/data/gpu_prices.json "
              "(list prices with their sources; classes without one show no cost).")
@click.option("--host-memory-price", type=finite(0, 1e3, min_open=True), metavar="USD",
              help="Host memory price, USD per GiB-hour, for the CPU tier's cost (kvtune ships "
              "no default: without it the tier is not priced).")
@click.option("-o", "--output", "output", type=click.Choice([*RENDERERS, "patch"]),
              default="table", show_default=True)
@click.option("--from-cluster", metavar="NAME",
              help="With -o patch: the spec.tuning.pin patch for this InferenceDeployment's "
              "recommended plan (read from its status in the cluster).")
@click.option("--namespace", "-n", help="Namespace of --from-cluster (default: default).")
@click.option("--pool", help="With --from-cluster: pin this pool's plan (name or GPU class).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="With --from-cluster.")
@click.option("--list", "list_catalog", is_flag=True, help="List catalog models and GPU classes.")
@progress_option()
def plan(**opts: Any) -> None:
    """Plan the vLLM KV-cache configuration for one GPU pool, offline."""
    if opts.pop("list_catalog"):
        click.echo("models:\n  " + "\n  ".join(catalog.list_models()))
        click.echo("gpu classes:\n  " + "\n  ".join(gpus.list_gpu_classes())
                   + f"\n  (any other GPU: --gpu '{gpus.CUSTOM_GPU_SPEC}')")
        return
    from kvtune.cli.plan_from_cluster import handle_plan_options

    if handle_plan_options(opts):  # --from-cluster NAME -o patch (issue 6)
        return
    for required in ("model", "gpu"):
        if not opts[required]:
            raise click.UsageError(f"--{required} is required. {_models_help()}")
    budget = budget_from(opts)
    try:
        prices = parse_overrides(opts["gpu_price"], "--gpu-price")
        request = build_request(opts)
        if opts["request_rate"] is not None:
            request = request.model_copy(update={"profile": request.profile.model_copy(
                update={"request_rate_per_second": opts["request_rate"]})})
        searching = opts["search"] and (opts["trace"] is not None
                                        or opts["request_rate"] is not None)
        if opts["compare_gpu"] and (not searching or opts["output"] not in
                                    ("table", "json", "yaml")):
            raise click.UsageError("--compare-gpu compares the capacity search's cost: it needs "
                                   "--trace or --request-rate and -o table, json or yaml")
        check_tiers(opts, searching)
        others: list[tuple[str, PoolPlan | str]] = []
        ctx = click.get_current_context()
        tp_given, replicas_given = (ctx.get_parameter_source(name)
                                    != click.core.ParameterSource.DEFAULT
                                    for name in ("tp", "replicas"))
        check_disagg_options(opts, tp_given)
        if wants_disagg(opts):  # every P:D split and co-located, replayed (issue 26)
            _show_disaggregated(request, opts)
            return
        check_auto_options(opts, replicas_given)

        def laid_out(req: PlanRequest, plan_fn: Callable[..., PoolPlan]) -> PoolPlan:
            # --tp auto: the degree and replicas are chosen; --gpus-per-replica / --dp / --ep:
            # the layout is chosen (or pinned) too.
            if wants_auto(opts):
                return plan_auto(req, opts, plan_fn, price_for(req.gpu.name, prices))
            return (plan_with_layout(req, opts, plan_fn, tp_given) if wants_layout(opts)
                    else plan_fn(req))

        if searching:
            trace = load_trace(opts["trace"]) if opts["trace"] is not None else None
            # The search replays hundreds of requests per candidate: seconds of work.
            with Progress("plan", opts["progress"]) as shown:
                def by_goodput(req: PlanRequest, replicas: int | None = None) -> PoolPlan:
                    # Each DP rank is an engine serving its share, as a replica would.
                    return plan_by_goodput(
                        req, trace=trace, progress=lambda step: shown(step.text()),
                        replicas=(replicas or opts["replicas"]) * req.data_parallel,
                        budget=budget)

                pool = _priced(laid_out(request, by_goodput), request, prices, opts)
                pool = with_tiers(pool, request, trace, opts)  # --kv-tier-*: LMCache tiers
                for name in opts["compare_gpu"]:
                    other = request.model_copy(update={"gpu": gpus.get_gpu_class(name)})
                    try:
                        others.append((name, priced(laid_out(other, by_goodput),
                                                    price_for(other.gpu.name, prices))))
                    except NoFeasiblePlan as exc:
                        others.append((name, f"does not fit: {exc}"))
        else:
            pool = laid_out(request, lambda req, _replicas=1: plan_pool(req))
        # The figures beside the plan (KV dtypes) are of the layout chosen.
        text = render(pool, request_for(pool, request), opts["output"])
        if opts["compare_gpu"]:
            text = with_comparison(text, pool, others, opts["output"])
    except KVTuneError as exc:
        # Bad input (a model, GPU or pin that cannot work) exits 1; click's usage errors 2.
        raise click.ClickException(in_option_terms(exc)) from None
    click.echo(text, nl=False)
