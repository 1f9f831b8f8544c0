"""Writes the knob fields of the five classes that carry the knobs as typed fields, from the knob
table (``kvtune.tuner.knobs``), so that mypy --strict sees each field's type and a new knob is a
row in the table, not five hand-typed fields kept in agreement by tests.

    .venv/bin/python scripts/gen_knob_fields.py            # write them (`make knob-fields`)
    .venv/bin/python scripts/gen_knob_fields.py --check    # exit 1 naming each stale module

Each generated module holds one base class with the fields only; the class itself
(``KVPlan``, ``Pins``, ``PinSpec``, ``PlanStatus``, ``RuntimeKnobs``) subclasses it and keeps
its config, validators and methods. The fields come in ``knobs.FIELD_ORDER`` (a plan's dump
order: the plan corpus, stored plans, status and the CRD keep it). What differs per class:

- ``plan`` (``KVPlan``) and ``runtime`` (``RuntimeKnobs``): vLLM's bounds; a knob every plan
  sets has no default, the others default to None (a switch to False);
- ``status`` (``PlanStatus``): the same fields without bounds (status reports, it does not
  judge), with the CRD's spelling;
- ``pins`` (``Pins``) and ``crd`` (``PinSpec``): the pinnable knobs, each None unless pinned,
  with the pin's bounds (the CRD's keep the CRD's schema as it was) and, for the CRD, the
  Literal types of what the pinned vLLM accepts.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic.alias_generators import to_camel

from kvtune.tuner.knobs import FIELD_ORDER, Bound, Knob, camel_name

REPO = Path(__file__).resolve().parents[1]
Variant = Literal["plan", "runtime", "status", "pins", "crd"]
_WIDTH = 100


@dataclass(frozen=True)
class Target:
    path: str  # relative to the repository
    owner: str  # the class that subclasses the generated one
    cls: str
    variant: Variant
    base_module: str  # where the base class comes from
    base: str


TARGETS: tuple[Target, ...] = (
    Target("tuner/plan_fields.py", "KVPlan", "KVPlanFields", "plan",
           "pydantic", "BaseModel"),
    Target("tuner/planner/pin_fields.py", "Pins", "PinsFields", "pins",
           "pydantic", "BaseModel"),
    Target("operator/api/pin_spec_fields.py", "PinSpec", "PinSpecFields", "crd",
           "kvtune.operator.api.schema_base", "_Model"),
    Target("operator/api/plan_status_fields.py", "PlanStatus", "PlanStatusFields", "status",
           "kvtune.operator.api.schema_base", "_Status"),
    Target("runtime_images/entrypoint/knob_fields.py", "RuntimeKnobs", "RuntimeKnobsFields",
           "runtime", "pydantic", "BaseModel"),
)


def _bounds(knob: Knob, variant: Variant) -> tuple[Bound, ...]:
    if variant in ("plan", "runtime"):
        return knob.bounds
    if variant == "pins":
        return knob.pin_limits
    if variant == "crd":
        return knob.crd_limits
    return ()


def _alias(knob: Knob, variant: Variant) -> str | None:
    """The CRD spelling where the camelCase classes' alias generator would not give it."""
    if variant in ("status", "crd", "runtime") and camel_name(knob) != to_camel(knob.name):
        return camel_name(knob)
    return None


def _type_name(knob: Knob, variant: Variant) -> str:
    if variant == "crd" and knob.crd_type is not None:
        return knob.crd_type
    return knob.type.__name__


def _number(limit: int | float) -> str:
    """A bound as source: floats as Python writes them (the CRD's schema keeps 0.0 vs 0),
    large ints with underscores."""
    return f"{limit:_}" if isinstance(limit, int) else repr(limit)


def field_line(knob: Knob, variant: Variant) -> str:
    """``name: type = default`` of one knob in one class (without indent or comment)."""
    optional = variant in ("pins", "crd") or not knob.required
    switch = knob.type is bool and knob.bool_style == "switch" and variant not in ("pins", "crd")
    annotation = _type_name(knob, variant) + (" | None" if optional and not switch else "")
    args = [f"{op}={_number(limit)}" for op, limit in _bounds(knob, variant)]
    alias = _alias(knob, variant)
    if alias is not None:
        args.append(f"alias={alias!r}".replace("'", '"'))
    default = "False" if switch else "None" if optional else None
    if not args:
        return f"{knob.name}: {annotation}" + ("" if default is None else f" = {default}")
    if default is not None:
        args.insert(0, f"default={default}")
    return f"{knob.name}: {annotation} = Field({', '.join(args)})"


def _field_block(knob: Knob, variant: Variant) -> list[str]:
    unit = f" ({knob.unit})" if knob.unit and knob.unit != "fraction" else ""
    comment = textwrap.wrap(f"{knob.doc}{unit}; vLLM --{knob.flag}", _WIDTH - 6,
                            break_on_hyphens=False, break_long_words=False)
    lines = [f"    # {c}" for c in comment]
    line = "    " + field_line(knob, variant)
    if len(line) > _WIDTH and "= Field(" in line:
        head, args = line.split("= Field(", 1)
        line = f"{head}= Field(\n        {args}"
    return [*lines, line]


def render(target: Target, order: Sequence[Knob] = FIELD_ORDER) -> str:
    """The generated module of ``target`` for the knobs ``order`` (the table's by default)."""
    variant = target.variant
    knobs = [k for k in order if k.pinnable or variant not in ("pins", "crd")]
    blocks = [_field_block(k, variant) for k in knobs]
    body = "\n".join(line for block in blocks for line in block)
    pydantic = ["BaseModel"] if target.base_module == "pydantic" else []
    if "Field(" in body:
        pydantic.append("Field")
    imports = ["from __future__ import annotations", ""]
    if pydantic:
        imports.append(f"from pydantic import {', '.join(pydantic)}")
    if target.base_module != "pydantic":
        types = sorted({k.crd_type for k in knobs if variant == "crd" and k.crd_type})
        imports += ["", f"from {target.base_module} import {', '.join([*types, target.base])}"]
    doc = (f'"""The knob fields of ``{target.owner}``, generated by scripts/gen_knob_fields.py '
           f'from the\nknob table (``kvtune.tuner.knobs``). Do not edit: change the table and '
           f'run `make knob-fields`\n(a test fails while this module is stale)."""')
    return "\n".join([
        doc, "", *imports, "", "",
        f"class {target.cls}({target.base}):", body, "",
    ])


def stale(targets: Sequence[Target] = TARGETS) -> list[str]:
    """The generated modules whose text is not what the table gives now."""
    out: list[str] = []
    for t in targets:
        path = REPO / t.path
        if not path.exists() or path.read_text() != render(t):
            out.append(t.path)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a generated module is stale")
    args = parser.parse_args(argv)
    if args.check:
        out = stale()
        for path in out:
            print(f"{path} is stale: run `make knob-fields` (scripts/gen_knob_fields.py)")
        return 1 if out else 0
    for t in TARGETS:
        (REPO / t.path).write_text(render(t))
        print(f"wrote {t.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
