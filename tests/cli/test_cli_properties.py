"""Every `kvtune` command, with options drawn from its click tree (issue 21 item 6): valid
output and exit 0, or exactly one ``Error:`` line and exit 1/2; never a traceback; each
invocation bounded in time (an alarm) and memory (RLIMIT_AS). The harness is cli_fuzz.py.

The commands that serve until interrupted (operator, replay, demo, cluster up) and `quality`
(it runs a model) are driven with --help and with drawn options plus one value click refuses,
so they never start. The others run for real, on fixture files, with three things fixed to
keep each run short: `plan --no-search` (the goodput search's time is the tuner's search
budget, tested there), `simulate --engine simulator` (vLLM's own scheduler takes 10-20 s to
import), and `crds`/`cluster` pointed at a temporary folder (never the repository's crds/ or a
running cluster's state)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_fuzz import Files, argv, check, commands, invoke, make_files, one_bad_value
from hypothesis import HealthCheck, Phase, given, settings

# Commands that start servers, clusters or model runs: --help and refused options only.
NEVER_STARTED = {"operator", "replay", "demo", "cluster up", "quality"}
# Per command: how many drawn invocations (the run's time: ~2 minutes on 2 busy cores).
EXAMPLES = {"plan": 40, "simulate": 25, "alerts": 15, "crds": 8, "cluster down": 6,
            "cluster status": 6}
DEFAULT_EXAMPLES = 15
# Options drawn in nearly every invocation (so most get past "--model is required").
CORE = {"plan": ("--model", "--gpu"), "simulate": ("--trace", "--model", "--gpu", "--limit"),
        "alerts": ("--file",)}
# No shrinking: a failing invocation is reported as drawn (shrinking one took 5 minutes).
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return make_files(tmp_path_factory.mktemp("cli-fuzz"))


@pytest.fixture(autouse=True)
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No kubeconfig and no real cache: a drawn --from-cluster or cluster command fails fast."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    yield


def _fixed(name: str, files: Files, tmp: Path) -> dict[str, list[str]]:
    return {
        "plan": {"--search": ["--no-search"], "--no-search": []},
        "simulate": {"--engine": ["--engine", "simulator"]},
        "crds": {"--dir": ["--dir", str(tmp / "crds")]},
        "cluster down": {"--state-dir": ["--state-dir", str(tmp / "state")]},
        "cluster status": {"--state-dir": ["--state-dir", str(tmp / "state")]},
    }.get(name, {})


ALL = commands()
RUN = sorted(set(ALL) - NEVER_STARTED)


def test_the_tree_has_the_commands_this_test_knows() -> None:
    """A new command is run for real unless it is listed as one that starts a server."""
    assert {"plan", "simulate", "alerts", "crds"} <= set(RUN)
    assert set(ALL) >= NEVER_STARTED


@pytest.mark.parametrize("name", sorted(ALL))
def test_help_exits_0(name: str) -> None:
    words = [*name.split(), "--help"]
    result = invoke(words, seconds=30)
    check(words, result)
    assert result.exit_code == 0 and "Usage:" in result.stdout


@pytest.mark.parametrize("name", RUN)
def test_drawn_options_give_output_or_one_error_line(name: str, files: Files,
                                                     tmp_path_factory: pytest.TempPathFactory
                                                     ) -> None:
    command = ALL[name]
    tmp = tmp_path_factory.mktemp(name.replace(" ", "-"))

    @settings(max_examples=EXAMPLES.get(name, DEFAULT_EXAMPLES), **SETTINGS)  # type: ignore[arg-type]
    @given(words=argv(command, files, _fixed(name, files, tmp), CORE.get(name, ())))
    def run(words: list[str]) -> None:
        full = [*name.split(), *words]
        check(full, invoke(full))

    run()


@pytest.mark.parametrize("name", sorted(NEVER_STARTED))
def test_servers_refuse_bad_options_in_one_line(name: str, files: Files) -> None:
    command = ALL[name]

    # The refused option is left out of the drawn ones (a later value would replace it).
    drawn = one_bad_value(command, files).flatmap(
        lambda bad: argv(command, files, {bad[0]: bad}))

    @settings(max_examples=10, **SETTINGS)  # type: ignore[arg-type]
    @given(words=drawn)
    def run(words: list[str]) -> None:
        full = [*name.split(), *words]
        result = invoke(full, seconds=30)
        check(full, result)
        assert result.exit_code == 2, full

    run()
