"""Progress on stderr for the commands whose work takes more than a second (`kvtune plan
--trace`'s capacity search, `kvtune simulate`'s replays, `kvtune quality`'s prompts).

One helper for all of them, so they look alike and obey one switch: progress is shown when
stderr is a terminal, or when ``--progress`` forces it (a log, a test); ``--no-progress``
hides it. It never goes to stdout, where ``-o json``/``-o args`` are a contract for scripts.

On a terminal each update rewrites one status line in place (``\\r``, then erase to the end
of the line) and ``close`` ends it; elsewhere every update is a line of its own, so a log
keeps the history. The commands report at a bounded number of points (every score of the
search, every 5% of a replay), so nothing here needs a clock.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])
# Erase from the cursor to the end of the line (ANSI EL), so a shorter update leaves no tail.
_ERASE_TO_END = "\x1b[K"


class Progress:
    """A status line on ``stream``. Call it with a message (the ``Callable[[str], None]``
    that ``kvtune.quality`` takes); ``close`` when the work is done."""

    def __init__(self, label: str, enabled: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = _isatty(self.stream)
        # None: the default, shown on a terminal only.
        self.enabled = self.interactive if enabled is None else enabled
        self._open_line = False
        self.updates = 0  # messages shown (tests count them)

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        text = f"[kvtune {self.label}] {message}"
        if self.interactive:
            self.stream.write("\r" + text + _ERASE_TO_END)
            self._open_line = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.updates += 1

    def counter(self, what: str) -> Callable[[int, int], None]:
        """A ``(done, total)`` hook that shows ``what: done/total``."""
        def show(done: int, total: int) -> None:
            self(f"{what}: {done:,}/{total:,}")
        return show

    def close(self) -> None:
        """Ends the status line on a terminal (the next output starts on a fresh line)."""
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


def progress_option() -> Callable[[F], F]:
    """``--progress/--no-progress`` (dest ``progress``): None unless given, which shows
    progress on a terminal only."""
    return click.option("--progress/--no-progress", "progress", default=None,
                        help="Show progress on stderr (default: only when stderr is a "
                        "terminal). Never written to stdout.")
