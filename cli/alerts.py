"""``kvtune alerts``: render the SLO and KV-cache alert rules of an InferenceDeployment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import yaml


@click.command()
@click.option("-f", "--file", "path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="InferenceDeployment YAML (status, if present, adds the plan's expected "
                   "KV capacity).")
# -o is the output format in every kvtune command; --format: the former spelling.
@click.option("-o", "--output", "--format", "fmt", type=click.Choice(["prometheusrule", "rules"]),
              default="prometheusrule", show_default=True,
              help="prometheusrule: a monitoring.coreos.com/v1 PrometheusRule; rules: a plain "
                   "rule file for Prometheus' rule_files.")
@click.option("--out-file", "output", type=click.Path(dir_okay=False), default=None,
              help="Write here instead of stdout.")
@click.option("--namespace", default=None, help="Namespace when the file has none.")
def alerts(path: str, fmt: str, output: str | None, namespace: str | None) -> None:
    """Render the alert rules; check them with `promtool check rules` (format rules)."""
    from pydantic import ValidationError

    from kvtune.cli.outputs import writable_file
    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.prometheus import alerts as render

    if output:
        writable_file(output, "--out-file")
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if d]
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise click.ClickException(
            f"--file={path!r}: not valid YAML{at}: {problem}; fix the file") from exc
    out: list[dict[str, Any]] = []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "InferenceDeployment":
            continue
        doc.setdefault("metadata", {})
        if "namespace" not in doc["metadata"]:
            doc["metadata"]["namespace"] = namespace or "default"
        try:
            inputs = render.inputs_from_body(doc)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise click.ClickException(
                f"{path}: {doc['metadata'].get('name')}: spec.{field}: {first['msg']} "
                f"(got {first.get('input')!r})") from exc
        except ValueError as exc:
            raise click.ClickException(f"{path}: {doc['metadata'].get('name')}: {exc}") from exc
        if fmt == "prometheusrule":
            # The same object the operator applies, with spec.monitoring.prometheusRule.labels
            # for the Prometheus ruleSelector.
            rule = render.prometheus_rule(inputs)
            spec = InferenceDeploymentSpec.model_validate(doc.get("spec") or {})
            rule["metadata"]["labels"].update(spec.monitoring.prometheus_rule.labels or {})
            out.append(rule)
        else:
            out.append(render.rule_file(inputs))
    if not out:
        raise click.ClickException(f"--file={path!r}: no InferenceDeployment in the file")
    if fmt == "rules":  # one rule file: all groups together
        text = yaml.safe_dump({"groups": [g for d in out for g in d["groups"]]}, sort_keys=False)
    else:
        text = yaml.safe_dump_all(out, sort_keys=False)
    if output:
        Path(output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
