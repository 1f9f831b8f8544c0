"""The one declarative table of the knobs kvtune sets on vLLM (issue 10 item 1).

Each ``Knob`` says its name (the field of ``KVPlan`` and ``Pins``, snake_case), its type and
unit, the ``vllm serve`` flag, whether a human may pin it, what change counts as material for a
re-tune, and one doc line. From this table derive: the rendered flags (``plan_args``,
``serve_args``: one path for ``kvtune plan -o json|args``, the operator's Deployment and the
runtime entrypoint), the CLI's pin options (``cli/options.py``), the CRD's descriptions of the
pins and status plan fields (``operator/api/schema_base.py``), a pin's field path in the
operator's messages (``operator/api/tuning_spec.py: pin_path``), the retune's significance
test (``material_changes``) and replay's flag parser (``FLAG_TO_NAME``).

The five classes that carry the knobs as typed fields (``KVPlan``, ``Pins``, the CRD's
``PinSpec``, the status' ``PlanStatus`` and the runtime's ``RuntimeKnobs``) take their fields
from generated modules (``scripts/gen_knob_fields.py``, ``make knob-fields``; a test fails
while they are stale): the type, whether a plan always sets it, the bounds and the CRD
spelling come from a row here.

Adding a knob: a row here (with its bounds), ``make knob-fields``, and its decision module
``tuner/planner/decide_<knob>.py``.

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
# A bound on a knob's value, as pydantic's ``Field`` takes it: ("gt", 0) is ``gt=0``.
Bound = tuple[Literal["gt", "ge", "le"], int | float]

# Upper bounds on pins: beyond any model, GPU or node kvtune plans for, so a typo (an extra
# zero, a value in the wrong unit) fails at the boundary instead of sizing a plan, a
# simulation or a pod's memory from it. Tokens: 2**24, above the longest context of any
# catalog model (Llama 4 Scout's 10,485,760). Sequences: 100x vLLM's largest default.
# Offload: 64 TiB across the TP ranks, the CRD's bound.
MAX_PIN_TOKENS = 1 << 24
MAX_PIN_SEQUENCES = 100_000
MAX_PIN_OFFLOAD_GIB = 65536.0

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
    # Whether every plan sets it (then every KVPlan(...) names it); if not, an unset value is
    # None (a switch's is False), so a new knob is optional unless its row says otherwise.
    required: bool = False
    # vLLM's own bounds on the value (``CacheConfig``, ``SchedulerConfig``): a plan's and
    # the runtime's copy check them.
    bounds: tuple[Bound, ...] = ()
    # A pin's bounds (``Pins``), when not ``bounds``: an upper bound against typos.
    pin_bounds: tuple[Bound, ...] | None = None
    # The CRD's bounds on the pin (``PinSpec``), when not the pin's: kept as the CRD has them.
    crd_bounds: tuple[Bound, ...] | None = None
    # The CRD's type for the pin when not ``type``: a Literal of what the pinned vLLM accepts
    # (its name in ``operator/api/schema_base.py``).
    crd_type: str | None = None

    @property
    def option(self) -> str:
        """The CLI option that pins it (``--block-size``)."""
        return f"--{self.cli_option or self.flag}"

    @property
    def pin_limits(self) -> tuple[Bound, ...]:
        """The bounds a pin of it is checked against (``Pins``)."""
        return self.bounds if self.pin_bounds is None else self.pin_bounds

    @property
    def crd_limits(self) -> tuple[Bound, ...]:
        """The bounds the CRD puts on a pin of it (``PinSpec``)."""
        return self.pin_limits if self.crd_bounds is None else self.crd_bounds


_POSITIVE: tuple[Bound, ...] = (("gt", 0),)
_FRACTION: tuple[Bound, ...] = (("gt", 0.0), ("le", 1.0))
_TOKENS_PIN: tuple[Bound, ...] = (("gt", 0), ("le", MAX_PIN_TOKENS))
_TOKENS_CRD: tuple[Bound, ...] = (("ge", 1), ("le", 10_000_000))


# In the order the flags render (the weights flags first, then the KV cache's).
KNOBS: tuple[Knob, ...] = (
    Knob("dtype", "dtype", str, "", "the dtype vLLM runs the model in, when not the "
         "checkpoint's (from the weights dtype)", pinnable=False),
    Knob("quantization", "quantization", str, "", "load-time quantization method (from the "
         "weights dtype)", pinnable=False),
    Knob("allow_deprecated_quantization", "allow-deprecated-quantization", bool, "",
         "lets vLLM load a deprecated quantization method", pinnable=False,
         bool_style="switch"),
    Knob("block_size", "block-size", int, "tokens", "tokens per KV-cache block", required=True,
         bounds=_POSITIVE, pin_bounds=_TOKENS_PIN, crd_bounds=(("ge", 16), ("le", 1024))),
    Knob("kv_cache_dtype", "kv-cache-dtype", str, "", "KV-cache element dtype (vLLM's "
         "--kv-cache-dtype values)", required=True, crd_type="KVCacheDtype"),
    Knob("kv_cache_memory_bytes", "kv-cache-memory-bytes", int, "bytes",
         "exact KV-cache bytes per GPU (vLLM then skips profiling and ignores "
         "gpu-memory-utilization)", material="relative", margin=0.05,
         bounds=_POSITIVE, crd_bounds=(("ge", 1), ("le", 2**40))),  # 1 TiB a GPU
    Knob("gpu_memory_utilization", "gpu-memory-utilization", float, "fraction",
         "fraction of GPU memory vLLM may use", material="absolute", margin=0.02, fmt=_g4,
         yields_to="kv_cache_memory_bytes", required=True, bounds=_FRACTION),
    Knob("max_model_len", "max-model-len", int, "tokens", "the longest sequence (prompt + "
         "output) a request may have", material="relative", margin=0.10, required=True,
         bounds=_POSITIVE, pin_bounds=_TOKENS_PIN, crd_bounds=_TOKENS_CRD),
    Knob("max_num_seqs", "max-num-seqs", int, "sequences", "sequences running at once",
         material="relative", margin=0.20, required=True, bounds=_POSITIVE,
         pin_bounds=(("gt", 0), ("le", MAX_PIN_SEQUENCES)),
         crd_bounds=(("ge", 1), ("le", MAX_PIN_SEQUENCES))),
    Knob("max_num_batched_tokens", "max-num-batched-tokens", int, "tokens",
         "tokens scheduled per engine step (prefill chunk + decodes)", material="relative",
         margin=0.25, required=True, bounds=_POSITIVE, pin_bounds=_TOKENS_PIN,
         crd_bounds=_TOKENS_CRD),
    Knob("enable_prefix_caching", "enable-prefix-caching", bool, "",
         "reuse KV blocks of shared prompt prefixes", required=True),
    # A pin of 0 GiB turns offload off (a plan then leaves it unset).
    Knob("kv_offloading_size_gib", "kv-offloading-size", float, "GiB",
         "KV offload to CPU memory, GiB across TP ranks (0: off)", camel="kvOffloadingSizeGiB",
         fmt=_g, bounds=(("gt", 0.0),),
         pin_bounds=(("ge", 0.0), ("le", MAX_PIN_OFFLOAD_GIB))),
    Knob("kv_offloading_backend", "kv-offloading-backend", str, "", "the KV offload backend",
         pinnable=False, requires="kv_offloading_size_gib"),
    Knob("attention_backend", "attention-backend", str, "", "the attention backend (vLLM "
         "picks one when unset)", crd_type="AttentionBackend"),
)

# The order of the fields of KVPlan and its copies, so of every plan's dump (the plan corpus,
# stored plans, status and the CRD keep it): these first, as they were before the table
# existed, then any newer knob in the table's order (appending keeps old dumps a prefix).
_FIRST_FIELDS = ("block_size", "kv_cache_dtype", "gpu_memory_utilization",
                 "kv_cache_memory_bytes", "max_model_len", "max_num_seqs",
                 "max_num_batched_tokens", "enable_prefix_caching", "kv_offloading_size_gib",
                 "kv_offloading_backend", "attention_backend", "dtype", "quantization",
                 "allow_deprecated_quantization")
BY_NAME: Mapping[str, Knob] = {k.name: k for k in KNOBS}
PINNABLE: tuple[Knob, ...] = tuple(k for k in KNOBS if k.pinnable)
FIELD_ORDER: tuple[Knob, ...] = (
    *(BY_NAME[n] for n in _FIRST_FIELDS),
    *(k for k in KNOBS if k.name not in _FIRST_FIELDS),
)
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
