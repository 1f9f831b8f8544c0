"""``kvtune plan``'s tier options (issue 27 item 1): with ``--kv-tier-disk-gib`` or
``--kv-tier-remote-url`` the searched plan's tier beyond the GPU is chosen among none, vLLM's
native CPU tier, and LMCache's CPU, local-disk and remote tiers, each replayed over its own
link on the search's stream (``tuner/simulator/tier_choice.py``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import click

from kvtune.cli.params import POSITIVE
from kvtune.tuner.facts import kv_tiers
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.plan_tier import lmcache_env
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.traces import Trace

F = Callable[..., Any]


def tier_options(f: F) -> F:
    """The tier options, on ``kvtune plan``."""
    f = click.option("--disk-price", type=POSITIVE, metavar="USD",
                     help="USD per GiB-hour of local disk: with --host-memory-price, the tier "
                     "tie-break weighs dollars of memory and disk, not GiB.")(f)
    f = click.option("--kv-tier-remote-gib", type=POSITIVE,
                     default=kv_tiers.LMCACHE_REMOTE_DEFAULT_GIB, show_default=True,
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
    if url is not None and not re.match(kv_tiers.LMCACHE_REMOTE_URL_PATTERN, url):
        raise click.BadParameter(f"{url!r}: {kv_tiers.LMCACHE_REMOTE_URL_FIX}",
                                 param_hint="--kv-tier-remote-url")


def with_tiers(pool: PoolPlan, request: PlanRequest, trace: Trace | None,
               opts: dict[str, Any]) -> PoolPlan:
    """``pool`` with the tier that pays (unchanged without a tier option)."""
    if not wanted(opts) or pool.layout is not None:
        return pool
    from kvtune.tuner.simulator import tier_choice
    from kvtune.tuner.simulator.goodput_search import traffic

    allowance = tier_choice.TierAllowance(disk_gib=opts["kv_tier_disk_gib"],
                                          remote_url=opts["kv_tier_remote_url"],
                                          remote_gib=opts["kv_tier_remote_gib"])
    prices = tier_choice.TierPrices(host_usd_per_gib_hour=opts.get("host_memory_price"),
                                    disk_usd_per_gib_hour=opts.get("disk_price"))
    return tier_choice.choose(pool, request, traffic(request, trace=trace), allowance, prices)


def tier_document(pool: PoolPlan) -> dict[str, Any]:
    """``-o json``'s ``kv_tier``: the tier and the environment its pod runs with."""
    assert pool.kv_tier is not None
    return {**pool.kv_tier.model_dump(mode="json"),
            "env": lmcache_env(pool.kv_tier, pool.tensor_parallel),
            "lmcache_version": kv_tiers.LMCACHE_VERSION}
