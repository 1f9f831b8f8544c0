"""The Grafana dashboard shipped with the chart: it parses, every query uses real metric names
(vLLM 0.33.0's, or kvtune's own), and every query is valid PromQL (promtool parses it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvtune.operator.monitoring import metrics as operator_metrics
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.operator.retune import retune_handlers  # noqa: F401  (registers its gauges)

DASHBOARD = Path(__file__).resolve().parents[2] / "charts/kvtune/dashboards/kvtune-kv-cache.json"
METRIC = re.compile(r"\b((?:vllm:|kvtune_)[a-zA-Z0-9_:]+)")


def _exprs(dash: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    out += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    return out


def _known_names() -> set[str]:
    names = {vm.CACHE_CONFIG_INFO}
    for spec in vm.METRICS:
        if spec.kind == "histogram":
            names |= {f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count"}
        else:
            names.add(vm.wire_name(spec.name, spec.kind))
    for family in operator_metrics.REGISTRY.collect():
        names.add(family.name)
        names |= {f"{family.name}{suffix}" for suffix in ("_total", "_bucket", "_sum",
                                                          "_count")}
    return names


def test_dashboard_parses_and_has_the_panels_asked_for() -> None:
    dash = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in dash["panels"])
    for needle in ("KV cache usage", "Prefix cache hit rate", "max-model-len"):
        assert needle in titles
    annotations = [a for a in dash["annotations"]["list"] if "expr" in a]
    assert any("kvtune_plan_revision" in a["expr"] for a in annotations)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_queries_use_real_metric_names() -> None:
    dash = json.loads(DASHBOARD.read_text())
    known = _known_names()
    used = {m for e in _exprs(dash) for m in METRIC.findall(e)}
    assert used, "no metric found in the dashboard's queries"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"
    assert {"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total",
            "vllm:request_prompt_tokens_bucket", "kvtune_plan_max_model_len"} <= used


@pytest.mark.prometheus
def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not on PATH: run scripts/setup.sh")
    dash = json.loads(DASHBOARD.read_text())
    grafana_vars = {"$__rate_interval": "5m", "$__range": "6h", "$__interval": "1m",
                    "$namespace": ".*", "$model": ".*", "$deployment": ".*"}
    rules = []
    for i, expr in enumerate(_exprs(dash)):
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
