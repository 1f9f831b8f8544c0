"""`kvtune plan --gpus-per-replica N`: the parallel layout (TP x DP x PP, +EP, +DCP) as a planned
decision (``kvtune.tuner.planner.layout_choice``), its options and how the plan shows it.

``--gpus-per-replica`` alone: every layout of N GPUs is planned and the best kept; ``--tp``,
``--dp``, ``--ep/--no-ep``, ``--dcp`` and ``--pp`` pin parts of it (PP and DCP are pinned only,
never chosen). ``--dp``, ``--ep``, ``--dcp`` or ``--pp`` without ``--gpus-per-replica`` pins the
whole layout (TP x DP x PP GPUs). Without any of them, the plan is TP alone, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.layout_choice import MAX_GPUS_PER_REPLICA, PlanFn, choose_layout
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.units import GiB

F = TypeVar("F", bound=Callable[..., Any])


def layout_options(command: F) -> F:
    """``--gpus-per-replica``, ``--dp``, ``--ep/--no-ep``, ``--dcp``, ``--pp``,
    ``--nodes-per-replica``."""
    for option in reversed((
        click.option("--gpus-per-replica", type=click.IntRange(1, MAX_GPUS_PER_REPLICA),
                     help="GPUs of one replica: kvtune chooses the layout (TP x data-parallel "
                     "attention, expert parallel for MoE) by the plan's objective; --tp, --dp "
                     "and --ep pin parts of it."),
        click.option("--dp", "--data-parallel", "dp", type=click.IntRange(min=1),
                     help="Data-parallel attention ranks per replica (vLLM "
                     "--data-parallel-size): each is an engine with its own KV cache."),
        click.option("--ep/--no-ep", "ep", default=None,
                     help="Expert parallel for MoE layers (vLLM --enable-expert-parallel)."),
        click.option("--dcp", "--decode-context-parallel", "dcp", type=click.IntRange(min=1),
                     help="Decode context parallel (MLA models; vLLM "
                     "--decode-context-parallel-size): each sequence's tokens split among this "
                     "many TP ranks. Pinned only, never chosen."),
        click.option("--pp", "--pipeline-parallel", "pp", type=click.IntRange(min=1),
                     help="Pipeline-parallel stages per engine (vLLM "
                     "--pipeline-parallel-size): each stage holds its own layers' weights and "
                     "KV; latency adds every stage. Pinned only, never chosen."),
        click.option("--nodes-per-replica", "nodes", type=click.IntRange(1, 16), default=1,
                     show_default=True,
                     help="Nodes one replica spans (the pool's nodesPerReplica): DP, or with "
                     "--pp the stages, split over them; what crosses nodes goes over the RDMA "
                     "NIC instead of NVLink."),
    )):
        command = option(command)
    return command


def wants_layout(opts: dict[str, Any]) -> bool:
    return (opts["gpus_per_replica"] is not None or opts["dp"] is not None
            or opts["ep"] is not None or opts["dcp"] is not None or opts["pp"] is not None
            or opts["nodes"] > 1)


def plan_with_layout(request: PlanRequest, opts: dict[str, Any], plan_fn: PlanFn,
                     tp_given: bool) -> PoolPlan:
    """The layout chosen (or pinned) for the request, planned with ``plan_fn``."""
    tp = opts["tp"] if tp_given or opts["gpus_per_replica"] is None else None
    pp = opts["pp"] or 1
    gpus = opts["gpus_per_replica"] or opts["tp"] * (opts["dp"] or 1) * pp
    return choose_layout(request, gpus, plan_fn, tp=tp, dp=opts["dp"], ep=opts["ep"],
                         dcp=opts["dcp"] or 1, pp=pp, nodes=opts["nodes"])


def request_for(pool: PoolPlan, request: PlanRequest) -> PlanRequest:
    """The request at the pool's chosen layout (the request itself when it has none)."""
    if pool.layout is None:
        # --tp auto: the degree chosen.
        return (request if request.tensor_parallel == pool.tensor_parallel
                else request.model_copy(update={"tensor_parallel": pool.tensor_parallel}))
    return request.with_layout(pool.layout)


def layout_rows(pool: PoolPlan) -> list[dict[str, Any]]:
    """The layouts weighed, for JSON/YAML (``layouts_considered``)."""
    return [o.model_dump(mode="json") | {"label": o.layout.label}
            for o in pool.layouts_considered]


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.3f}" if x < 10 else f"${x:,.2f}"


def print_layouts(console: Any, pool: PoolPlan) -> None:
    """The table of layouts weighed: KV capacity per GPU and per replica, and the score."""
    from rich.table import Table

    if not pool.layouts_considered:
        return
    gpus = pool.layouts_considered[0].layout.gpus
    by_goodput = pool.search is not None
    # With the capacity search and a price (cost.priced): what a million good requests cost.
    priced = any(o.cost_per_million_good_requests_usd is not None
                 for o in pool.layouts_considered)
    table = Table(title=f"Layouts of {gpus} {pool.gpu_class} GPUs per replica "
                  "(KV per replica: every DP rank is an engine with its own cache)")
    for col in ("layout", "KV copies", "weights/GPU", "KV tokens/engine", "KV tokens/replica",
                "seqs/replica", "capacity req/s" if by_goodput else "seqs in TPOT",
                "decode step", *(("$/M good req",) if priced else ())):
        table.add_column(col, justify="left" if col == "layout" else "right")
    for o in pool.layouts_considered:
        name = o.layout.label + (" *" if o.chosen else "")
        if o.refused:
            table.add_row(name, str(o.kv_copies), f"{o.weights_bytes_per_gpu / GiB:.1f} GiB",
                          "-", "-", "-", "does not fit", o.refused[:40])
            continue
        table.add_row(
            name, str(o.kv_copies), f"{o.weights_bytes_per_gpu / GiB:.1f} GiB",
            f"{o.kv_cache_tokens_per_engine:,}", f"{o.kv_cache_tokens_per_replica:,}",
            f"{o.concurrent_sequences_per_replica:,}",
            f"{o.score:.2f}" if by_goodput else f"{o.score:g}",
            "-" if o.decode_step_seconds is None else f"{o.decode_step_seconds * 1000:.1f} ms",
            *((_money(o.cost_per_million_good_requests_usd),) if priced else ()))
    console.print(table)
