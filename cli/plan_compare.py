"""`kvtune plan --compare-gpu CLASS`: the same traffic planned on other GPU classes (each at its
best TP under ``--tp auto``), ranked by what a million requests meeting the SLO cost
(``kvtune.tuner.planner.cost.rank_by_cost``), as rows in ``-o json|yaml`` (``gpu_comparison``)
or a table after the plan's."""

from __future__ import annotations

import json
from typing import Any

from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.cost import rank_by_cost


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.3f}" if x < 10 else f"${x:,.2f}"


def gpu_comparison(pool: PoolPlan, others: list[tuple[str, PoolPlan | str]]
                   ) -> list[dict[str, Any]]:
    """The GPU classes planned for the same traffic, cheapest per million requests meeting
    the SLO first (``cost.rank_by_cost``); classes that do not fit last, with why."""
    planned = [pool, *(p for _, p in others if isinstance(p, PoolPlan))]
    rows: list[dict[str, Any]] = []
    for p in rank_by_cost(planned):
        s = p.search
        c = s.cost if s is not None else None
        tpc = p.tp_choice
        rows.append({
            "gpu_class": p.gpu_class, "tensor_parallel": p.tensor_parallel,
            # --tp auto: the degree and replicas chosen for the class, and what serving the
            # rate on them costs.
            **({"replicas": tpc.replicas, "cost_per_million_requests_at_rate_usd": next(
                o.cost_per_million_requests_at_rate_usd for o in tpc.options if o.chosen)}
               if tpc is not None else {}),
            "layout": p.layout.label if p.layout is not None else None,
            "usd_per_gpu_hour": c.usd_per_gpu_hour if c else None,
            "price_source": c.price_source if c else None,
            "capacity_requests_per_second": s.capacity_requests_per_second if s else None,
            "slo_attainment": s.slo_attainment if s else None,
            "slo_met": s.slo_met if s else None,
            "replicas_needed": s.replicas_needed if s else None,
            "cost_per_million_output_tokens_usd":
                c.cost_per_million_output_tokens_usd if c else None,
            "cost_per_million_good_requests_usd":
                c.cost_per_million_good_requests_usd if c else None,
            "vllm_args": p.vllm_args(),
            # --gpus-per-replica: every layout weighed on this class, its capacity and cost.
            **({"layouts": _layouts(p)} if p.layouts_considered else {}),
        })
    rows += [{"gpu_class": name, "refused": why} for name, why in others
             if isinstance(why, str)]
    return rows


def _layouts(p: PoolPlan) -> list[dict[str, Any]]:
    """The layouts weighed on one class: capacity at SLO per replica and cost, or why not."""
    return [{"label": o.layout.label, "chosen": o.chosen,
             "kv_cache_tokens_per_replica": o.kv_cache_tokens_per_replica,
             "capacity_requests_per_second": o.score if o.refused is None else None,
             "usd_per_replica_hour": o.usd_per_replica_hour,
             "cost_per_million_good_requests_usd": o.cost_per_million_good_requests_usd,
             "refused": o.refused} for o in p.layouts_considered]


def _layout_table(rows: list[dict[str, Any]]) -> Any:
    """The layouts weighed per class (``--gpus-per-replica``), None when none were."""
    from rich.table import Table

    if not any("layouts" in r for r in rows):
        return None
    table = Table(title="Layouts weighed per GPU class (* chosen)")
    for col in ("GPU class", "layout", "KV tokens/replica", "capacity req/s", "$/replica-hour",
                "$/M good req"):
        table.add_column(col, justify="left" if col in ("GPU class", "layout") else "right")
    for r in rows:
        for o in r.get("layouts", []):
            name = o["label"] + (" *" if o["chosen"] else "")
            if o["refused"]:
                table.add_row(r["gpu_class"], name, "-", "does not fit", "-", o["refused"][:40])
                continue
            hourly = o["usd_per_replica_hour"]
            table.add_row(r["gpu_class"], name, f"{o['kv_cache_tokens_per_replica']:,}",
                          f"{o['capacity_requests_per_second']:.2f}",
                          "-" if hourly is None else f"${hourly:,.2f}",
                          _money(o["cost_per_million_good_requests_usd"]))
    return table


def with_comparison(text: str, pool: PoolPlan, others: list[tuple[str, PoolPlan | str]],
                    fmt: str) -> str:
    rows = gpu_comparison(pool, others)
    if fmt in ("json", "yaml"):
        import yaml

        doc = json.loads(text) if fmt == "json" else yaml.safe_load(text)
        doc["gpu_comparison"] = rows
        return (json.dumps(doc, indent=2) + "\n" if fmt == "json"
                else str(yaml.safe_dump(doc, sort_keys=False)))
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=120, file=open("/dev/null", "w"))  # noqa: SIM115
    table = Table(title="GPU classes for this traffic, cheapest per million requests meeting "
                  "the SLO first")
    for col in ("GPU class", "$/GPU-hour", "capacity req/s", "SLO met", "replicas",
                "$/M output tok", "$/M good req"):
        table.add_column(col, justify="left" if col == "GPU class" else "right")
    for r in rows:
        if "refused" in r:
            table.add_row(r["gpu_class"], "-", "-", "-", "-", "-", r["refused"][:60])
            continue
        # --tp auto: the replicas chosen, and the rate's cost on them.
        needed = r.get("replicas", r["replicas_needed"])
        table.add_row(
            f"{r['gpu_class']} x {r['layout'] or 'TP ' + str(r['tensor_parallel'])}",
            "-" if r["usd_per_gpu_hour"] is None else f"${r['usd_per_gpu_hour']:g}",
            f"{r['capacity_requests_per_second']:.2f}", f"{r['slo_attainment']:.1%}",
            "-" if needed is None else str(needed),
            _money(r["cost_per_million_output_tokens_usd"]),
            _money(r.get("cost_per_million_requests_at_rate_usd")
                   or r["cost_per_million_good_requests_usd"]))
    console.print(table)
    layouts = _layout_table(rows)
    if layouts is not None:
        console.print(layouts)
    return text + console.export_text()
