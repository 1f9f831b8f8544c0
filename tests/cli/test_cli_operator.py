"""`kvtune operator` and `kvtune crds` entry points (the operator itself runs in the cluster
tests, as a subprocess)."""

from __future__ import annotations

import importlib.util

import pytest
import yaml
from click.testing import CliRunner

from kvtune.cli.crds import crds
from kvtune.cli.operator_cmd import OPTIONAL_HANDLER_MODULES, load_handlers, operator


def test_standalone_and_peering_exclude_each_other() -> None:
    result = CliRunner().invoke(operator, ["--standalone", "--peering", "kvtune"])
    assert result.exit_code == 2 and "exclude each other" in result.output


def test_a_bad_gpu_price_is_refused_before_anything_starts() -> None:
    result = CliRunner().invoke(operator, ["--gpu-price", "H100=free"])
    assert result.exit_code == 2
    assert "--gpu-price=" in result.output and "CLASS=USD" in result.output


def test_handler_modules_of_other_parts_are_registered_when_installed() -> None:
    loaded = load_handlers()
    assert loaded[0] == "kvtune.operator.handlers"
    for name in OPTIONAL_HANDLER_MODULES:
        assert (name in loaded) == (importlib.util.find_spec(name) is not None)


def test_crds_prints_the_manifest() -> None:
    result = CliRunner().invoke(crds, [])
    assert result.exit_code == 0
    doc = yaml.safe_load(result.output)
    assert doc["metadata"]["name"] == "inferencedeployments.kvtune.io"


def test_the_template_render_budget_settings_reach_the_sandboxs_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvtune operator --template-*` (the chart's `templates` values) configure the budget
    every sandboxed render asks (template_sandbox.BUDGET) before anything connects; the
    excluded --standalone/--peering pair stops the command right after."""
    from kvtune.operator.render import template_sandbox
    from kvtune.operator.render.render_fairness import Limits, TenantBudget

    budget = TenantBudget()
    monkeypatch.setattr(template_sandbox, "BUDGET", budget)
    result = CliRunner().invoke(operator, [
        "--template-renders-in-flight", "2", "--template-cpu-seconds", "1.5",
        "--template-cpu-window-seconds", "30", "--template-retry-spread-seconds", "0.5",
        "--standalone", "--peering", "kvtune"])
    assert result.exit_code == 2 and "exclude each other" in result.output
    assert budget.limits == Limits(in_flight=2, cpu_seconds=1.5, window_seconds=30.0,
                                   spread_seconds=0.5)
    # ...and the budget decides by them: two renders of one namespace at once, the third
    # deferred by the spread; another namespace is unaffected.
    assert budget.admit("a", 0.0) is None and budget.admit("a", 0.0) is None
    deferred = budget.admit("a", 0.0)
    assert deferred is not None and deferred.retry_after_seconds == 0.5
    assert "at most 2 at a time" in deferred.reason
    assert budget.admit("b", 0.0) is None
    budget.finish("a", 1.0, 1.5)
    budget.finish("a", 1.0, 0.1)
    cpu = budget.admit("a", 2.0)  # 1.6 s used of 1.5 s: free when the first leaves at 31 s
    assert cpu is not None and cpu.retry_after_seconds == 31.0 + 0.5 - 2.0
    assert "budget 1.5 s" in cpu.reason and "last 30 s" in cpu.reason


@pytest.mark.parametrize(("flag", "value"), [
    ("--template-renders-in-flight", "0"), ("--template-cpu-seconds", "0"),
    ("--template-cpu-window-seconds", "0.5"), ("--template-retry-spread-seconds", "-1")])
def test_a_bad_render_budget_setting_is_refused_in_one_line(flag: str, value: str) -> None:
    result = CliRunner().invoke(operator, [flag, value])
    assert result.exit_code == 2
    [line] = [ln for ln in result.output.splitlines() if ln.startswith("Error")]
    assert flag in line and value in line, result.output
    assert "Traceback" not in result.output
