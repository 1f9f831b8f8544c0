"""`kvtune plan --disaggregate --gpus-per-replica N`: every prefill:decode split and co-located
serving weighed by capacity at SLO, the per-role plans with their --kv-transfer-config, and an
incompatible per-role pin refused in one line (cli/plan_disagg.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.tuner.simulator import disagg_search

LLAMA8 = ["plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H200"]


@pytest.fixture(autouse=True)
def short_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    # A short stream per probe: the figures are coarser, the logic the same.
    monkeypatch.setattr(disagg_search, "STREAM_REQUESTS", 60)


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_json_lists_every_split_and_colocated_with_the_chosen_one() -> None:
    code, out, err = run(*LLAMA8, "--gpus-per-replica", "4", "--disaggregate",
                         "--request-rate", "4", "-o", "json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    assert doc["gpus"] == 4 and doc["kv_link"]["fabric"] == "NVLink"
    labels = [o["label"] for o in doc["options"]]
    assert [x.split(" ")[0] for x in labels[:3]] == ["1P:3D", "2P:2D", "3P:1D"]
    assert labels[3:] == ["co-located TP1 x4", "co-located TP2 x2", "co-located TP4 x1"]
    chosen = [o for o in doc["options"] if o["chosen"]]
    assert len(chosen) == 1 and chosen[0]["label"] == doc["chosen"]
    best = max(o["capacity_requests_per_second"] for o in doc["options"])
    assert chosen[0]["capacity_requests_per_second"] == best
    assert doc["colocated_wins"] == (not chosen[0]["disaggregated"])
    assert ("co-located wins" in doc["verdict"]) == doc["colocated_wins"]
    split = doc["options"][1]
    assert split["prefill"]["engines"] * split["prefill"]["tensor_parallel"] == 2
    roles = {r: json.loads(a.partition("=")[2]) for r in ("prefill", "decode")
             for a in split[r]["vllm_args"] if a.startswith("--kv-transfer-config=")}
    assert roles == {"prefill": {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
                     "decode": {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}}
    # The two roles' KV plans agree where NixlConnector needs them to.
    for knob in ("block_size", "kv_cache_dtype", "attention_backend"):
        assert split["prefill"]["plan"][knob] == split["decode"]["plan"][knob]


def test_table_shows_capacities_and_the_verdict() -> None:
    code, out, err = run(*LLAMA8, "--gpus-per-replica", "2", "--disaggregate",
                         "--kv-link-gbps", "400", "--prefill-kv-cache-dtype", "fp8")
    assert code == 0, err
    assert "1P:1D (TP1 x1 : TP1 x1)" in out and "co-located TP1 x2" in out
    assert "KV link declared 50 GB/s" in out and "verdict:" in out
    assert "--kv-cache-dtype=fp8" in out


@pytest.mark.parametrize(("args", "line"), [
    (["--prefill-block-size", "32", "--decode-block-size", "16"],
     "Error: block_size='prefill 32, decode 16': NixlConnector's handshake refuses the pair; "
     "the decode block size must be a multiple of the prefill one"),
    (["--prefill-kv-cache-dtype", "auto", "--decode-kv-cache-dtype", "bfloat16"],
     "Error: kv_cache_dtype='prefill auto, decode bfloat16': NixlConnector's handshake "
     "refuses the pair; pin the same --kv-cache-dtype"),
])
def test_an_incompatible_per_role_pin_is_refused_in_one_line(args: list[str],
                                                             line: str) -> None:
    code, out, err = run(*LLAMA8, "--gpus-per-replica", "2", "--disaggregate", *args)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(line), err


@pytest.mark.parametrize(("args", "needle"), [
    (["--disaggregate"], "--disaggregate needs --gpus-per-replica"),
    (["--prefill-tp", "2"], "--prefill-tp needs --disaggregate"),
    (["--disaggregate", "--gpus-per-replica", "4", "--tp", "2"], "drop --tp"),
    (["--disaggregate", "--gpus-per-replica", "4", "-o", "args"], "-o table, json or yaml"),
])
def test_usage_errors(args: list[str], needle: str) -> None:
    code, _, err = run(*LLAMA8, *args)
    assert code == 2 and needle in err, err


def test_a_gpu_class_without_link_facts_needs_the_link() -> None:
    code, _, err = run("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "L40S",
                       "--gpus-per-replica", "2", "--disaggregate")
    assert code == 1 and "--kv-link-gbps" in err


@pytest.mark.vllm
def test_kv_transfer_config_parses_in_vllms_own_parser() -> None:
    """Each role's --kv-transfer-config, parsed into vLLM's ``KVTransferConfig`` with the kwargs
    vLLM's ``get_kwargs`` gives a field typed ``KVTransferConfig | None`` (EngineArgs's
    ``kv_transfer_config``; the whole VllmConfig needs a device)."""
    from dataclasses import field, make_dataclass

    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs, get_kwargs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # Built at run time: this module's annotations are strings (from __future__).
    holder = make_dataclass("Holder", [("kv_transfer_config", KVTransferConfig | None,
                                        field(default=None))])

    # The same annotation as the engine's own field.
    assert EngineArgs.__dataclass_fields__["kv_transfer_config"].type in (
        "KVTransferConfig | None", KVTransferConfig | None)
    code, out, err = run(*LLAMA8, "--gpus-per-replica", "2", "--disaggregate", "-o", "json")
    assert code == 0, err
    split = json.loads(out)["options"][0]
    parser = FlexibleArgumentParser()
    parser.add_argument("--kv-transfer-config", **get_kwargs(holder)["kv_transfer_config"])
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        flag = [a for a in split[role]["vllm_args"] if a.startswith("--kv-transfer-config")]
        config = parser.parse_args(flag).kv_transfer_config
        assert isinstance(config, KVTransferConfig)
        assert config.kv_connector == "NixlConnector" and config.kv_role == kv_role
        assert config.is_kv_transfer_instance
        assert config.is_kv_producer == (role == "prefill")
        assert config.is_kv_consumer == (role == "decode")
