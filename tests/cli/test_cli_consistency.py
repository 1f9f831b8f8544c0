"""One spelling per concept across kvtune's subcommands (issue 14 item 12): the same model,
GPU, TP and weights options with the same GPU list; ``-o`` is an output format everywhere (files
are ``--out-file``); ``simulate`` refuses what ``plan`` refuses."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.tuner.facts.gpus import list_gpu_classes
from kvtune.tuner.facts.weights import WEIGHTS_DTYPES


def _command(name: str) -> click.Command:
    group = cli
    assert isinstance(group, click.Group)
    command = group.get_command(click.Context(group), name)
    assert command is not None, name
    return command


def _options(name: str) -> dict[str, click.Option]:
    return {opt: p for p in _command(name).params if isinstance(p, click.Option)
            for opt in p.opts}


@pytest.mark.parametrize("name", ["plan", "simulate", "replay"])
def test_model_gpu_and_tp_are_spelled_alike(name: str) -> None:
    opts = _options(name)
    for flag in ("-m", "--model", "-g", "--gpu", "--tp"):
        assert flag in opts, (name, flag)
    help_text = opts["--gpu"].help or ""
    assert all(g in help_text for g in list_gpu_classes()), help_text
    assert opts["--tp"] is opts.get("--tensor-parallel")  # the former spelling, one option


@pytest.mark.parametrize("name", ["plan", "simulate"])
def test_weights_dtype_takes_the_same_spellings(name: str) -> None:
    kind = _options(name)["--weights-dtype"].type
    assert isinstance(kind, click.Choice) and tuple(kind.choices) == WEIGHTS_DTYPES


@pytest.mark.parametrize("name", ["plan", "simulate", "alerts"])
def test_dash_o_is_a_format(name: str) -> None:
    opt = _options(name)["-o"]
    assert isinstance(opt.type, click.Choice), (name, opt.type)


@pytest.mark.parametrize("name", ["alerts", "quality"])
def test_files_are_written_with_out_file(name: str) -> None:
    opts = _options(name)
    assert "--out-file" in opts and isinstance(opts["--out-file"].type, click.Path)
    assert "-o" not in opts or isinstance(opts["-o"].type, click.Choice)


def test_simulate_refuses_the_block_size_plan_refuses() -> None:
    from kvtune.e2e.traces import AZURE_TRACE

    base = ["-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100"]
    plan = CliRunner().invoke(cli, ["plan", *base, "--block-size", "7"])
    sim = CliRunner().invoke(cli, ["simulate", *base, "--trace", str(AZURE_TRACE), "--limit",
                                   "50", "--compare", "defaults", "--score-sample", "0",
                                   "--config", "block_size=7"])
    assert plan.exit_code != 0 and sim.exit_code == plan.exit_code, (plan.output, sim.output)
    # Each names what its user typed: plan the option, simulate the --config key.
    for result, name in ((plan, "--block-size=7"), (sim, "block_size=7")):
        text = result.stderr
        assert name in text and "allowed" in text, text
        assert "Traceback" not in text and len(text.strip().splitlines()) == 1, text
