"""Bounds on a spec's durations and labels, said once for the CRD (CEL) and pydantic (issue 25
item 5): a value the API server admits is one the operator can use, and the operator never
trusts what it did not check itself (an object admitted under an older CRD).

- **Durations.** Each has a range where it means something: a 1 ms progress deadline is not
  a deadline (the Deployment's is whole seconds), an 11,000-year Prometheus window is a
  query Prometheus must not receive every tick. ``DURATION_BOUNDS`` holds them by field.
- **Labels** a tenant adds to objects kvtune renders (``spec.monitoring``'s labels,
  ``spec.pools[].nodeSelector``): keys and values the API server accepts as labels (else
  every apply fails), and no key in kvtune's own prefixes (``kvtune.io/``,
  ``app.kubernetes.io/``): kvtune selects on those, and a tenant's value would break the
  selection or claim another object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import StringConstraints
from pydantic.alias_generators import to_camel

from kvtune.operator.api.durations import parse_duration

# spec path -> (lowest, highest), both allowed, in the spec's own duration grammar.
DURATION_BOUNDS: dict[str, tuple[str, str]] = {
    "spec.slo.ttftP95": ("0s", "10m"),  # above 0s: SLOSpec's own rule
    "spec.slo.tpotP95": ("0s", "10s"),
    "spec.quality.calibration.timeout": ("1m", "24h"),
    # Below one scrape interval a rate has no samples; above 30 days Prometheus keeps none
    # by default (15 d retention) and each query scans the whole range.
    "spec.tuning.prometheus.window": ("10s", "720h"),
    "spec.tuning.retune.minInterval": ("0s", "720h"),
    "spec.tuning.retune.dwell": ("0s", "720h"),
    "spec.rollout.analysis": ("1s", "24h"),
    # The Deployment's progressDeadlineSeconds is whole seconds.
    "spec.rollout.progressDeadline": ("1s", "24h"),
    "spec.monitoring.scrape.interval": ("1s", "1h"),
}

# A label value the API server accepts (at most 63 characters).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]
# A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63.
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
RESERVED_LABEL_PREFIXES = ("kvtune.io/", "app.kubernetes.io/")


def duration_rules(prefix: str, *fields: str) -> list[tuple[str, str]]:
    """CEL (rule, message) pairs bounding ``fields`` (camelCase) of the object at
    ``prefix``."""
    rules = []
    for name in fields:
        lo, hi = DURATION_BOUNDS[f"{prefix}.{name}"]
        path = f"{prefix}.{name}".removeprefix("spec.")
        rules.append((f"!has(self.{name}) || (duration(self.{name}) >= duration('{lo}') && "
                      f"duration(self.{name}) <= duration('{hi}'))",
                      f"{path} must be between {lo} and {hi}; set a duration in that range"))
    return rules


def check_durations(model: Any, prefix: str, *fields: str) -> None:
    """Raise ValueError naming the first of ``fields`` (snake_case attributes of ``model``)
    outside its bounds."""
    for attr in fields:
        name = to_camel(attr)
        value = getattr(model, attr)
        if value is None:
            continue
        lo, hi = DURATION_BOUNDS[f"{prefix}.{name}"]
        seconds = parse_duration(value, field=f"{prefix}.{name}")
        if not parse_duration(lo, field=lo) <= seconds <= parse_duration(hi, field=hi):
            raise ValueError(f"{prefix}.{name}={value!r} must be between {lo} and {hi}; set a "
                             f"duration in that range")


def label_rules(prefix: str, name: str, *, reserved: bool) -> list[tuple[str, str]]:
    """CEL (rule, message) pairs for the map of labels ``name`` (camelCase) of the object at
    ``prefix``."""
    path = f"{prefix}.{name}".removeprefix("spec.")
    guard = f"!has(self.{name}) || self.{name}"
    pattern = LABEL_KEY_PATTERN.replace("\\", "\\\\")
    rules = [(f"{guard}.all(k, k.matches('{pattern}'))",
              f"{path}: a key is not a label key ([prefix/]name, the name at most 63 "
              f"characters of A-Z, a-z, 0-9, '-', '_', '.'); rename it")]
    if reserved:
        clause = " || ".join(f"k.startsWith('{p}')" for p in RESERVED_LABEL_PREFIXES)
        rules.append((f"{guard}.all(k, !({clause}))",
                      f"{path}: keys under {', '.join(RESERVED_LABEL_PREFIXES)} are kvtune's "
                      f"own (it selects on them); remove the key or use another prefix"))
    return rules


def check_labels(labels: Mapping[str, str] | None, path: str, *, reserved: bool) -> None:
    """Raise ValueError naming the first key the API server or kvtune would refuse."""
    for key in labels or {}:
        if not re.fullmatch(LABEL_KEY_PATTERN, key):
            raise ValueError(f"{path}[{key!r}] is not a label key ([prefix/]name, the name at "
                             f"most 63 characters of A-Z, a-z, 0-9, '-', '_', '.'); rename it")
        if reserved and key.startswith(RESERVED_LABEL_PREFIXES):
            raise ValueError(f"{path}[{key!r}]: keys under "
                             f"{', '.join(RESERVED_LABEL_PREFIXES)} are kvtune's own (it selects "
                             f"on them); remove the key or use another prefix")


def label_problem(labels: Mapping[Any, Any]) -> str | None:
    """``[key]=value: why`` for the first label the API server would refuse; None if none."""
    for key, value in labels.items():
        if not isinstance(key, str) or not re.fullmatch(LABEL_KEY_PATTERN, key):
            return f"[{key!r}]: not a label key ([prefix/]name, the name at most 63 characters)"
        if not isinstance(value, str) or len(value) > 63 \
                or not re.fullmatch(LABEL_VALUE_PATTERN, value):
            return (f"[{key!r}]={value!r}: not a label value (a string of at most 63 "
                    f"characters of A-Z, a-z, 0-9, '-', '_', '.', alphanumeric at both ends)")
    return None

