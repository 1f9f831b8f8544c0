"""Generate the chart's README.md and values.schema.json from values.yaml, the one source.

Each key's doc is the ``# --`` comment block right above it (continuation lines are plain
``#`` lines). The JSON schema type comes from the default value; a comment line
``# @schema {...}`` (JSON) overrides or extends it, e.g. a free-form map or an enum. Every
object without an ``@schema`` override gets ``additionalProperties: false``, so a misspelt
key fails ``helm install`` instead of being silently ignored.

    python charts/kvtune/hack/values_docs.py          # write README.md and values.schema.json
    python charts/kvtune/hack/values_docs.py --check  # exit 1 if either is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1]
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


@dataclass
class KeyDoc:
    path: str
    doc: str
    schema: dict[str, Any] = field(default_factory=dict)


def parse_comments(text: str) -> dict[str, KeyDoc]:
    """Key path -> its doc comment and schema hints, read line by line."""
    docs: dict[str, KeyDoc] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if not match:
            if stripped == "":
                pending = []
            continue  # list items and continuation of flow values
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [match["key"]])
        doc_lines: list[str] = []
        schema: dict[str, Any] = {}
        started = False
        for comment in pending:
            if comment.startswith("@schema"):
                schema.update(json.loads(comment.removeprefix("@schema")))
            elif comment.startswith("--"):
                started = True
                doc_lines.append(comment.removeprefix("--").strip())
            elif started:
                doc_lines.append(comment)
        docs[path] = KeyDoc(path, " ".join(doc_lines).strip(), schema)
        pending = []
        rest = match["rest"].strip()
        if rest == "" or rest.startswith("#"):
            stack.append((indent, match["key"]))
    return docs


def _type_of(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": "array"}
    if value is None:
        return {"type": "null"}
    return {"type": "object"}


def schema_for(value: Any, path: str, docs: dict[str, KeyDoc]) -> dict[str, Any]:
    doc = docs.get(path)
    override = dict(doc.schema) if doc else {}
    node: dict[str, Any] = _type_of(value)
    if doc and doc.doc:
        node["description"] = doc.doc
    free_form = "additionalProperties" in override or "type" in override
    if isinstance(value, dict) and not free_form:
        node["properties"] = {
            k: schema_for(v, f"{path}.{k}" if path else k, docs) for k, v in value.items()
        }
        node["additionalProperties"] = False
    node.update(override)
    return node


def build_schema(values: dict[str, Any], docs: dict[str, KeyDoc]) -> dict[str, Any]:
    root = schema_for(values, "", docs)
    # A parent chart passes Helm's `global` down to its subcharts; allow it.
    root["properties"]["global"] = {"type": "object",
                                    "description": "Helm's global values (as a subchart)."}
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": "kvtune chart values",
            **root}


def _leaves(value: Any, path: str, docs: dict[str, KeyDoc]) -> list[tuple[str, Any]]:
    """Rows of the README table: each documented key (a documented map is one row)."""
    if path and path in docs and docs[path].doc:
        return [(path, value)]
    if isinstance(value, dict) and value:
        rows: list[tuple[str, Any]] = []
        for k, v in value.items():
            rows += _leaves(v, f"{path}.{k}" if path else k, docs)
        return rows
    return [(path, value)]


def build_readme(values: dict[str, Any], docs: dict[str, KeyDoc], chart: dict[str, Any]) -> str:
    rows = []
    for path, value in _leaves(values, "", docs):
        default = (json.dumps(value, separators=(", ", ": ")) if value not in ("", None)
                   else "null" if value is None else '""')
        description = docs[path].doc if path in docs else ""
        if not description:
            raise SystemExit(f"values.yaml: key {path!r} has no '# --' comment; document it")
        rows.append(f"| `{path}` | `{_type_of(value)['type']}` | `{default}` | {description} |")
    table = "\n".join(rows)
    return f"""# kvtune Helm chart

{chart['description'].strip()}

Version {chart['version']}, installs kvtune {chart['appVersion']}. This file is generated from
the comments in `values.yaml` by `hack/values_docs.py`; edit those, then run
`python charts/kvtune/hack/values_docs.py`.

## Install

```sh
helm install kvtune charts/kvtune --namespace kvtune-system --create-namespace
# watch one namespace only, with Roles instead of ClusterRoles:
helm install kvtune charts/kvtune -n llm --set operator.namespaced=true
```

What it installs: the operator Deployment (2 replicas, one active through kopf peering), its
ServiceAccount and least-privilege RBAC (one role per concern, `/status` as its own rule; see
docs/rbac.md), the InferenceDeployment CRD (kept on uninstall) and kopf's peering CRDs, a
metrics Service (+ ServiceMonitor, PrometheusRule with the default alerts, optional), the
Grafana dashboard ConfigMap, and optionally a ConfigMap with the Argo CD health check
(docs/argocd.md). `values.schema.json` rejects unknown keys and wrong types.

## Values

| key | type | default | description |
| --- | --- | --- | --- |
{table}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args()
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    docs = parse_comments(text)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    outputs = {
        CHART / "values.schema.json": json.dumps(build_schema(values, docs), indent=2) + "\n",
        CHART / "README.md": build_readme(values, docs, chart),
    }
    stale = [p for p, content in outputs.items()
             if not p.exists() or p.read_text() != content]
    if args.check:
        for p in stale:
            print(f"{p} is out of date: run python {Path(__file__).relative_to(CHART.parents[1])}",
                  file=sys.stderr)
        return 1 if stale else 0
    for p, content in outputs.items():
        p.write_text(content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
