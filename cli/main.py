"""The `kvtune` command. Each subcommand lives in its own module under ``cli/`` and is
imported only when it is called, so `kvtune plan` starts fast and does not need the
Kubernetes client, and a broken optional dependency breaks only its own command."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from kvtune.cli import errors

# name -> (module under kvtune.cli, attribute, one-line help)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": ("plan", "plan", "Plan the vLLM KV-cache configuration for one GPU pool, offline."),
    "simulate": ("simulate", "simulate", "Replay a trace through the KV-cache simulator."),
    "cluster": ("cluster", "cluster", "Start, stop or inspect the local control plane."),
    "demo": ("demo", "demo", "Run the local demo: control plane, Prometheus, operator, example."),
    "replay": ("replay", "replay", "Serve vLLM metrics by replaying a request trace."),
    "operator": ("operator_cmd", "operator", "Run the kvtune operator (kopf)."),
    "crds": ("crds", "crds", "Generate the CRD manifests from the API types."),
    "compile-simulator": ("compile_simulator", "compile_simulator",
                          "Compile the simulator's scheduler to C with mypyc (2-3x faster)."),
    "alerts": ("alerts", "alerts", "Render the SLO alert rules for an InferenceDeployment."),
    "quality": ("quality", "quality", "Measure what quantized KV dtypes do to a model."),
    "search-worker": ("search_worker", "search_worker",
                      "Run one pool's goodput search from a search document (a search Job)."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr, _ = entry
        module = importlib.import_module(f"kvtune.cli.{module_name}")
        command: Any = getattr(module, attr)
        assert isinstance(command, click.Command), f"kvtune.cli.{module_name}.{attr}"
        return command

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        """Click's main, with every failure as one line on stderr (errors.py): usage errors
        exit 2, runtime failures exit 1, and an unexpected exception is a one-line internal
        error rather than a traceback (``KVTUNE_TRACEBACK=1`` shows it)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            errors.fail("aborted", errors.RUNTIME_EXIT_CODE)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()  # a bare `kvtune` or `kvtune cluster`: the help, as click prints it
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            errors.fail(errors.click_message(exc), exc.exit_code)
        except Exception as exc:
            if os.environ.get(errors.TRACEBACK_ENV):
                raise
            errors.fail(errors.internal_message(exc), errors.RUNTIME_EXIT_CODE)
        # --help and --version end in ctx.exit(0), which non-standalone main returns.
        sys.exit(rv if isinstance(rv, int) else 0)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing help must not import every command (and its dependencies).
        rows = [(name, help_text) for name, (_, _, help_text) in sorted(_COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(package_name="kvtune")
def cli() -> None:
    """kvtune: tunes the vLLM KV cache per model and per GPU class from observed traffic."""
