"""kvtune's CPU tier against vLLM 0.33.0's own ``OffloadingConnector``, step by step.

vLLM's scheduler runs with ``--kv-offloading-size`` / ``--kv-offloading-backend native``:
its connector's scheduler side (lookups, the CPU manager and its LRU, which chunks to store
and load, ``defer_block_free`` under async scheduling) is vLLM's own code; only the copy
kernels are replaced by ``kvtune.oracle.offload_worker`` (the host-link model kvtune uses).
Every step must agree as the GPU pool's do (``test_oracle_differential.py``), and in what
the tier did: which requests loaded how many chunks, how many chunks were written and
evicted. Each case must exercise what it is about (loads, evictions, preemptions).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from oraclecases import MOONCAKE, first_difference, trace_slice
from simhelpers import fixed_step_cost, request

from kvtune.cli.main import cli
from kvtune.oracle.steps import kvtune_steps
from kvtune.oracle.vllm_engine import vllm_steps
from kvtune.tuner.simulator.scheduler import EngineConfig
from kvtune.tuner.simulator.workload import SimRequest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _multi_turn() -> tuple[SimRequest, ...]:
    """Eight sessions of 1,024 history tokens, then their second turns: the GPU cache holds
    about three histories, so most second turns find theirs on CPU."""
    first = [request(s, 0.5 * s, 1024, 4, ((100 + s, 1024),)) for s in range(8)]
    second = [request(8 + s, 10.0 + 0.5 * s, 1280, 4, ((100 + s, 1024), (200 + s, 256)))
              for s in range(8)]
    return (*first, *second)


@dataclass(frozen=True)
class Case:
    name: str
    requests: tuple[SimRequest, ...]
    config: EngineConfig
    loads: bool  # the tier serves hits
    evicts: bool  # the tier fills up
    preempts: bool


def _cfg(**kw: object) -> EngineConfig:
    base: dict[str, object] = dict(block_size=16, max_model_len=32768,
                                   enable_prefix_caching=True)
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


CASES = [
    # Multi-turn: histories evicted from the GPU come back from CPU.
    Case("multi-turn", _multi_turn(), _cfg(
        num_gpu_blocks=200, max_num_seqs=8, max_num_batched_tokens=128,
        max_model_len=4096, cpu_offload_blocks=1000, offload_load_seconds_per_block=1e-4),
        loads=True, evicts=False, preempts=False),
    # Mooncake over time: loads beside preemptions (a resumed request loads its own
    # prompt), the tier three times the GPU cache.
    Case("mooncake-rate", trace_slice(MOONCAKE, 150, 0, 4.0), _cfg(
        num_gpu_blocks=1000, max_num_seqs=32, max_num_batched_tokens=1024,
        cpu_offload_blocks=3000, offload_load_seconds_per_block=2e-4),
        loads=True, evicts=True, preempts=True),
    # A tier smaller than the GPU cache on a slow link: stores it cannot make room for
    # (chunks being written or read) are dropped and offered again.
    Case("mooncake-small-tier", trace_slice(MOONCAKE, 150, 0, 4.0), _cfg(
        num_gpu_blocks=1000, max_num_seqs=32, max_num_batched_tokens=1024,
        cpu_offload_blocks=600, offload_load_seconds_per_block=1e-3),
        loads=True, evicts=True, preempts=True),
]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_cpu_tier_agrees_with_vllms_connector(vllm: object, case: Case,
                                                  async_scheduling: bool) -> None:
    cfg = dataclasses.replace(case.config, async_scheduling=async_scheduling)
    ours = kvtune_steps(case.requests, cfg, fixed_step_cost())
    theirs = vllm_steps(case.requests, cfg, fixed_step_cost())
    assert first_difference(ours, theirs) == ""
    assert ours.cpu_loads == theirs.cpu_loads
    assert (bool(ours.cpu_loads), ours.cpu_evicted > 0, ours.preemptions > 0) == (
        case.loads, case.evicts, case.preempts)
    assert ours.cpu_stored > 0
    assert len(ours.finish_order) == len(case.requests) - len(ours.rejected)


def test_kvtune_simulate_runs_vllms_connector_with_engine_vllm(vllm: object,
                                                               tmp_path: Path) -> None:
    """``--engine vllm`` with an offload size runs vLLM's scheduler with its
    OffloadingConnector and reports the CPU tier's hits as the simulator does."""
    args = ["simulate", "--trace", str(MOONCAKE), "--limit", "60", "--speed", "4",
            "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
            "--compare", "custom", "--score-sample", "0", "-o", "json",
            "--config", "kv_offloading_size_gib=64", "--config", "max_model_len=16384",
            "--config", "kv_cache_memory_bytes=3221225472"]  # ~1,500 blocks of 2 MiB
    rows = {}
    for engine in ("simulator", "vllm"):
        result = CliRunner().invoke(cli, [*args, "--engine", engine])
        assert result.exit_code == 0, result.output
        rows[engine] = json.loads(result.stdout)["configurations"][0]
    ours, theirs = rows["simulator"], rows["vllm"]
    assert theirs["engine"]["cpu_offload_blocks"] > 0
    assert theirs["starts"] and theirs["completed"] == ours["completed"] > 0
    for key in ("cpu_hit_tokens", "prefix_hit_tokens", "preemptions", "rejected"):
        assert ours[key] == theirs[key], key
