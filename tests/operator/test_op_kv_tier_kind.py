"""The operator chooses the KV tier kind (issue 27): ``spec.tuning.kvTiers`` allows LMCache's
disk and remote tiers, refused in one line when the store is misnamed; the plan step weighs
the kinds allowed through the CLI's ``tier_choice`` (a disk allowance gets the disk tier
where it serves as much as host memory with less of it); status says which tier and why;
the render mounts the disk."""

from __future__ import annotations

from typing import Any

import pytest
from op_samples import make_pool_plan
from pydantic import ValidationError
from test_op_status_round_trip import through_api

from kvtune.operator.api import InferenceDeploymentSpec, KVTierStatus, PoolStatus, ReuseStatus
from kvtune.operator.render.objects import RenderInput, plan_hash, render_pool
from kvtune.operator.rollout import plan as plan_stage
from kvtune.operator.rollout import tier_stage
from kvtune.operator.search import reuse_summary
from kvtune.tuner.facts import kv_tiers
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.plan_tier import KVTier
from kvtune.tuner.planner.planning import plan_pool
from kvtune.tuner.planner.presets import preset_profile
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.simulator.prefix import Segment, shareable_prefix_tokens
from kvtune.tuner.simulator.workload import SimRequest

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RATE = 1.5


def _spec(kv_tiers_: dict[str, Any] | None, **pool: Any) -> InferenceDeploymentSpec:
    tuning: dict[str, Any] = {"mode": "auto", "cpuOffloadGiB": 64}
    if kv_tiers_ is not None:
        tuning["kvTiers"] = kv_tiers_
    return InferenceDeploymentSpec.model_validate({
        "model": {"name": MODEL}, "workload": {"profile": "chat"},
        "slo": {"ttftP95": "3s", "tpotP95": "100ms"},
        "pools": [{"gpuClass": "L40S", "name": "l40s", "replicas": 1, **pool}],
        "tuning": tuning})


def _request(spec: InferenceDeploymentSpec) -> PlanRequest:
    profile = preset_profile("chat").model_copy(update={"request_rate_per_second": RATE})
    return plan_stage.plan_request(spec, spec.pools[0], get_model(MODEL), profile,
                                   plan_stage.policy_for(spec))


def _sessions(sessions: int = 64, turns: int = 4, turn_tokens: int = 2500
              ) -> tuple[SimRequest, ...]:
    """Sessions taking turns: each turn re-sends its whole history, which comes back after
    every other session's turn (~64 x 6,000 tokens later): beyond an L40S's KV cache, inside
    64 GiB of any tier (as tests/simulator/test_sim_goodput_offload.py)."""
    rows: list[tuple[float, int, tuple[Segment, ...]]] = []
    for turn in range(turns):
        for s in range(sessions):
            segs = tuple((1 + s * turns + t, turn_tokens) for t in range(turn + 1))
            rows.append((len(rows) / RATE, turn_tokens * (turn + 1), segs))
    shareable = shareable_prefix_tokens([segs for _, _, segs in rows])
    return tuple(
        SimRequest(request_id=i, arrival_seconds=a, prompt_tokens=p, output_tokens=100,
                   segments=(*segs, (10_000 + i, 100)), shareable_tokens=shareable[i])
        for i, (a, p, segs) in enumerate(rows))


def test_a_remote_store_is_named_as_lmcache_parses_it_in_one_line() -> None:
    with pytest.raises(ValidationError) as refused:
        _spec({"remoteUrl": "http://cache:80"})
    line = next(x for x in str(refused.value).splitlines() if "remoteUrl" in x)
    assert "spec.tuning.kvTiers.remoteUrl='http://cache:80'" in line
    assert "lm://host:port" in line
    with pytest.raises(ValidationError, match=r"set spec\.tuning\.kvTiers\.remoteUrl"):
        _spec({"remoteGiB": 64})
    ok = _spec({"remoteUrl": "lm://lmcache.kv.svc:65432"}).tuning.kv_tiers
    assert ok is not None and ok.remote_size_gib() == kv_tiers.LMCACHE_REMOTE_DEFAULT_GIB


def test_without_kv_tiers_the_plan_is_untouched_and_a_dp_pool_says_why_not() -> None:
    spec = _spec(None)
    pool_plan = plan_pool(_request(spec))
    assert tier_stage.with_tiers(spec, spec.pools[0], _request(spec), pool_plan, 1) \
        is pool_plan
    dp = _spec({"diskGiB": 64}, dataParallel=2)
    got = tier_stage.with_tiers(dp, dp.pools[0], _request(dp), pool_plan, 1)
    assert got.kv_tier is None
    assert any(w.startswith("spec.tuning.kvTiers:") and "l40s" in w for w in got.warnings)


def test_the_allowance_is_a_planning_input_left_out_when_unset() -> None:
    """A change to kvTiers re-plans a running pool (the plan in force is not kept)."""
    def digest(spec: InferenceDeploymentSpec) -> str:
        request = _request(spec)
        return plan_stage.planning_inputs(spec, spec.pools[0], request.model, request.profile,
                                          request.policy, None)

    bare, disk = _spec(None), _spec({"diskGiB": 64})
    assert digest(disk) != digest(bare) != digest(_spec({"diskGiB": 128}))


