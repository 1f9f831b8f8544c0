"""The InferenceDeployment CRD, generated from the pydantic types in ``api``.

pydantic writes JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3.0 schema:
no ``$ref``, no ``anyOf`` around ``null`` (an optional field is simply not required), a
boolean ``exclusiveMinimum``, ``enum`` instead of ``const``. ``to_structural`` does that
conversion; everything else (CEL rules, printer columns) is added here.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from kvtune.operator import api

_DROP = {"title", "$defs"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        target.update(extra)
        return _resolve(target, defs)
    return {k: _resolve(v, defs) for k, v in node.items() if k not in _DROP}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    # Optional[X] -> X (absent means None); a null default carries no information.
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {options} structurally")
        merged = dict(options[0])
        merged.update(node)
        node = merged
    if node.get("default", 0) is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "enum" in node and "type" not in node:
        values = node["enum"]
        node["type"] = ("integer" if all(isinstance(v, int) for v in values) else "string")
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node and not isinstance(node[bound], bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    if node.get("type") == "integer":
        node.setdefault("format", "int64")
    # Defaults of nested objects belong to the nested schema, not repeated at the parent.
    if node.get("type") == "object" and isinstance(node.get("default"), dict):
        del node["default"]
    if node.get("type") == "array" and "maxItems" not in node and "maxLength" in node:
        node["maxItems"] = node.pop("maxLength")
    if node.get("type") == "object" and "additionalProperties" in node:
        if "maxLength" in node:
            node["maxProperties"] = node.pop("maxLength")
        if node["additionalProperties"] is False:
            del node["additionalProperties"]
    return {k: _structural(v) for k, v in node.items()}


def to_structural(model: type[Any]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model (by alias, validation mode)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _structural(_resolve(raw, defs))
    return schema


def _status_schema() -> dict[str, Any]:
    # Every field of status is typed: an untyped corner (x-kubernetes-preserve-unknown-fields)
    # is one a typed write cannot keep (the retune clocks were erased that way).
    schema: dict[str, Any] = to_structural(api.InferenceDeploymentStatus)
    return schema


def crd() -> dict[str, Any]:
    """The InferenceDeployment CustomResourceDefinition as a plain dict."""
    spec_schema = to_structural(api.InferenceDeploymentSpec)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND, "listKind": f"{api.KIND}List", "plural": api.PLURAL,
                "singular": api.SINGULAR, "shortNames": list(api.SHORT_NAMES),
                "categories": ["kvtune"],
            },
            "versions": [{
                "name": api.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
                    {"name": "Pools", "type": "string", "jsonPath": ".status.poolSummary"},
                    {"name": "Mode", "type": "string", "jsonPath": ".spec.tuning.mode"},
                    {"name": "Ready", "type": "string",
                     "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                    # Why it is (not) Ready, on `kubectl get infd` itself: the message last,
                    # after Age, since it is the long one.
                    {"name": "Reason", "type": "string",
                     "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    {"name": "Message", "type": "string",
                     "jsonPath": ".status.conditions[?(@.type==\"Ready\")].message"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "x-kubernetes-validations": [{
                        "rule": f"self.metadata.name.matches('{api.OBJECT_NAME_PATTERN}')",
                        "message": api.OBJECT_NAME_RULE,
                    }],
                    "description": "An LLM served by vLLM on one or more GPU pools, with its "
                                   "KV cache tuned by kvtune.",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema,
                        "status": _status_schema(),
                    },
                }},
            }],
        },
    }


def crd_yaml() -> str:
    header = ("# Generated by `kvtune crds --write` from the kvtune.operator.api package. "
              "Do not edit.\n")
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)


CRD_FILES: dict[str, Any] = {"inferencedeployments.kvtune.io.yaml": crd_yaml}
