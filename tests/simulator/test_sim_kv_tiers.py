"""KV tiers beyond the GPU in the simulator (issue 27 item 1): each tier loads over its own
link (``facts/kv_tiers.py``), holds what its size holds, and the tier stage weighs the kinds
by capacity at SLO, the cheaper within the tie."""

from __future__ import annotations

import pytest
from test_sim_goodput_offload import _request, _round_robin_sessions

from kvtune.tuner.facts import kv_tiers
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan_tier import KVTier
from kvtune.tuner.planner.planning import plan_pool
from kvtune.tuner.simulator import engine, tier_choice
from kvtune.tuner.simulator.tier_choice import TierOption, TierResult

PAGE = 1 << 20
REMOTE = "lm://lmcache:65432"


def test_each_tier_loads_over_its_own_link() -> None:
    gpu = get_gpu_class("H100")
    host = gpu.host_link_bytes_per_second
    assert host
    per_block = {kind: kv_tiers.tier_link(kind, host, gpu.host_link_source, 1)
                 for kind in kv_tiers.TIER_KINDS}
    seconds = {k: link.seconds_per_block(PAGE, 1) for k, link in per_block.items() if link}
    assert seconds["native-cpu"] == seconds["lmcache-cpu"] == pytest.approx(PAGE / host)
    assert seconds["lmcache-disk"] == pytest.approx(
        PAGE / kv_tiers.NVME_READ_BYTES_PER_SECOND + PAGE / host)
    # One GPU's share of the node's in-band NIC (50 GB/s over 8 GPUs), then PCIe.
    assert seconds["lmcache-remote"] == pytest.approx(PAGE / (50e9 / 8) + PAGE / host)
    assert seconds["native-cpu"] < seconds["lmcache-disk"] < seconds["lmcache-remote"]
    # Eight ranks read eight shares off one drive, and get the whole NIC between them.
    disk8 = kv_tiers.tier_link("lmcache-disk", host, "", 8)
    remote8 = kv_tiers.tier_link("lmcache-remote", host, "", 8)
    assert disk8 and remote8
    assert disk8.seconds_per_block(PAGE, 8) == pytest.approx(
        8 * PAGE / kv_tiers.NVME_READ_BYTES_PER_SECOND + PAGE / host)
    assert remote8.seconds_per_block(PAGE, 8) == pytest.approx(8 * PAGE / 50e9 + PAGE / host)
    assert kv_tiers.tier_link("lmcache-disk", None, "", 1) is None


def test_an_lmcache_tier_holds_its_size_in_blocks() -> None:
    request = _request("L40S", 64)
    plan = plan_pool(request).plan
    tier = KVTier(kind="lmcache-disk", size_gib=100.0, buffer_gib=5.0)
    sim = engine.simulated_plan(request, plan, "disk", tier=tier)
    bare = engine.simulated_plan(request, plan.with_offload(None), "off")
    page = sim.cost.kv_bytes_per_token * plan.block_size  # one block of one rank (TP 1)
    assert sim.engine.cpu_offload_blocks == (100 * 2**30) // page
    assert bare.engine.cpu_offload_blocks == 0
    assert sim.engine.offload_load_seconds_per_block > 5 * page / 64e9


def _result(label: str, capacity: float, **kw: float | KVTier | None) -> TierResult:
    from kvtune.tuner.planner.capacity import GoodputScore

    score = GoodputScore(1.0, True, 1.0, 1.0, 0.01, 10, prefix_hit_rate=0.1, cpu_hit_rate=0.2)
    return TierResult(TierOption(**kw), capacity, score)  # type: ignore[arg-type]


