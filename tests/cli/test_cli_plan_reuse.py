"""`kvtune plan` shows what prefix reuse saves and the CPU tier sizes weighed (JSON and
table), from a Mooncake trace whose histories come back after more than the GPU holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli

GPU_PRICE = 1.25  # USD per L40S-hour, given (the list has no L40S price)
HOST_PRICE = 0.004  # USD per GiB-hour, given


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def _write_trace(path: Path) -> None:
    # tests/simulator/test_sim_offload_size.py's round-robin sessions, as JSONL.
    lines = []
    for k in range(64 * 4):
        turn, s = divmod(k, 64)
        ids = [1 + s * 100 + j for j in range(5 * (turn + 1))]
        lines.append(json.dumps({"timestamp": k / 1.5 * 1000, "input_length": 512 * len(ids),
                                 "output_length": 100, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_plan_shows_the_tier_sized_from_reuse_and_the_money(tmp_path: Path) -> None:
    trace = tmp_path / "sessions.jsonl"
    _write_trace(trace)
    args = ("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "L40S", "--trace",
            str(trace), "--ttft-p95", "3", "--tpot-p95", "0.1", "--cpu-offload-gib", "256",
            "--gpu-price", f"L40S={GPU_PRICE}", "--host-memory-price", str(HOST_PRICE),
            "--search-cpu-seconds", "900")
    code, out, err = run(*args, "-o", "json")
    assert code == 0, out + err
    doc = json.loads(out)
    size = doc["plan"]["kv_offloading_size_gib"]
    assert size is not None and 1 <= size < 256
    reuse = doc["search"]["reuse"]
    assert reuse["cpu_tier_gib_per_replica"] == size
    assert reuse["cpu_prefix_hit_rate"] > 0
    assert reuse["cpu_prefix_hit_rate"] == pytest.approx(doc["expected"]["cpu_prefix_hit_rate"],
                                                         abs=1e-4)
    assert reuse["usd_saved_per_day"] == pytest.approx(
        reuse["prefill_gpu_seconds_saved_per_day"] / 3600 * GPU_PRICE)
    assert reuse["gpu_price_source"] == f"--gpu-price L40S={GPU_PRICE:g}"
    replicas = doc["search"]["replicas_needed"] or doc["search"]["replicas"]
    assert reuse["cpu_tier_usd_per_day"] == pytest.approx(size * replicas * 24 * HOST_PRICE)
    assert [t["size_gib"] for t in reuse["tier_sizes"] if t["chosen"]] == [size]
    assert doc["profile"]["prefix_reuse_distance_tokens"]["p50"] > 0
    # The table (the search is cached in-process: same inputs, same plan).
    code, table, _ = run(*args)
    assert code == 0
    table = " ".join(table.split())  # rich wraps long lines at 120 columns
    assert "CPU tier sizes weighed" in table and "predicted prefix hits (GPU / CPU tier)" in table
    assert f"{size:g} GiB of CPU tier pays" in table
    assert f"= ${reuse['usd_saved_per_day']:,.2f}/day" in table
    assert f"CPU tier: {size:g} GiB of host memory per replica; cost " \
           f"${reuse['cpu_tier_usd_per_day']:,.2f}/day" in table


def test_a_bad_host_memory_price_is_one_line_naming_the_option() -> None:
    code, _, err = run("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100",
                         "--host-memory-price", "-1")
    assert code == 2
    assert "--host-memory-price" in err and "-1" in err
