"""The replay exporter on kvtune's simulator: the planned KV cache in vllm:cache_config_info,
restarts on POST /control/config, and following a Deployment's rendered vLLM flags."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.e2e.traces import MOONCAKE_TRACE as MOONCAKE
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.replay.exporter import (
    Replay,
    ReplayServer,
    changes_from_vllm_args,
    config_changes,
)
from kvtune.replay.instance import InstanceConfig
from kvtune.replay.sim import Hardware
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.kvmemory import page_size_bytes
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.presets import profile_from_trace
from kvtune.tuner.traces import load_trace

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _planned(gpu: str = "H100") -> Any:
    request = PlanRequest(model=get_model(MODEL), gpu=get_gpu_class(gpu),
                          profile=profile_from_trace(load_trace(AZURE)))
    return plan_pool(request)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body: bytes = resp.read()
        return body


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _info(text: str) -> dict[str, str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(vm.CACHE_CONFIG_INFO + "{"))
    labels = line[line.index("{") + 1: line.rindex("}")]
    return dict((kv.split("=", 1)[0], kv.split("=", 1)[1].strip('"'))
                for kv in labels.split(","))


def _counter(text: str, name: str) -> float:
    wire = vm.wire_name(name, "counter")
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(wire + "{"))


@pytest.mark.parametrize(("args", "want"), [
    (["m", "--host=0.0.0.0", "--port=8000", "--tensor-parallel-size=1", "--block-size=32",
      "--kv-cache-dtype=fp8", "--gpu-memory-utilization=0.9", "--max-model-len=16384",
      "--max-num-seqs=128", "--max-num-batched-tokens=4096", "--no-enable-prefix-caching"],
     {"block_size": 32, "cache_dtype": "fp8", "gpu_memory_utilization": 0.9,
      "max_model_len": 16384, "max_num_seqs": 128, "max_num_batched_tokens": 4096,
      "enable_prefix_caching": False, "tensor_parallel": 1, "kv_cache_memory_bytes": 0}),
    (["--kv-cache-memory-bytes=8000000000", "--tensor-parallel-size", "2"],
     {"kv_cache_memory_bytes": 8_000_000_000, "tensor_parallel": 2}),
    (["--block-size", "64", "--enable-prefix-caching", "--num-gpu-blocks-override", "900"],
     {"block_size": 64, "enable_prefix_caching": True, "num_gpu_blocks": 900}),
])
def test_vllm_flags_become_the_replayed_configuration(args: list[str],
                                                      want: dict[str, Any]) -> None:
    assert changes_from_vllm_args(args) == want
    assert config_changes({"args": args}) == want


def test_config_body_by_field_names_is_typed_and_checked() -> None:
    assert config_changes({"block-size": "32", "kv_cache_dtype": "fp8",
                           "enable_prefix_caching": "false"}) == {
        "block_size": 32, "cache_dtype": "fp8", "enable_prefix_caching": False}
    with pytest.raises(ValueError, match="not a setting"):
        config_changes({"swap_space": 4})


def test_control_config_restarts_the_simulated_instance_with_the_planned_kv_cache() -> None:
    pool = _planned()
    replay = Replay(InstanceConfig(model_name="sim"), AZURE, speed=20.0, engine="simulator",
                    hardware=Hardware(model=MODEL, gpu="H100"))
    server = ReplayServer(replay, port=0)
    server.start()
    base = f"http://{server.target}"
    try:
        # vLLM's defaults for this model and GPU, sized by the planner's KV math.
        first = _info(_get(f"{base}/metrics").decode())
        assert first["block_size"] == "16" and int(first["num_gpu_blocks"]) > 10_000
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            before = _get(f"{base}/metrics").decode()
            if _counter(before, vm.GENERATION_TOKENS) > 1000:
                break
            time.sleep(0.2)
        assert _counter(before, vm.GENERATION_TOKENS) > 1000

        code, state = _post(f"{base}/control/config", {"args": pool.plan.vllm_args()})
        assert code == 200, state
        assert state["engine"] == "simulator" and state["restarts"] == 1
        after = _get(f"{base}/metrics").decode()
        info = _info(after)
        # The rollout's configuration, with the blocks the planner expects vLLM to allocate.
        assert info["num_gpu_blocks"] == str(pool.expected.num_gpu_blocks)
        assert info["block_size"] == str(pool.plan.block_size)
        assert info["cache_dtype"] == pool.plan.kv_cache_dtype
        assert info["enable_prefix_caching"] == str(pool.plan.enable_prefix_caching)
        assert float(info["gpu_memory_utilization"]) == pytest.approx(
            pool.plan.gpu_memory_utilization, rel=1e-3)
        # A new process: counters start again from zero.
        assert _counter(after, vm.GENERATION_TOKENS) < _counter(before, vm.GENERATION_TOKENS)

        # A configuration vLLM would not start with is refused; nothing changes.
        code, msg = _post(f"{base}/control/config", {"max_model_len": 16_000_000})
        assert code == 400 and "would not start" in msg
        # Out of any range at all: refused at the boundary, naming the field and the bound.
        code, msg = _post(f"{base}/control/config", {"max_model_len": 50_000_000})
        assert code == 400 and "max_model_len=50000000" in msg and "16,777,216" in msg
        code, msg = _post(f"{base}/control/config", {"swap_space": 4})
        assert code == 400
        state = json.loads(_get(f"{base}/control/state"))
        assert state["restarts"] == 1 and state["num_gpu_blocks"] == pool.expected.num_gpu_blocks

        # Pinning the cache size (--num-gpu-blocks-override) and the traffic keeps flowing.
        code, state = _post(f"{base}/control/config", {"num_gpu_blocks": 5000})
        assert code == 200 and state["num_gpu_blocks"] == 5000 and state["restarts"] == 2
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            state = json.loads(_get(f"{base}/control/state"))
            if state["finished"] > 0:
                break
            time.sleep(0.2)
        assert state["finished"] > 0
    finally:
        server.stop()


def test_kv_cache_memory_bytes_and_tensor_parallel_size_the_cache() -> None:
    replay = Replay(InstanceConfig(max_model_len=32768), AZURE, speed=20.0,
                    engine="simulator", hardware=Hardware(model=MODEL, gpu="H100"))
    tp1 = replay.instance.config.num_gpu_blocks
    replay.reconfigure(changes_from_vllm_args(["--kv-cache-memory-bytes=8000000000"]))
    page = page_size_bytes(get_model(MODEL), "auto", 1, 16,
                           model_dtype=get_model(MODEL).torch_dtype)
    assert replay.instance.config.num_gpu_blocks == 8_000_000_000 // page
    assert replay.instance.cache_config_labels()["kv_cache_memory_bytes"] == "8000000000"
    # A rendered plan names one or the other: back to the utilization, then TP=2 halves
    # the KV bytes per token on each GPU and the weights: more than twice the blocks.
    replay.reconfigure(changes_from_vllm_args(["--gpu-memory-utilization=0.92",
                                               "--tensor-parallel-size=2"]))
    assert replay.instance.cache_config_labels()["kv_cache_memory_bytes"] == "None"
    assert replay.hardware.tensor_parallel == 2
    assert replay.instance.config.num_gpu_blocks > 2 * tp1


def test_simple_engine_follows_control_config_too() -> None:
    replay = Replay(InstanceConfig(), AZURE, speed=20.0)
    replay.tick()
    replay.reconfigure({"block_size": 32, "num_gpu_blocks": 777})
    assert replay.instance.config.block_size == 32
    assert replay.instance.cache_config_labels()["num_gpu_blocks"] == "777"
    assert replay.state().restarts == 1


@pytest.mark.parametrize("trace", [AZURE, MOONCAKE], ids=["azure", "mooncake"])
def test_replay_catches_up_to_the_clock_and_reports_its_lag(trace: Path) -> None:
    # How fast the simulator keeps up with the wall clock is a benchmark figure
    # (bench/simulate_bench.py, "replay at 20x"); here, what a tick does with the clock: it
    # simulates up to the model time the clock gave, and reports how far the clock moved on
    # while it did. The clock moves 0.25 s per look: a tick looks twice (its target, then
    # its lag), so it ends 0.25 s x 20 = 5 model seconds behind.
    wall = [0.0]

    def clock() -> float:
        wall[0] += 0.25
        return wall[0]

    replay = Replay(InstanceConfig(), trace, speed=20.0, engine="simulator", clock=clock)
    for _ in range(8):
        replay.tick()
        state = replay.state()
        # The instance reached the target (the model time at the tick's first look; an
        # engine step may end a little past it)...
        target = (wall[0] - 0.25) * 20.0 - 0.25 * 20.0
        assert target <= state.model_seconds < target + 0.5
        # ...and the clock moved on by one look since.
        assert state.lag_model_seconds == pytest.approx(5.0, abs=0.5)
    assert replay.state().finished > 0


@pytest.mark.cluster
def test_follow_deployment_applies_the_rendered_vllm_flags(local_cluster: Any) -> None:
    from kubernetes import client

    from kvtune.replay.follow import DeploymentFollower

    apps = client.AppsV1Api(local_cluster.api_client())
    name = "replay-follow"
    args = ["m", "--host=0.0.0.0", "--port=8000", "--block-size=16", "--kv-cache-dtype=auto",
            "--gpu-memory-utilization=0.9", "--max-model-len=32768", "--max-num-seqs=256",
            "--max-num-batched-tokens=8192", "--enable-prefix-caching"]
    labels = {"app": name}
    body = client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=1, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(
                    name="vllm", image="vllm/vllm-openai:v0.33.0",
                    command=["vllm", "serve"], args=args)]))))
    apps.create_namespaced_deployment("default", body)
    replay = Replay(InstanceConfig(), AZURE, speed=20.0, engine="simulator",
                    hardware=Hardware(model=MODEL, gpu="H100"))
    follower = DeploymentFollower(replay, "default", name, str(local_cluster.kubeconfig_path),
                                  interval_seconds=0.3)
    try:
        assert follower.poll_once()
        assert replay.instance.config.max_model_len == 32768
        blocks_16 = replay.instance.config.num_gpu_blocks
        assert not follower.poll_once()  # unchanged args: no restart

        # A rollout of a new plan: the operator re-renders the container args.
        new_args = [a.replace("--block-size=16", "--block-size=32")
                    .replace("--kv-cache-dtype=auto", "--kv-cache-dtype=fp8") for a in args]
        apps.patch_namespaced_deployment(name, "default", {"spec": {"template": {"spec": {
            "containers": [{"name": "vllm", "args": new_args}]}}}})
        follower.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and replay.instance.config.block_size != 32:
            time.sleep(0.1)
        cfg = replay.instance.config
        assert (cfg.block_size, cfg.cache_dtype) == (32, "fp8")
        # FP8 halves the bytes per token: about twice the tokens in the same memory.
        assert cfg.num_gpu_blocks * 32 == pytest.approx(2 * blocks_16 * 16, rel=0.01)
        assert replay.state().restarts == 2
    finally:
        follower.stop()
        apps.delete_namespaced_deployment(name, "default")