def test_within_the_tie_less_host_memory_wins_then_less_disk() -> None:
    off = _result("off", 1.0)
    native = _result("native", 1.50, native_gib=64.0)
    disk = _result("disk", 1.52, tier=KVTier(kind="lmcache-disk", size_gib=500.0,
                                             buffer_gib=5.0))
    remote = _result("remote", 1.53, tier=KVTier(kind="lmcache-remote", size_gib=500.0,
                                                 buffer_gib=5.0, remote_url=REMOTE))
    assert tier_choice.chosen([off, native, disk, remote], 0.02) is disk
    assert tier_choice.chosen([off, native, remote], 0.02) is native
    assert tier_choice.chosen([off, _result("n", 1.01, native_gib=8.0)], 0.02) is off
    reason = tier_choice.explain([off, native, disk, remote], disk, 0.02)
    assert reason.knob == "kv-tier" and reason.choice == "lmcache-disk 500 GiB"
    assert "+52%" in reason.message and "lmcache-remote 500 GiB: 1.53 req/s" in reason.message


def test_with_prices_the_tie_break_weighs_dollars_of_memory_and_disk() -> None:
    native = _result("native", 1.50, native_gib=64.0)
    disk = _result("disk", 1.52, tier=KVTier(kind="lmcache-disk", size_gib=500.0,
                                             buffer_gib=5.0))
    cheap_disk = tier_choice.TierPrices(host_usd_per_gib_hour=0.004, disk_usd_per_gib_hour=2e-4)
    dear_disk = tier_choice.TierPrices(host_usd_per_gib_hour=0.004, disk_usd_per_gib_hour=1e-3)
    # 64 GiB of host memory: $0.256/h; 5 GiB of buffer + 500 GiB of disk: $0.12/h or $0.52/h.
    assert tier_choice.chosen([native, disk], 0.02, cheap_disk) is disk
    assert tier_choice.chosen([native, disk], 0.02, dear_disk) is native
    # Without a host price the GiB order holds (less host memory wins), disk price or not.
    assert tier_choice.chosen([native, disk], 0.02,
                              tier_choice.TierPrices(disk_usd_per_gib_hour=1e-3)) is disk
    reason = tier_choice.explain([_result("off", 1.0), native, disk], native, 0.02, dear_disk)
    assert "$0.256/h of memory and disk" in reason.message
    assert "disk $0.001/GiB-h" in reason.message


@pytest.mark.slow
def test_a_slower_link_never_serves_more_and_a_tier_pays_on_reuse_beyond_the_gpu() -> None:
    """64 sessions whose histories come back after more than an L40S's KV cache: a tier of
    the same size pays on every medium, and a slower medium never beats a faster one."""
    request = _request("L40S", 64)
    stream = _round_robin_sessions()
    plan = plan_pool(request).plan.with_offload(None)
    options = [TierOption(native_gib=64.0),
               TierOption(tier=KVTier(kind="lmcache-cpu", size_gib=64.0)),
               TierOption(tier=KVTier(kind="lmcache-disk", size_gib=64.0, buffer_gib=5.0)),
               TierOption(tier=KVTier(kind="lmcache-remote", size_gib=64.0, buffer_gib=5.0,
                                      remote_url=REMOTE))]
    results = tier_choice.weigh(request, plan, options, stream, tolerance=0.02)
    caps = [r.capacity_requests_per_second for r in results]
    off, native, cpu, disk, remote = caps
    assert native > off * 1.02 and disk > off * 1.02
    assert cpu <= native * 1.03  # the same size over the same link (native rounds to pages)
    assert disk <= cpu * 1.02 and remote <= disk * 1.02
    hits = [r.at_observed.cpu_hit_rate for r in results]
    assert hits[0] == 0.0 and min(hits[1:]) > 0.1
    pool = tier_choice.with_tier(plan_pool(request), tier_choice.chosen(results, 0.02),
                                 tier_choice.explain(results, tier_choice.chosen(results, 0.02),
                                                     0.02))
    assert pool.expected.cpu_prefix_hit_rate and pool.expected.cpu_prefix_hit_rate > 0.1
    assert [r.knob for r in pool.reasons].count("kv-tier") == 1
