"""The one declarative table of the knobs kvtune sets on vLLM (issue 10 item 1).

Each ``Knob`` says its name (the field of ``KVPlan`` and ``Pins``, snake_case), its type and
unit, the ``vllm serve`` flag, whether a human may pin it, what change counts as material for a
re-tune, and one doc line. From this table derive: the rendered flags (``plan_args``,
``serve_args``: one path for ``kvtune plan -o json|args``, the operator's Deployment and the
runtime entrypoint), the CLI's pin options (``cli/options.py``), the CRD's pins and the status
plan fields (``operator/api/tuning_spec.py`` and ``pool_status.py`` build them from
``PINNABLE`` / ``KNOBS``), the retune's
significance test (``material_changes``) and replay's flag parser (``FLAG_TO_NAME``).

Adding a knob: a row here, the field on ``KVPlan`` (and, when pinnable, ``Pins``; tests check
both against this table), and its decision module ``tuner/planner/decide_<knob>.py``.

Standard library only: the runtime entrypoint (in the vLLM image, without kvtune's
dependencies) imports this module too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

# How a change of the knob's value counts for a re-tune (operator/retune/decide.py): "any" change,
# a "relative" change above the margin, an "absolute" change above the margin.
MaterialKind = Literal["any", "relative", "absolute"]
# How a bool renders: "paired" (--flag / --no-flag) or "switch" (--flag when true, else nothing).
BoolStyle = Literal["paired", "switch"]
KnobType = type[int] | type[float] | type[str] | type[bool]

TENSOR_PARALLEL_FLAG = "tensor-parallel-size"


def _plain(value: object) -> str:
    return str(value)


def _g4(value: object) -> str:
    return f"{value:.4g}"


def _g(value: object) -> str:
    return f"{value:g}"


@dataclass(frozen=True, slots=True)
class Knob:
    name: str  # field of KVPlan (and Pins), snake_case
    flag: str  # vllm serve flag, without the leading dashes
    type: KnobType
    unit: str  # "tokens", "bytes", "GiB", "fraction", "" (a name or a switch)
    doc: str  # one line: what it is, for the CLI's help and the CRD's description
    pinnable: bool = True
    material: MaterialKind = "any"
    margin: float = 0.0  # for "relative" (a fraction of the old value) and "absolute"
    # The CRD / status spelling when to_camel(name) is not it.
    camel: str | None = None
    fmt: Callable[[object], str] = _plain
    bool_style: BoolStyle = "paired"
    # Rendered only when this other knob is set (kv offload backend needs a size).
    requires: str | None = None
    # Not rendered when this other knob is set (vLLM ignores the fraction given the bytes).
    yields_to: str | None = None
    # What the CLI calls the option when it is not the flag (kept for compatibility).
    cli_option: str | None = None

    @property
    def option(self) -> str:
        """The CLI option that pins it (``--block-size``)."""
        return f"--{self.cli_option or self.flag}"


# In the order the flags render (the weights flags first, then the KV cache's).
KNOBS: tuple[Knob, ...] = (
    Knob("dtype", "dtype", str, "", "the dtype vLLM runs the model in, when not the "
         "checkpoint's (from the weights dtype)", pinnable=False),
    Knob("quantization", "quantization", str, "", "load-time quantization method (from the "
         "weights dtype)", pinnable=False),
    Knob("allow_deprecated_quantization", "allow-deprecated-quantization", bool, "",
         "lets vLLM load a deprecated quantization method", pinnable=False,
         bool_style="switch"),
    Knob("block_size", "block-size", int, "tokens", "tokens per KV-cache block"),
    Knob("kv_cache_dtype", "kv-cache-dtype", str, "", "KV-cache element dtype (vLLM's "
         "--kv-cache-dtype values)"),
    Knob("kv_cache_memory_bytes", "kv-cache-memory-bytes", int, "bytes",
         "exact KV-cache bytes per GPU (vLLM then skips profiling and ignores "
         "gpu-memory-utilization)", material="relative", margin=0.05),
    Knob("gpu_memory_utilization", "gpu-memory-utilization", float, "fraction",
         "fraction of GPU memory vLLM may use", material="absolute", margin=0.02, fmt=_g4,
         yields_to="kv_cache_memory_bytes"),
    Knob("max_model_len", "max-model-len", int, "tokens", "the longest sequence (prompt + "
         "output) a request may have", material="relative", margin=0.10),
    Knob("max_num_seqs", "max-num-seqs", int, "sequences", "sequences running at once",
         material="relative", margin=0.20),
    Knob("max_num_batched_tokens", "max-num-batched-tokens", int, "tokens",
         "tokens scheduled per engine step (prefill chunk + decodes)", material="relative",
         margin=0.25),
    Knob("enable_prefix_caching", "enable-prefix-caching", bool, "",
         "reuse KV blocks of shared prompt prefixes"),
    Knob("kv_offloading_size_gib", "kv-offloading-size", float, "GiB",
         "KV offload to CPU memory, GiB across TP ranks (0: off)", camel="kvOffloadingSizeGiB",
         fmt=_g),
    Knob("kv_offloading_backend", "kv-offloading-backend", str, "", "the KV offload backend",
         pinnable=False, requires="kv_offloading_size_gib"),
    Knob("attention_backend", "attention-backend", str, "", "the attention backend (vLLM "
         "picks one when unset)"),
)

BY_NAME: Mapping[str, Knob] = {k.name: k for k in KNOBS}
PINNABLE: tuple[Knob, ...] = tuple(k for k in KNOBS if k.pinnable)
# vllm serve flag (without dashes) -> knob name; "no-" spellings of paired bools included.
FLAG_TO_NAME: Mapping[str, str] = {
    **{k.flag: k.name for k in KNOBS},
    **{f"no-{k.flag}": k.name for k in KNOBS if k.type is bool and k.bool_style == "paired"},
}


def choice_text(value: object) -> str:
    """A knob's value as reasons and flags spell it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def camel_name(knob: Knob) -> str:
    """The CRD / status spelling of a knob (``blockSize``, ``kvOffloadingSizeGiB``)."""
    if knob.camel:
        return knob.camel
    head, *rest = knob.name.split("_")
    return head + "".join(p.title() for p in rest)