def test_an_allowance_the_plan_did_not_weigh_is_said() -> None:
    """A plan by the rules (no arrival rate) cannot weigh tiers: the warning says so and how."""
    spec, bare = _spec({"diskGiB": 64}), _spec(None)
    pool_plan = plan_pool(_request(spec))
    warned = tier_stage.said(spec, spec.pools[0], pool_plan)
    (line,) = [w for w in warned.warnings if w.startswith("spec.tuning.kvTiers:")]
    assert "l40s" in line and "requestRatePerSecond" in line
    assert tier_stage.said(bare, bare.pools[0], pool_plan) is pool_plan
    assert tier_stage.said(spec, spec.pools[0], warned) is warned  # said once


def test_a_kept_plan_keeps_the_tier_it_runs_with() -> None:
    """Status holds the LMCache tier the pods run; a plan in force is put back with it, and
    the warning names the tier this kvtune would choose instead."""
    disk = KVTier(kind="lmcache-disk", size_gib=256.0, buffer_gib=5.0)
    stored = KVTierStatus.model_validate(disk.model_dump())
    assert KVTierStatus.model_validate(through_api(
        stored.model_dump(mode="json", by_alias=True, exclude_none=True))) == stored
    base = PoolStatus(name="l40s", gpu_class="L40S", tensor_parallel=1, replicas=1,
                      phase="Applied", kv_tier=stored)
    assert plan_stage.tier_in_force(base) == disk
    new = make_pool_plan().model_copy(update={"kv_tier": None})
    kept, warning = plan_stage._keep(new, new.plan, base)
    assert kept.kv_tier == disk
    assert "kv tier none" in warning
    old = base.model_copy(update={"kv_tier": None})  # a status from before tiers were kept
    assert plan_stage._keep(new.model_copy(update={"kv_tier": disk}), new.plan, old)[0] \
        .kv_tier is None


def _reuse() -> ReuseStatus:
    return ReuseStatus(gpu_prefix_hit_rate=0.1, cpu_prefix_hit_rate=0.2,
                       cached_prompt_tokens_per_day=1e9, prefill_gpu_seconds_saved_per_day=1e3,
                       cpu_tier_gib_per_replica=64.0, cpu_tier_usd_per_day=6.4,
                       tier_reason="the search's size reason")


@pytest.mark.slow
def test_a_disk_allowance_gets_the_disk_tier_in_status_and_in_the_pod() -> None:
    """A disk tier serves this history as well as 64 GiB of host memory does (within the
    tie) while pinning only LMCache's 5 GiB buffer: the cheaper wins."""
    spec = _spec({"diskGiB": 64})
    request = _request(spec)
    base = plan_pool(request)
    pool_plan: PoolPlan = tier_stage.with_tiers(spec, spec.pools[0], request, base, 1,
                                                stream=_sessions())
    tier = pool_plan.kv_tier
    assert tier is not None and tier.kind == "lmcache-disk" and tier.size_gib == 64.0
    assert pool_plan.plan.kv_offloading_size_gib is None  # not the native tier besides
    reason = next(r for r in pool_plan.reasons if r.knob == "kv-tier")
    assert reason.choice == "lmcache-disk 64 GiB"
    for label in ("no tier", "native-cpu 64 GiB", "lmcache-cpu 64 GiB"):
        assert label in reason.message, label
    assert plan_hash(pool_plan, "vllm/vllm-openai:v0.33.0") \
        != plan_hash(base, "vllm/vllm-openai:v0.33.0")

    status = reuse_summary.with_tier_kind(_reuse(), pool_plan)
    assert status.tier == "lmcache-disk 64 GiB" and status.tier_reason == reason.message
    assert status.tier_disk_gib_per_replica == 64.0
    assert status.cpu_tier_gib_per_replica == kv_tiers.LMCACHE_BUFFER_GIB_PER_RANK
    assert status.cpu_prefix_hit_rate == pool_plan.expected.cpu_prefix_hit_rate > 0.1
    assert status.cpu_tier_usd_per_day == pytest.approx(6.4 * 5.0 / 64.0, rel=1e-3)

    objects = render_pool(RenderInput(name="chat", namespace="llm", pool="l40s",
                                      pool_plan=pool_plan, model_name=MODEL,
                                      image="vllm/vllm-openai:v0.33.0", replicas=1,
                                      revision=1))
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    disk = next(v for v in pod["volumes"] if v["name"] == "lmcache-disk")
    assert disk["emptyDir"]["sizeLimit"] == f"{64 * 1024}Mi"
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["ephemeral-storage"] == f"{64 * 1024}Mi"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["LMCACHE_MAX_LOCAL_DISK_SIZE"] == "64.0"
    assert env["LMCACHE_LOCAL_DISK"] == "file://" + kv_tiers.LMCACHE_DISK_PATH
