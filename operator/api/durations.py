"""Durations as people write them in a spec: ``2s``, ``80ms``, ``6h``, ``1h30m``.

The same grammar is used twice: as the CRD's ``pattern`` (so the API server refuses a bad
value before the operator sees it) and by :func:`parse_duration` (so the operator never
trusts a value it did not check itself).
"""

from __future__ import annotations

import re

from kvtune.tuner.errors import InvalidInput

# One or more <number><unit> parts, largest unit first is not enforced (Go's time.ParseDuration
# does not either). Units: ms, s, m, h.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str, *, field: str) -> float:
    """Seconds in ``value``; raises InvalidInput naming ``field`` when it is not a duration."""
    if not isinstance(value, str) or not re.fullmatch(DURATION_PATTERN, value.strip()):
        raise InvalidInput(
            field, value,
            "not a duration; write a number and a unit (ms, s, m, h), e.g. '80ms', '2s', '6h'",
        )
    return sum(float(num) * _UNIT_SECONDS[unit] for num, unit in _PART.findall(value.strip()))
