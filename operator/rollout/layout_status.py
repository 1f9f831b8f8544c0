"""The layouts a ``gpusPerReplica`` pool's plan weighed, as status (``status.pools[].layouts``):
per layout its KV tokens and sequences per replica, the figure it was ranked by (capacity at
SLO with the capacity search, else sequences within the TPOT target), its cost where the GPU
class has a price, or why it does not fit; the chosen one marked. So ``kubectl get -o yaml``
shows why DP8+EP beat TP8."""

from __future__ import annotations

from kvtune.operator.api import LayoutOptionStatus
from kvtune.operator.api.pool_status import MAX_LAYOUTS_IN_STATUS
from kvtune.tuner.plan import LayoutOption, PoolPlan

_REFUSED_CHARS = 200  # the status field's bound (LayoutOptionStatus.refused)


def _sig(x: float | None) -> float | None:
    # Status is compared before it is written: four significant digits keep a re-plan with
    # the same figures from rewriting it for float noise (as gpu_prices.cost_status).
    return None if x is None else float(f"{x:.4g}")


def _one(o: LayoutOption, by_goodput: bool) -> LayoutOptionStatus:
    fits = o.refused is None
    return LayoutOptionStatus(
        layout=o.layout.label, chosen=o.chosen, kv_copies=o.kv_copies,
        weights_bytes_per_gpu=o.weights_bytes_per_gpu,
        kv_cache_tokens_per_replica=o.kv_cache_tokens_per_replica,
        concurrent_sequences_per_replica=o.concurrent_sequences_per_replica,
        capacity_requests_per_second=_sig(o.score) if fits and by_goodput else None,
        sequences_within_tpot=round(o.score) if fits and not by_goodput else None,
        usd_per_replica_hour=_sig(o.usd_per_replica_hour),
        cost_per_million_good_requests_usd=_sig(o.cost_per_million_good_requests_usd),
        refused=None if o.refused is None else o.refused[:_REFUSED_CHARS])


def layouts_status(pool_plan: PoolPlan) -> list[LayoutOptionStatus]:
    """The layouts weighed, the chosen one always among them (a list over the cap keeps the
    best-ranked); empty when none was weighed (a pinned layout, TP alone)."""
    options = list(pool_plan.layouts_considered)
    if len(options) > MAX_LAYOUTS_IN_STATUS:
        ranked = sorted(options, key=lambda o: (o.chosen, o.refused is None, o.score),
                        reverse=True)[:MAX_LAYOUTS_IN_STATUS]
        options = [o for o in options if o in ranked]  # in the planner's order
    by_goodput = pool_plan.search is not None
    return [_one(o, by_goodput) for o in options]


# The planner names the layout's parts as the CLI does; the user wrote the pool's fields.
_LAYOUT_TERMS = (("decode_context_parallel=", "pools[].decodeContextParallel="),
                 ("drop --dcp", "drop decodeContextParallel"), ("--dcp", "decodeContextParallel"))


def layout_terms(text: str) -> str:
    """``text`` (a planner error) with the layout's CLI names in the spec's spelling."""
    for cli, spec in _LAYOUT_TERMS:
        text = text.replace(cli, spec)
    return text
