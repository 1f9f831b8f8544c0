"""``kvtune plan --kv-tier-disk-gib / --kv-tier-remote-url`` (issue 27 item 1): refused where
no stream is replayed or the store is misnamed, in one line; on a trace, the plan names the
tier that pays, renders LMCache's connector and variables when it is an LMCache one, and its
reason weighs every tier."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.e2e.traces import MOONCAKE_TRACE

BASE = ["plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100"]


def test_tier_options_need_the_search_stream() -> None:
    result = CliRunner().invoke(cli, [*BASE, "--kv-tier-disk-gib", "500"])
    assert result.exit_code == 2, result.output
    assert "--kv-tier-disk-gib" in result.output and "--trace" in result.output
    assert "Traceback" not in result.output


def test_a_remote_store_must_be_named_as_lmcache_names_it() -> None:
    result = CliRunner().invoke(cli, [*BASE, "--request-rate", "2", "--kv-tier-remote-url",
                                      "http://cache:80"])
    assert result.exit_code == 2, result.output
    assert "--kv-tier-remote-url" in result.output and "lm://host:port" in result.output


@pytest.mark.slow
def test_a_trace_plan_weighs_every_tier_and_renders_the_chosen_one() -> None:
    result = CliRunner().invoke(cli, [
        *BASE, "--trace", str(MOONCAKE_TRACE), "--cpu-offload-gib", "64",
        "--kv-tier-disk-gib", "1024", "--kv-tier-remote-url", "lm://lmcache:65432",
        "--ttft-p95", "5", "--tpot-p95", "0.05", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    reason = next(r for r in doc["reasons"] if r["knob"] == "kv-tier")
    for label in ("no tier", "native-cpu 64 GiB", "lmcache-cpu 64 GiB",
                  "lmcache-disk 1024 GiB", "lmcache-remote 1024 GiB"):
        assert label in reason["message"], label
    if reason["choice"].startswith("lmcache"):
        assert doc["kv_tier"]["kind"] == reason["choice"].split()[0]
        assert any(a.startswith("--kv-transfer-config=") for a in doc["vllm_args"])
        assert not any(a.startswith("--kv-offloading-size") for a in doc["vllm_args"])
        assert {e["name"] for e in doc["kv_tier"]["env"]} >= {
            "LMCACHE_CHUNK_SIZE", "LMCACHE_MAX_LOCAL_CPU_SIZE"}
    else:
        assert "kv_tier" not in doc
