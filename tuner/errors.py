"""Errors a user can act on: each names the field, the value, the limit and the fix."""

from __future__ import annotations


class KVTuneError(Exception):
    """Base of kvtune's user-facing errors."""


class UnknownName(KVTuneError):
    """A model id or GPU class that is not in the catalog; lists the close matches."""

    def __init__(self, field: str, value: str, close_matches: list[str], fix: str) -> None:
        self.field, self.value, self.close_matches = field, value, close_matches
        hint = f" Did you mean: {', '.join(close_matches)}?" if close_matches else ""
        super().__init__(f"{field}={value!r} is not known.{hint} {fix}")


class InvalidInput(KVTuneError):
    """A value that can never work (a bad pin, a malformed config.json)."""

    def __init__(self, field: str, value: object, message: str) -> None:
        self.field, self.value = field, value
        super().__init__(f"{field}={value!r}: {message}")


class NoFeasiblePlan(KVTuneError):
    """Nothing fits: quotes bytes needed and available and the smallest change that fits."""

    def __init__(
        self, message: str, needed_bytes: int, available_bytes: int, suggestions: list[str]
    ) -> None:
        self.needed_bytes, self.available_bytes, self.suggestions = (
            needed_bytes, available_bytes, suggestions
        )
        fixes = "; ".join(suggestions) if suggestions else "no single change fits"
        super().__init__(f"{message} Smallest changes that fit: {fixes}.")
