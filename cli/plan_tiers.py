"""``kvtune plan``'s tier options (issue 27 item 1): with ``--kv-tier-disk-gib`` or
``--kv-tier-remote-url`` the searched plan's tier beyond the GPU is chosen among none, vLLM's
native CPU tier, and LMCache's CPU, local-disk and remote tiers, each replayed over its own
link on the search's stream (``tuner/simulator/tier_choice.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from kvtune.cli.params import POSITIVE
from kvtune.tuner.facts import kv_tiers
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.plan_tier import KVTier, lmcache_env
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.planner.search_settings import CAPACITY_TIE
from kvtune.tuner.traces import Trace

F = Callable[..., Any]


def tier_options(f: F) -> F:
    """The tier options, on ``kvtune plan``."""
    f = click.option("--disk-price", type=POSITIVE, metavar="USD",
                     help="USD per GiB-hour of local disk: with --host-memory-price, the tier "
                     "tie-break weighs dollars of memory and disk, not GiB.")(f)
    f = click.option("--kv-tier-remote-gib", type=POSITIVE, default=1024.0, show_default=True,
                     help="With --kv-tier-remote-url: GiB of the remote store one replica "
                     "may fill.")(f)
    f = click.option("--kv-tier-remote-url", metavar="URL",
                     help="Weigh an LMCache remote tier at this store (lm://host:port).")(f)
    f = click.option("--kv-tier-disk-gib", type=POSITIVE,
                     help="Weigh an LMCache local-disk tier of this many GiB per replica "
                     "(an emptyDir on the node's disk) beside the CPU tiers.")(f)
    return f


def wanted(opts: dict[str, Any]) -> bool:
    return opts["kv_tier_disk_gib"] is not None or opts["kv_tier_remote_url"] is not None


def check(opts: dict[str, Any], searching: bool) -> None:
    """Refuse tier options the command cannot weigh, before any search runs."""
    if not wanted(opts):
        return
    if not searching:
        raise click.UsageError("--kv-tier-disk-gib / --kv-tier-remote-url weigh tiers on the "
                               "capacity search's stream: add --trace or --request-rate")
    if opts["replicas"] != 1 or opts.get("dp") or opts.get("ep"):
        raise click.UsageError("--kv-tier-disk-gib / --kv-tier-remote-url weigh one replica "
                               "of a plain TP plan: drop --replicas, --dp and --ep")
    url = opts["kv_tier_remote_url"]
    if url is not None and not url.startswith(("lm://", "redis://", "mooncakestore://")):
        raise click.BadParameter(f"{url!r}: name the store as LMCache does, e.g. "
                                 "lm://host:port", param_hint="--kv-tier-remote-url")


def _options(pool: PoolPlan, opts: dict[str, Any], cpu_gib: float) -> list[Any]:
    from kvtune.tuner.simulator.tier_choice import TierOption

    buffer = kv_tiers.LMCACHE_BUFFER_GIB_PER_RANK * pool.tensor_parallel
    out = []
    if cpu_gib > 0:
        out += [TierOption(native_gib=cpu_gib),
                TierOption(tier=KVTier(kind="lmcache-cpu", size_gib=cpu_gib))]
    if opts["kv_tier_disk_gib"] is not None:
        out.append(TierOption(tier=KVTier(kind="lmcache-disk", size_gib=opts["kv_tier_disk_gib"],
                                          buffer_gib=buffer)))
    if opts["kv_tier_remote_url"] is not None:
        out.append(TierOption(tier=KVTier(
            kind="lmcache-remote", size_gib=opts["kv_tier_remote_gib"], buffer_gib=buffer,
            remote_url=opts["kv_tier_remote_url"])))
    return out


def with_tiers(pool: PoolPlan, request: PlanRequest, trace: Trace | None,
               opts: dict[str, Any]) -> PoolPlan:
    """``pool`` with the tier that pays (unchanged without a tier option)."""
    if not wanted(opts) or pool.layout is not None:
        return pool
    from kvtune.tuner.simulator import tier_choice
    from kvtune.tuner.simulator.goodput_search import traffic

    # The native CPU tier at the size the search chose, else at the policy's budget.
    cpu_gib = float(pool.plan.kv_offloading_size_gib
                    or request.policy.cpu_offload_budget_bytes / 2**30)
    stream = traffic(request, trace=trace)
    results = tier_choice.weigh(request, pool.plan.with_offload(None),
                                _options(pool, opts, cpu_gib), stream)
    prices = tier_choice.TierPrices(host_usd_per_gib_hour=opts.get("host_memory_price"),
                                    disk_usd_per_gib_hour=opts.get("disk_price"))
    pick = tier_choice.chosen(results, CAPACITY_TIE, prices)
    return tier_choice.with_tier(pool, pick,
                                 tier_choice.explain(results, pick, CAPACITY_TIE, prices))


def tier_document(pool: PoolPlan) -> dict[str, Any]:
    """``-o json``'s ``kv_tier``: the tier and the environment its pod runs with."""
    assert pool.kv_tier is not None
    return {**pool.kv_tier.model_dump(mode="json"),
            "env": lmcache_env(pool.kv_tier, pool.tensor_parallel),
            "lmcache_version": kv_tiers.LMCACHE_VERSION}
