"""The replay exporter: its instance model (pure) and its /metrics scraped by a real Prometheus."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from kvtune.e2e.prometheus import PrometheusServer
from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.e2e.traces import MOONCAKE_TRACE as MOONCAKE
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.replay.exporter import Engine, Replay, ReplayServer, parse_config_overrides
from kvtune.replay.instance import HistogramState, Instance, InstanceConfig, TraceSchedule
from kvtune.tuner.traces import TraceRequest, load_trace


def test_histogram_le_semantics_and_cumulative_counts() -> None:
    h = HistogramState((1.0, 2.0, 5.0))
    for v in (1.0, 1.5, 2.0, 7.0):
        h.observe(v)
    assert h.cumulative() == [("1.0", 1), ("2.0", 3), ("5.0", 3), ("+Inf", 4)]
    assert h.total == 11.5 and h.n == 4


def test_shared_prefix_hits_and_block_accounting() -> None:
    cfg = InstanceConfig(block_size=16, num_gpu_blocks=1000, step_seconds=0.01)
    inst = Instance(cfg)
    a = TraceRequest(0.0, 1024, 4, prefix_block_ids=(7, 8))
    b = TraceRequest(0.0, 1024, 4, prefix_block_ids=(7, 9))  # shares the first 512 tokens
    inst.submit(a, 0.0)
    inst.step()
    assert inst.metrics.counters[vm.PREFIX_CACHE_HITS] == 0
    assert inst.used_blocks() == 64
    inst.submit(b, 0.01)
    inst.step()
    # b reuses a's first 32 blocks (512 tokens), allocates 32 of its own.
    assert inst.metrics.counters[vm.PREFIX_CACHE_HITS] == 512
    assert inst.metrics.counters[vm.PREFIX_CACHE_QUERIES] == 2048
    assert inst.used_blocks() == 96
    for _ in range(200):
        inst.step()
    assert sum(inst.metrics.finished.values()) == 2
    # Freed full blocks stay cached (evictable) and count as free; the two partial last
    # blocks (1028 tokens each) hold no hash.
    assert inst.usage() == 0.0 and inst.pool.num_cached_free_blocks() == 96
    inst.pool.check_invariants()


def test_too_long_prompts_are_rejected_like_the_api_server() -> None:
    inst = Instance(InstanceConfig(max_model_len=1000))
    assert not inst.submit(TraceRequest(0.0, 1000, 10), 0.0)
    assert inst.submit(TraceRequest(0.0, 999, 10), 0.0)
    assert inst.rejected_too_long == 1


def test_memory_pressure_preempts_the_newest_request() -> None:
    cfg = InstanceConfig(block_size=16, num_gpu_blocks=100, step_seconds=0.05,
                         enable_prefix_caching=False)
    inst = Instance(cfg)
    for i in range(2):
        inst.submit(TraceRequest(0.0, 512, 800), 0.0 + i * 0.001)
    for _ in range(1000):
        inst.step()
    # Each needs 82 blocks at its end: both cannot hold them at once.
    assert inst.metrics.counters[vm.NUM_PREEMPTIONS] >= 1
    assert sum(inst.metrics.finished.values()) == 2  # both finish eventually


def test_schedule_loops_and_offsets() -> None:
    reqs = [TraceRequest(float(t), 10, 1) for t in range(10)]
    s = TraceSchedule(reqs, start_seconds=100.0, offset_seconds=5.0)
    first = s.due(100.0 + 4.0)
    assert [round(t, 3) for t, _ in first] == [100.0, 101.0, 102.0, 103.0, 104.0]
    later = s.due(100.0 + 4.0 + 10.0)
    assert len(later) == 10  # the second lap started


def test_shuffle_keeps_arrivals_and_permutes_contents() -> None:
    reqs = [TraceRequest(float(t), 100 + t, 1) for t in range(50)]
    s = TraceSchedule(reqs, start_seconds=0.0, shuffle_seed=3, loop=False)
    got = s.due(100.0)
    assert [t for t, _ in got] == [float(t) for t in range(50)]
    assert sorted(r.prompt_tokens for _, r in got) == list(range(100, 150))
    assert [r.prompt_tokens for _, r in got] != list(range(100, 150))


def test_a_budgeted_tick_gives_the_lock_up_before_it_catches_up() -> None:
    """The background loop's tick stops after its wall budget, so a lagging replay cannot
    hold the lock through its whole catch-up (Python's locks are not fair: a control
    request waited behind one for over 5 s in CI). An unbudgeted tick still catches up."""
    now = [0.0]
    replay = Replay(InstanceConfig(model_name="m"), AZURE, speed=1.0, clock=lambda: now[0])
    now[0] = 30.0  # 30 model seconds behind
    replay.tick(chunk_model_seconds=1.0, wall_budget_seconds=0.0)
    state = replay.state()
    # One chunk: up to the last step that ends within it.
    assert 0.5 < state.model_seconds <= 1.0
    assert state.lag_model_seconds >= 29.0
    replay.tick()
    assert 29.0 < replay.state().model_seconds <= 30.0
    assert replay.state().lag_model_seconds < 1.0


def test_config_overrides_are_typed_and_checked() -> None:
    assert parse_config_overrides(["num_gpu_blocks=5", "enable-prefix-caching=false"]) == {
        "num_gpu_blocks": 5, "enable_prefix_caching": False}
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        parse_config_overrides(["nope=1"])


def test_mooncake_reuses_prefixes_and_azure_does_not() -> None:
    hit_rates = {}
    for path in (AZURE, MOONCAKE):
        inst = Instance(InstanceConfig())
        sched = TraceSchedule(list(load_trace(path).requests), 0.0)
        for t in range(1, 121):
            inst.advance_to(float(t), sched.due(float(t)))
        c = inst.metrics.counters
        hit_rates[path.name] = c[vm.PREFIX_CACHE_HITS] / c[vm.PREFIX_CACHE_QUERIES]
    assert hit_rates[AZURE.name] == 0.0
    assert hit_rates[MOONCAKE.name] > 0.02


@pytest.mark.prometheus
@pytest.mark.parametrize("engine", ["simulator", "simple"])
def test_prometheus_scrapes_vllm_names_and_the_trace_switch(prometheus: PrometheusServer,
                                                            engine: Engine) -> None:
    server = ReplayServer(Replay(InstanceConfig(model_name="m1"), AZURE, speed=20.0,
                                 engine=engine), port=0)
    server.start()
    try:
        prometheus.set_targets([server.target])
        prometheus.wait_for('vllm:request_success_total{finished_reason="stop"}', min_value=1)
        for spec in vm.METRICS:
            sample = f"{spec.name}_count" if spec.kind == "histogram" else (
                vm.wire_name(spec.name, spec.kind))
            result = prometheus.query(sample)
            assert result, f"{sample} not scraped"
            assert result[0]["metric"]["model_name"] == "m1"
            assert result[0]["metric"]["engine"] == "0"
        info = prometheus.query("vllm:cache_config_info")[0]["metric"]
        assert info["num_gpu_blocks"] == "60000" and info["block_size"] == "16"
        # Azure's prompts: the 1-2-5 buckets put its p50 (~1k tokens) between 500 and 2000.
        p50 = prometheus.wait_for(
            "histogram_quantile(0.5, sum by (le) (vllm:request_prompt_tokens_bucket))")
        assert 500 <= float(p50[0]["value"][1]) <= 2000

        req = urllib.request.Request(
            f"http://{server.target}/control/trace", method="POST",
            data=json.dumps({"trace": str(MOONCAKE)}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.load(resp)["trace"] == MOONCAKE.name
        # Mooncake shares prefixes: hits appear once its requests are admitted.
        prometheus.wait_for("vllm:prefix_cache_hits_total", min_value=1, timeout_seconds=60)
    finally:
        server.stop()


@pytest.mark.slow
def test_kvtune_replay_command_serves_and_stops_on_sigterm() -> None:
    import re
    import signal
    import subprocess
    import sys

    kvtune = Path(sys.executable).parent / "kvtune"
    proc = subprocess.Popen(
        [str(kvtune), "replay", "--trace", str(AZURE), "--speed", "50", "--port", "0",
         "--model-name", "cli", "--config", "num_gpu_blocks=1234",
         "--then", f"{MOONCAKE}@1"],
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", line)
        assert match, line
        with urllib.request.urlopen(f"http://{match.group(1)}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'vllm:cache_config_info{' in text and 'num_gpu_blocks="1234"' in text
        assert 'model_name="cli"' in text
        # --then TRACE@SECONDS switched the traffic after a second.
        deadline = time.monotonic() + 20
        state: dict[str, object] = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://{match.group(1)}/control/state",
                                        timeout=5) as resp:
                state = json.load(resp)
            if state["trace"] == MOONCAKE.name:
                break
            time.sleep(0.2)
        assert state["trace"] == MOONCAKE.name, state
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
