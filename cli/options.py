"""Click options derived from the knob table (``kvtune.tuner.knobs``): one ``--<flag>`` per
pinnable knob, typed and documented from its row, so a new knob is a new option without
touching the commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvtune.tuner.knobs import PINNABLE, Knob
from kvtune.tuner.planner.policy import Pins

F = TypeVar("F", bound=Callable[..., Any])


def _option(knob: Knob) -> Callable[[F], F]:
    unit = f" ({knob.unit})" if knob.unit and knob.unit != "fraction" else ""
    help_ = f"Pin {knob.flag}: {knob.doc}{unit}."
    if knob.type is bool:
        return click.option(f"{knob.option}/--no-{knob.flag}", knob.name, default=None,
                            help=help_)
    kind: click.ParamType[Any] | type[str]
    if knob.type is int:
        kind = click.IntRange(min=1)
    elif knob.type is float and knob.unit == "fraction":
        kind = click.FloatRange(0, 1, min_open=True)
    elif knob.type is float:
        kind = click.FloatRange(min=0)
    else:
        kind = str
    return click.option(knob.option, knob.name, type=kind, help=help_)


def pin_options(command: F) -> F:
    """Adds the pin options, in the table's order."""
    for knob in reversed(PINNABLE):
        command = _option(knob)(command)
    return command


def pins_from(opts: dict[str, Any]) -> Pins:
    return Pins(**{k.name: opts[k.name] for k in PINNABLE})


# --- one spelling per concept across subcommands (issue 14 item 12) ---------------------------


def model_option(dest: str = "model", required: bool = False, help_: str = "") -> Callable[[F], F]:
    return click.option("-m", "--model", dest, required=required,
                        help=help_ or "Catalog id (Hugging Face id, or its last part) or a path "
                        "to a config.json.")


def gpu_option(dest: str = "gpu", required: bool = False, help_: str = "") -> Callable[[F], F]:
    from kvtune.tuner.facts.gpus import list_gpu_classes

    return click.option("-g", "--gpu", dest, required=required,
                        help=(help_ + " " if help_ else "") + "GPU class: "
                        + ", ".join(list_gpu_classes()) + " (or a node label value, or a "
                        "custom class 'NAME:memory=...,bandwidth=...,bf16=...,cc=M.m').")


def tp_option(dest: str = "tp") -> Callable[[F], F]:
    # --tensor-parallel: replay's former spelling, kept as a second name.
    return click.option("--tp", "--tensor-parallel", dest, type=click.IntRange(min=1),
                        default=1, show_default=True,
                        help="Tensor-parallel degree (GPUs per replica).")


def weights_dtype_option() -> Callable[[F], F]:
    from kvtune.tuner.facts.weights import WEIGHTS_DTYPES

    return click.option("--weights-dtype", type=click.Choice(WEIGHTS_DTYPES,
                        case_sensitive=False), default="auto", show_default=True,
                        help="auto: the checkpoint's own; others quantize or widen as vLLM "
                        "loads them.")
