"""Click options derived from the knob table (``kvtune.tuner.knobs``): one ``--<flag>`` per
pinnable knob, typed and documented from its row, so a new knob is a new option without
touching the commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import annotated_types
import click

from kvtune.cli.params import Finite
from kvtune.tuner.errors import InvalidInput, KVTuneError
from kvtune.tuner.knobs import PINNABLE, Knob
from kvtune.tuner.planner.policy import Pins

F = TypeVar("F", bound=Callable[..., Any])


def _option(knob: Knob) -> Callable[[F], F]:
    unit = f" ({knob.unit})" if knob.unit and knob.unit != "fraction" else ""
    help_ = f"Pin {knob.flag}: {knob.doc}{unit}."
    if knob.type is bool:
        return click.option(f"{knob.option}/--no-{knob.flag}", knob.name, default=None,
                            help=help_)
    kind: click.ParamType[Any] | type[str] = str
    if knob.type in (int, float):
        kind = _range(knob)
    return click.option(knob.option, knob.name, type=kind, help=help_)


def _range(knob: Knob) -> click.ParamType[Any]:
    """The option's range: the ``Pins`` field's bounds (one source for the CLI, the
    operator's pins and the planner), finite for floats."""
    low: float | None = None
    high: float | None = None
    low_open = high_open = False
    for bound in Pins.model_fields[knob.name].metadata:
        if isinstance(bound, annotated_types.Gt):
            low, low_open = bound.gt, True  # type: ignore[assignment]
        elif isinstance(bound, annotated_types.Ge):
            low = bound.ge  # type: ignore[assignment]
        elif isinstance(bound, annotated_types.Lt):
            high, high_open = bound.lt, True  # type: ignore[assignment]
        elif isinstance(bound, annotated_types.Le):
            high = bound.le  # type: ignore[assignment]
    if knob.type is int:
        # An open integer bound is the next integer (gt=0 is min=1).
        return click.IntRange(
            min=None if low is None else int(low) + (1 if low_open else 0),
            max=None if high is None else int(high) - (1 if high_open else 0))
    return Finite(min=low, max=high, min_open=low_open, max_open=high_open)


def pin_options(command: F) -> F:
    """Adds the pin options, in the table's order."""
    for knob in reversed(PINNABLE):
        command = _option(knob)(command)
    return command


def pins_from(opts: dict[str, Any]) -> Pins:
    return Pins(**{k.name: opts[k.name] for k in PINNABLE})


# The planner's field names -> the options that set them, for its errors.
PLAN_FIELD_OPTIONS: dict[str, str] = {
    **{f"pins.{k.name}": k.option for k in PINNABLE},
    "tensor_parallel": "--tp",
    "data_parallel": "--dp",
    "expert_parallel": "--ep",
    "decode_context_parallel": "--dcp",
    "pipeline_parallel": "--pp",
    "nodes_per_replica": "--nodes-per-replica",
    "gpus_per_replica": "--gpus-per-replica",
    "policy.min_max_model_len_tokens": "--min-max-model-len",
}


def in_option_terms(exc: KVTuneError, options: dict[str, str] = PLAN_FIELD_OPTIONS) -> str:
    """The error's line, naming the option a user typed (``--max-num-batched-tokens=100``)
    where the tuner names its field (``pins.max_num_batched_tokens=100``)."""
    text = str(exc)
    if isinstance(exc, InvalidInput) and exc.field in options:
        prefix = f"{exc.field}={exc.value!r}: "
        if text.startswith(prefix):
            return f"{options[exc.field]}={exc.value!r}: {text.removeprefix(prefix)}"
    return text


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


def tp_option(dest: str = "tp", allow_auto: bool = False) -> Callable[[F], F]:
    # --tensor-parallel: replay's former spelling, kept as a second name.
    from kvtune.cli.params import TensorParallelOrAuto

    kind: click.ParamType[Any] = TensorParallelOrAuto() if allow_auto else click.IntRange(min=1)
    auto = (" auto: kvtune chooses the degree and the replicas for the lowest cost per good "
            "request (--max-replicas bounds them)." if allow_auto else "")
    return click.option("--tp", "--tensor-parallel", dest, type=kind,
                        default=1, show_default=True,
                        help="Tensor-parallel degree (GPUs per replica)." + auto)


def weights_dtype_option() -> Callable[[F], F]:
    from kvtune.tuner.facts.weights import WEIGHTS_DTYPES

    return click.option("--weights-dtype", type=click.Choice(WEIGHTS_DTYPES,
                        case_sensitive=False), default="auto", show_default=True,
                        help="auto: the checkpoint's own; others quantize or widen as vLLM "
                        "loads them.")
