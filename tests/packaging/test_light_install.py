"""What a core install (no extras) does where an extra is needed, and which kvtune runs the
operator. The installed wheel itself is checked by scripts/wheel_check.py (`make test`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.e2e import operator_command
from kvtune.tuner.errors import KVTuneError
from kvtune.tuner.simulator import plot

TRACE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "synthetic_trace.jsonl"


def test_plot_without_matplotlib_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(plot, "matplotlib_installed", lambda: False)
    out = tmp_path / "compare.png"
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(TRACE), "--limit", "5", "-m",
                                      "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100",
                                      "--plot", str(out)])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"Error: --plot={str(out)!r}: needs matplotlib, which the core install "
                     "leaves out: pip install 'kvtune[plot]'"]
    assert not out.exists()
    with pytest.raises(KVTuneError, match=r"kvtune\[plot\]"):
        plot.plot_comparison([], out)


def test_the_operator_executable_is_the_variable_s_or_this_interpreter_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(operator_command.ENV_VAR, raising=False)
    assert operator_command.operator_executable() == Path(sys.executable).parent / "kvtune"
    fake = tmp_path / "kvtune"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(operator_command.ENV_VAR, str(fake))
    assert operator_command.operator_executable() == fake
    monkeypatch.setenv(operator_command.ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=r"KVTUNE_OPERATOR_BIN=.*no executable there"):
        operator_command.operator_executable()
