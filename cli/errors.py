"""How every `kvtune` command fails: one line on stderr, ``Error: `` and a message that names
the option, the value and the fix; exit 2 for a usage error (a bad option, a missing one, a
value out of range: click's convention), exit 1 for a runtime failure (an input that cannot
work, a file that cannot be read, a cluster that does not answer).

Click prints a usage error as the usage line, a hint and the error (three lines); kvtune
prints the error and the hint on one line, so a script (or a person reading a CI log) finds
the whole story on the line that says ``Error:``. An exception no command expected is a bug:
it is one line too, naming the exception, unless ``KVTUNE_TRACEBACK=1`` asks for the
traceback to report."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

# Set (to anything) to see the traceback of an unexpected exception instead of one line.
TRACEBACK_ENV = "KVTUNE_TRACEBACK"
# The phrase of an unexpected exception's line (tests look for it: it is always a bug).
INTERNAL_ERROR = "internal error"
USAGE_EXIT_CODE = 2
RUNTIME_EXIT_CODE = 1


def one_line(message: str) -> str:
    """``message`` on one line: a multi-line text (a validation error, a wrapped path) has
    its lines joined, so the shell shows one error line."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def click_message(exc: click.ClickException) -> str:
    """The one line for a click exception; a usage error says where the help is."""
    text = one_line(exc.format_message())
    ctx = exc.ctx if isinstance(exc, click.UsageError) else None
    if ctx is not None and ctx.command.get_help_option(ctx) is not None:
        text += f" (see '{ctx.command_path} --help')"
    return text


def internal_message(exc: BaseException) -> str:
    detail = one_line(str(exc))[:300]
    return (f"{INTERNAL_ERROR}: {type(exc).__name__}" + (f": {detail}" if detail else "")
            + f"; this is a kvtune bug: rerun with {TRACEBACK_ENV}=1 and report the traceback")


def fail(message: str, exit_code: int) -> NoReturn:
    """Write ``Error: message`` (one line) to stderr and exit."""
    click.echo(f"Error: {one_line(message)}", err=True)
    sys.exit(exit_code)
