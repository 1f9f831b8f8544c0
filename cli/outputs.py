"""Checks of output paths before any work is done: a command that will write a file says at
once, in one line, when it cannot (a missing folder, a folder named as the file, no write
permission, a plot format matplotlib does not write, no matplotlib installed), instead of
failing after the work."""

from __future__ import annotations

import os
from pathlib import Path

import click

# matplotlib's Agg/PDF/SVG/PS backends (what plot_comparison can save without a display).
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff",
                 ".webp")


def writable_file(path: Path | str, flag: str) -> Path:
    """``path`` if it can be written; else a ClickException (exit 1) naming the flag, the
    value and the fix."""
    target = Path(path).expanduser()
    folder = target.parent if str(target.parent) else Path(".")
    problem = None
    if target.is_dir():
        problem = "it is a folder"
    elif not folder.is_dir():
        problem = f"the folder {str(folder)!r} does not exist"
    elif not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        problem = "it is not writable"
    if problem is not None:
        raise click.ClickException(
            f"{flag}={str(path)!r}: cannot write there ({problem}); pass a writable file path")
    return target


def plot_file(path: Path | str, flag: str = "--plot") -> Path:
    from kvtune.tuner.simulator import plot

    if not plot.matplotlib_installed():
        raise click.ClickException(f"{flag}={str(path)!r}: {plot.PLOT_EXTRA_MISSING}")
    target = writable_file(path, flag)
    if target.suffix.lower() not in PLOT_SUFFIXES:
        raise click.ClickException(
            f"{flag}={str(path)!r}: unknown image format {target.suffix or '(none)'!r}; end "
            f"the name with one of {', '.join(PLOT_SUFFIXES)}")
    return target
