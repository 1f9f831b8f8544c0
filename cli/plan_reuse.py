"""``kvtune plan``'s table of what prefix reuse saves and the CPU tier sizes weighed
(``SearchSummary.reuse``, ``tuner/planner/reuse_money.py``)."""

from __future__ import annotations

from typing import Any

from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.decide_offload_size import capacity_text


def _usd(x: float) -> str:
    return f"${x:,.2f}"


def reuse_lines(pool: PoolPlan) -> list[str]:
    """The money lines (empty without reuse figures)."""
    s = pool.search
    r = s.reuse if s is not None else None
    if r is None:
        return []
    money = (f" = {_usd(r.usd_saved_per_day)}/day at {r.gpu_price_source}"
             if r.usd_saved_per_day is not None else
             " (no price for this GPU class: pass --gpu-price CLASS=USD)")
    lines = [
        f"prefix reuse (predicted at the observed rate): GPU prefix cache hits "
        f"{r.gpu_prefix_hit_rate:.1%} of prompt tokens, CPU tier "
        f"{r.cpu_prefix_hit_rate:.1%}; {r.cached_prompt_tokens_per_day:,.0f} cached prompt "
        f"tokens/day save {r.prefill_gpu_seconds_saved_per_day:,.0f} prefill GPU-seconds/day"
        f"{money} (compute of the cached tokens; attention left out, a floor)",
    ]
    if r.cpu_tier_gib_per_replica:
        cost = (f"{_usd(r.cpu_tier_usd_per_day)}/day ({r.cpu_tier_price_source})"
                if r.cpu_tier_usd_per_day is not None else
                "not priced (kvtune ships no host-memory price; pass --host-memory-price "
                "USD per GiB-hour)")
        lines.append(f"CPU tier: {r.cpu_tier_gib_per_replica:g} GiB of host memory per "
                     f"replica; cost {cost}")
    return lines


def print_reuse(console: Any, pool: PoolPlan) -> None:
    """The money lines, then the CPU tier sizes the search weighed."""
    from rich.table import Table

    for line in reuse_lines(pool):
        console.print(line)
    s = pool.search
    if s is None or s.reuse is None or not s.reuse.tier_sizes:
        return
    table = Table(title="CPU tier sizes weighed (--kv-offloading-size, GiB across TP ranks; "
                  "capacity: req/s per replica at SLO; hits: of prompt tokens at the observed "
                  "rate)")
    for col in ("size GiB", "from", "capacity req/s", "GPU hits", "CPU hits", "chosen"):
        table.add_column(col, justify="left" if col == "from" else "right")
    for t in s.reuse.tier_sizes:
        table.add_row(f"{t.size_gib:g}" if t.size_gib else "off", t.basis,
                      capacity_text(t), f"{t.gpu_prefix_hit_rate:.1%}",
                      f"{t.cpu_prefix_hit_rate:.1%}", "*" if t.chosen else "")
    console.print(table)


__all__ = ["print_reuse", "reuse_lines"]
