"""Click parameter types with the bounds every command shares, so a bad value is a usage error
(exit 2, one line naming the option, the value and the range) before any work starts.

click's ``FloatRange`` lets ``nan`` through (every comparison with nan is false) and takes
``inf``: a NaN SLO or offload size then failed deep in the tuner with a traceback, and an
infinite one was silently taken as "no limit". ``Finite`` refuses both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

# A TCP port number; 0 asks the kernel for a free one.
PORT = click.IntRange(0, 65535)


class Finite(click.FloatRange):
    """A ``FloatRange`` of finite numbers (no nan, no ±inf); ``fix`` is added to the error
    when the number is out of range (what to pass instead)."""

    name = "float"

    def __init__(self, min: float | None = None, max: float | None = None,
                 min_open: bool = False, max_open: bool = False, fix: str = "") -> None:
        super().__init__(min=min, max=max, min_open=min_open, max_open=max_open)
        self.fix = fix

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; pass one in the range "
                      f"{self._describe_range()}", param, ctx)
        try:
            return super().convert(number, param, ctx)
        except click.BadParameter as exc:
            if not self.fix:
                raise
            self.fail(f"{exc.message.rstrip('.')}: {self.fix}", param, ctx)


def finite(min: float | None = None, max: float | None = None, min_open: bool = False,
           max_open: bool = False, fix: str = "") -> Finite:
    return Finite(min=min, max=max, min_open=min_open, max_open=max_open, fix=fix)


POSITIVE = finite(min=0, min_open=True)
NON_NEGATIVE = finite(min=0)


class TimedTrace(click.ParamType[tuple[float, Path]]):
    """``TRACE@SECONDS`` (replay's ``--then``): an existing trace file and a finite,
    non-negative delay; checked when the options are parsed, so a typo fails before the
    server starts (it used to fail in a timer thread, which never exited)."""

    name = "TRACE@SECONDS"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        text = str(value)
        path, sep, secs = text.rpartition("@")
        if not sep or not path:
            self.fail(f"{text!r}: expected TRACE@SECONDS, e.g. trace.jsonl@60", param, ctx)
        try:
            seconds = float(secs)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds >= 0):
            self.fail(f"{text!r}: SECONDS must be a number >= 0, e.g. {path}@60", param, ctx)
        if not Path(path).is_file():
            self.fail(f"{text!r}: no such file {path!r}; pass an existing Azure CSV or "
                      "Mooncake JSONL trace", param, ctx)
        return (seconds, Path(path))


class TensorParallelOrAuto(click.ParamType[int | str]):
    """``--tp``: a positive integer, or ``auto`` (kvtune plan chooses the degree and the
    replicas, ``kvtune.tuner.planner.tp_choice``)."""

    name = "INTEGER|auto"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, int) or str(value).strip().lower() == "auto":
            return value if isinstance(value, int) else "auto"
        try:
            number = int(str(value))
        except ValueError:
            number = 0
        if number < 1:
            self.fail(f"{value!r} is neither a positive integer nor auto; pass 1, 2, 4, 8 or "
                      "auto", param, ctx)
        return number