def _rendered(knob: Knob, value: object) -> list[str]:
    if knob.type is bool:
        if value:
            return [f"--{knob.flag}"]
        return [f"--no-{knob.flag}"] if knob.bool_style == "paired" else []
    return [f"--{knob.flag}={knob.fmt(value)}"]


def plan_args(values: Mapping[str, object]) -> list[str]:
    """The ``vllm serve`` flags of a plan's knob values (a ``KVPlan`` dump), in table order:
    ``None`` is not rendered, nor a knob whose ``requires`` is unset or whose ``yields_to``
    is set."""
    args: list[str] = []
    for knob in KNOBS:
        value = values.get(knob.name)
        if value is None:
            continue
        if knob.requires is not None and values.get(knob.requires) is None:
            continue
        if knob.yields_to is not None and values.get(knob.yields_to) is not None:
            continue
        args += _rendered(knob, value)
    return args


def serve_args(tensor_parallel: int, values: Mapping[str, object]) -> list[str]:
    """Everything after ``vllm serve MODEL`` that a pool's plan sets: TP, then the knobs."""
    return [f"--{TENSOR_PARALLEL_FLAG}={tensor_parallel}", *plan_args(values)]


def _rel(a: float, b: float) -> float:
    return abs(b - a) / max(abs(a), 1e-9)


def material_changes(old: Mapping[str, object], new: Mapping[str, object]
                     ) -> tuple[list[str], list[str]]:
    """The changed knobs of two plans (``KVPlan`` dumps) that matter, and those too small to
    count, each as ``"name old -> new"`` (with the change and margin where one applies)."""
    material: list[str] = []
    noise: list[str] = []
    for knob in KNOBS:
        a, b = old.get(knob.name), new.get(knob.name)
        if a == b:
            continue
        text = f"{knob.name} {a} -> {b}"
        if knob.material == "any" or a is None or b is None:
            material.append(text)
            continue
        assert isinstance(a, int | float) and isinstance(b, int | float), (knob.name, a, b)
        if knob.material == "relative":
            change = _rel(a, b)
            text += f" ({change:+.0%}, margin {knob.margin:.0%})"
        else:
            change = abs(b - a)
            text += f" ({b - a:+g}, margin {knob.margin:g})"
        (material if change > knob.margin else noise).append(text)
    return material, noise
