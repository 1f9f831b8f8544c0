"""`kvtune plan --tp auto`: the tensor-parallel degree and the replicas chosen for the lowest
cost per good request (``kvtune.tuner.planner.tp_choice``), the degrees weighed and the front of
cost against latency across them, as a table and in ``-o json|yaml`` (``tp_choice``).

``--max-replicas`` bounds the replicas (the operator's bound is the pool's ``replicas``).
``--tp auto`` chooses TP alone (DP 1): with ``--gpus-per-replica``, ``--dp``, ``--ep`` or
``--dcp`` the layout chooser runs instead, and ``--replicas`` (the replicas sharing the rate)
is what auto chooses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvtune.tuner.facts.prices import GPUPrice
from kvtune.tuner.plan import PoolPlan, TPOption
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.tp_choice import BY_SEQUENCES, choose_tensor_parallel
from kvtune.tuner.units import GiB

F = TypeVar("F", bound=Callable[..., Any])
TP_AUTO = "auto"
# Plans one replica of the request's TP, with this many replicas sharing the rate.
ReplicaPlanFn = Callable[[PlanRequest, int], PoolPlan]


def max_replicas_option(command: F) -> F:
    return click.option(
        "--max-replicas", type=click.IntRange(min=1),
        help="With --tp auto: the most replicas kvtune may choose (default: as many as the "
        "rate needs).")(command)


def wants_auto(opts: dict[str, Any]) -> bool:
    return bool(opts["tp"] == TP_AUTO)


def check_auto_options(opts: dict[str, Any], replicas_given: bool) -> None:
    """Usage errors for what ``--tp auto`` does not combine with."""
    if not wants_auto(opts):
        if opts["max_replicas"] is not None:
            raise click.UsageError("--max-replicas bounds the replicas --tp auto chooses; "
                                   "pass --tp auto, or drop --max-replicas")
        return
    for name in ("gpus_per_replica", "dp", "ep", "dcp", "pp"):
        if opts[name] is not None:
            flag = "--" + name.replace("_", "-")
            raise click.UsageError(f"--tp auto chooses TP alone (one engine per replica); "
                                   f"drop {flag}, or pin --tp with {flag}")
    if opts["nodes"] > 1:
        raise click.UsageError("--tp auto chooses TP alone, on one node; drop "
                               "--nodes-per-replica, or pin --tp with it")
    if replicas_given:
        raise click.UsageError("--tp auto chooses the replicas; drop --replicas "
                               "(--max-replicas N bounds them)")


def plan_auto(request: PlanRequest, opts: dict[str, Any], plan_fn: ReplicaPlanFn,
              price: GPUPrice | None) -> PoolPlan:
    return choose_tensor_parallel(request, plan_fn, price=price,
                                  max_replicas=opts["max_replicas"])


def tp_rows(pool: PoolPlan) -> dict[str, Any]:
    """The choice for JSON/YAML (``tp_choice``)."""
    assert pool.tp_choice is not None
    return pool.tp_choice.model_dump(mode="json")


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


_SEQUENCE_COLUMNS = ("TP", "weights/GPU", "KV tokens/replica", "seqs in TPOT/replica",
                     "GPUs per seq", "$/replica-hour", "why not")
_CAPACITY_COLUMNS = ("TP", "weights/GPU", "req/s per replica", "replicas", "GPUs",
                     "$/M good req", "$/M req at rate", "why not")


def _row(o: TPOption, by: str) -> list[str]:
    name = f"TP{o.tensor_parallel}" + (" *" if o.chosen else "")
    weights = f"{o.weights_bytes_per_gpu / GiB:.1f} GiB"
    width = len(_SEQUENCE_COLUMNS if by == BY_SEQUENCES else _CAPACITY_COLUMNS)
    if o.refused:
        return [name, weights, *["-"] * (width - 3), o.refused[:60]]
    if by == BY_SEQUENCES:
        per = o.tensor_parallel / o.capacity_per_replica if o.capacity_per_replica else None
        return [name, weights, f"{o.kv_cache_tokens_per_replica:,}",
                f"{o.capacity_per_replica:g}", "-" if per is None else f"{per:.4f}",
                _money(o.usd_per_replica_hour), ""]
    return [name, weights, f"{o.capacity_per_replica:.2f}",
            "-" if o.replicas_needed is None else str(o.replicas_needed),
            "-" if o.gpus_needed is None else str(o.gpus_needed),
            _money(o.cost_per_million_good_requests_usd),
            _money(o.cost_per_million_requests_at_rate_usd),
            "" if o.replicas_needed is not None else "no rate meets the SLO"]


def print_tp_choice(console: Any, pool: PoolPlan) -> None:
    """The degrees weighed (capacity, replicas, GPUs, cost), then the front across them."""
    from rich.table import Table

    c = pool.tp_choice
    if c is None:
        return
    rate = f" at {c.rate_per_second:.4g} req/s" if c.rate_per_second else " (no rate)"
    price = f", ${c.usd_per_gpu_hour:g}/GPU-hour" if c.usd_per_gpu_hour is not None else ""
    table = Table(title=f"Tensor parallel on {pool.gpu_class}{rate}{price}: chosen TP"
                  f"{pool.tensor_parallel}" + (f" x {c.replicas} replica(s)"
                                               if c.replicas is not None else ""))
    for col in (_SEQUENCE_COLUMNS if c.by == BY_SEQUENCES else _CAPACITY_COLUMNS):
        table.add_column(col, justify="left" if col in ("TP", "why not") else "right")
    for o in c.options:
        table.add_row(*_row(o, c.by))
    console.print(table)
    if not c.front:
        return
    front = Table(title="Pareto front across TP: GPUs (cost) per good request vs latency "
                  "(each degree at one replica carrying the whole rate)")
    for col in ("TP", "configuration", "capacity req/s", "GPUs per req/s", "$/M good req",
                "TTFT p95 s", "TPOT p95 ms"):
        front.add_column(col, justify="left" if col in ("TP", "configuration") else "right")
    chosen = set(pool.plan.vllm_args())
    for p in c.front:
        tp = p.tensor_parallel or 1
        per = tp / p.capacity_requests_per_second if p.capacity_requests_per_second else None
        # The flags that differ from the chosen plan's (the TP column says the degree).
        diff = ("chosen" + ("" if p.on_front else " (dominated at one replica)")
                if p.chosen else (
            " ".join(a for a in p.vllm_args if a not in chosen) or "(same flags)"))
        front.add_row(f"TP{tp}" + (" *" if p.chosen else ""), diff,
                      f"{p.capacity_requests_per_second:.2f}",
                      "-" if per is None else f"{per:.3f}",
                      _money(p.cost_per_million_good_requests_usd),
                      f"{p.ttft_p95_seconds:.3f}", f"{p.tpot_p95_seconds * 1000:.1f}")
    console.print(front)
