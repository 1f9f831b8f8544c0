"""A three-way merge of status as written to the API (camelCase JSON), for ``status.rebase``.

``merge(base, ours, theirs)``: what ``ours`` changed from ``base``, applied to ``theirs``
(the status stored now, which other writers may have changed since ``base`` was read), as
git merges a branch. Where both changed one value, ours wins: the writer rebasing is the
later one. A mapping is merged key by key. A list of objects that all carry a distinct
``name`` (``pools``, ``profile.retune.pools``) is merged item by item, recursively; one whose
items carry a distinct ``type`` (``conditions``) item by item, each item whole (a condition's
status, reason and message belong together). Any other list is one value.

Worked example: the reconcile read conditions ``[Ready: True]`` (base) and writes
``[Ready: False]`` (ours); the retune timer has meanwhile stored
``[Ready: True, ProfileStale: True]`` (theirs). The merge is
``[Ready: False, ProfileStale: True]``: the timer's condition is not written back out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Keys that identify a list's items, and whether an item is merged field by field.
_ITEM_KEYS = (("name", True), ("type", False))
_ABSENT = object()


def merge(base: Mapping[str, Any], ours: Mapping[str, Any],
          theirs: Mapping[str, Any]) -> dict[str, Any]:
    """``theirs`` with ``ours``' changes from ``base`` applied (see the module docstring)."""
    out: dict[str, Any] = {}
    for key, mine in ours.items():
        value = _merge_value(base.get(key, _ABSENT), mine, theirs.get(key, _ABSENT))
        if value is not _ABSENT:
            out[key] = value
    for key, other in theirs.items():
        if key not in ours and key not in base:  # they added it; we did not remove it
            out[key] = other
    return out


def _merge_value(base: Any, ours: Any, theirs: Any) -> Any:
    if ours == base:  # ours did not change it: theirs stands (absent if they removed it)
        return theirs
    if theirs == base or theirs is _ABSENT or base is _ABSENT:
        return ours
    if isinstance(base, Mapping) and isinstance(ours, Mapping) and isinstance(theirs, Mapping):
        return merge(base, ours, theirs)
    if isinstance(base, list) and isinstance(ours, list) and isinstance(theirs, list):
        for key, recursive in _ITEM_KEYS:
            if all(_keyed(items, key) is not None for items in (base, ours, theirs)):
                return _merge_items(base, ours, theirs, key, recursive)
    return ours


def _keyed(items: list[Any], key: str) -> dict[Any, Mapping[str, Any]] | None:
    """The items by ``key``; None when one is no object, lacks the key or repeats it."""
    if not all(isinstance(i, Mapping) and key in i for i in items):
        return None
    by_key = {i[key]: i for i in items}
    return by_key if len(by_key) == len(items) else None


def _merge_items(base: list[Any], ours: list[Any], theirs: list[Any], key: str,
                 recursive: bool) -> list[Any]:
    """Item by item: ours' order, then the items they added."""
    was, now = _keyed(base, key) or {}, _keyed(theirs, key) or {}
    out: list[Any] = []
    for item in ours:
        k = item[key]
        before, other = was.get(k, _ABSENT), now.get(k, _ABSENT)
        if recursive and isinstance(before, Mapping) and isinstance(other, Mapping):
            out.append(merge(before, item, other))
            continue
        value = _merge_value(before, item, other)
        if value is not _ABSENT:
            out.append(value)
    mine = {item[key] for item in ours}
    out += [item for k, item in now.items() if k not in mine and k not in was]
    return out
