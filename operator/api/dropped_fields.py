"""Fields of a spec the API server dropped (issue 25 item 5): say so, never run without them
silently.

The CRD's structural schema prunes a field it does not know (``ttftP99`` for ``ttftP95``, a
typo'd ``replica``). Kubernetes 1.35 refuses it only when the client asks for strict field
validation (kubectl apply's default); under ``fieldValidation=Warn`` (the API's default when
a client sends none, as most client libraries do) it stores the object without the field
and returns only a warning header, which a pipeline rarely shows. The operator never sees a
pruned field in the object, but a client-side ``kubectl apply`` (and tools that work like
it) keeps what was applied in the ``kubectl.kubernetes.io/last-applied-configuration``
annotation: a field there that the spec's schema does not have is a field the user believes
in and kvtune does not run. Server-side apply keeps nothing of a pruned field; there the
warning is all there is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kvtune.operator.api import InferenceDeploymentSpec

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _at(spec: Any, loc: tuple[Any, ...]) -> tuple[bool, Any]:
    node = spec
    for key in loc:
        present = (key in node) if isinstance(node, Mapping) else (
            isinstance(node, list) and isinstance(key, int) and key < len(node))
        if not present:
            return False, None
        node = node[key]
    return True, node


def _path(loc: tuple[Any, ...]) -> str:
    out = "spec"
    for key in loc:
        out += f"[{key}]" if isinstance(key, int) else f".{key}"
    return out


def dropped_fields(body: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(field path, value) of each field the last client-side apply sent in ``spec`` that
    the schema does not know and the stored object lacks; [] when nothing says so."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(LAST_APPLIED)
    if not isinstance(raw, str):
        return []
    try:
        applied = json.loads(raw)
        InferenceDeploymentSpec.model_validate(applied.get("spec"))
        return []
    except ValidationError as exc:
        errors = exc.errors()
    except (ValueError, RecursionError, AttributeError):  # not ours to judge: no claim
        return []
    stored = body.get("spec") or {}
    out = []
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden" and not _at(stored, loc)[0]:
            out.append((_path(loc), err.get("input")))
    return out
