"""A stock kube-prometheus-stack finds every monitor and rule kvtune makes: its Prometheus
selects ServiceMonitors, PodMonitors and PrometheusRules by ``matchLabels: {release: <its
release>}`` (``serviceMonitorSelector``, ``podMonitorSelector``, ``ruleSelector``). The chart's
``monitoring.labels`` (default ``{release: <kvtune's release>}``) must be on the chart's
objects and, through the operator's environment, on those the operator renders."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from op_samples import SAMPLE_SPEC
from test_chart import by_kind, render

from kvtune.operator.prometheus import monitors

ENABLED = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "alerts.enabled=true"]
MONITOR_KINDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule")


@pytest.fixture(scope="module")
def helm() -> Path:
    """helm built from the Go module proxy (cached; built on first use)."""
    from kvtune.e2e.binaries import ensure_built

    return ensure_built(["helm"])["helm"]


def _selects(selector: dict[str, str], obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deploy,) = by_kind(docs, "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def _operator_objects(env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                      scrape_kind: str) -> list[dict[str, Any]]:
    """What the operator renders for an InferenceDeployment with the chart's environment."""
    monkeypatch.setenv(monitors.LABELS_ENV, env[monitors.LABELS_ENV])
    spec = copy.deepcopy(SAMPLE_SPEC)
    spec["monitoring"] = {"scrape": {"kind": scrape_kind}}
    body = {"apiVersion": "kvtune.io/v1alpha1", "kind": "InferenceDeployment",
            "metadata": {"name": "bot", "namespace": "llm", "uid": "u-1"}, "spec": spec}
    wanted, _ = monitors.monitoring_objects(body)
    return wanted


@pytest.mark.parametrize(("release", "args", "selector"), [
    # The default: the release label with kvtune's release name.
    ("kube-prometheus-stack", [], {"release": "kube-prometheus-stack"}),
    # A Prometheus of another release: monitoring.labels says which.
    ("kvtune", ["--set", "monitoring.labels.release=prom"], {"release": "prom"}),
])
@pytest.mark.parametrize("scrape_kind", ["PodMonitor", "ServiceMonitor"])
def test_a_stock_prometheus_selector_finds_every_monitor_and_rule(
    helm: Path, monkeypatch: pytest.MonkeyPatch, release: str, args: list[str],
    selector: dict[str, str], scrape_kind: str,
) -> None:
    docs = render(helm, *ENABLED, *args, release=release)
    chart_objects = [d for d in docs if d["kind"] in MONITOR_KINDS]
    assert sorted(d["kind"] for d in chart_objects) == ["PrometheusRule", "ServiceMonitor"]
    env = _operator_env(docs)
    assert json.loads(env[monitors.LABELS_ENV]) == selector
    operator_objects = _operator_objects(env, monkeypatch, scrape_kind)
    # Two pools: a monitor each, and the deployment's PrometheusRule.
    assert sorted(o["kind"] for o in operator_objects) == sorted(
        [scrape_kind, scrape_kind, "PrometheusRule"])
    for obj in [*chart_objects, *operator_objects]:
        assert _selects(selector, obj), (obj["kind"], obj["metadata"])
    # A selector for another Prometheus' release finds none of them (the test can fail).
    assert not any(_selects({"release": "someone-else"}, o)
                   for o in [*chart_objects, *operator_objects])


def test_per_object_labels_add_to_the_chart_wide_ones(helm: Path) -> None:
    docs = render(helm, *ENABLED, "--set", "metrics.serviceMonitor.labels.team=ml",
                  "--set", "alerts.labels.team=ml")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        (obj,) = by_kind(docs, kind)
        assert obj["metadata"]["labels"]["release"] == "kvtune"
        assert obj["metadata"]["labels"]["team"] == "ml"


def test_the_operators_own_alerts_are_in_the_chart_once(
    helm: Path, tmp_path: Path
) -> None:
    docs = render(helm, *ENABLED)
    (rule,) = by_kind(docs, "PrometheusRule")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts == ["KVTuneOperatorDown", "KVTuneReconcileErrors", "KVTuneCalibrationDrift"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    (errors,) = [r for g in rule["spec"]["groups"] for r in g["rules"]
                 if r["alert"] == "KVTuneReconcileErrors"]
    # Helm left Prometheus' own template for Prometheus to fill in.
    assert errors["annotations"]["description"].startswith("{{ $value | humanize }} ")
    groups = copy.deepcopy(rule["spec"])
    for group in groups["groups"]:
        for r in group["rules"]:
            r.pop("annotations")  # exp_alerts below compares labels only
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(groups))
    series = 'kvtune_reconcile_errors_total{error="ApiException",namespace="kvtune-system"}'
    tests = [{"interval": "1m", "input_series": [{"series": series, "values": values}],
              "alert_rule_test": [{"eval_time": "20m", "alertname": "KVTuneReconcileErrors",
                                   "exp_alerts": expected}]}
             for values, expected in (("0+1x30", [{"exp_labels": {"severity": "warning"}}]),
                                      ("0x30", []))]
    spec = tmp_path / "test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                    "tests": tests}))
    proc = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_calibration_drift_fires_past_the_margin_and_clears_within_it(
    helm: Path, tmp_path: Path
) -> None:
    """KVTuneCalibrationDrift (docs/calibration-loop.md) over the operator's
    kvtune_calibration_ratio gauge, at the chart's margin: 1.3x fires after 30m, 1.05x (the
    loop converged) and a drift shorter than 30m do not; a margin of 0.4 lets 1.3x pass."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    series = ('kvtune_calibration_ratio{namespace="llm",name="bot",pool="h100",'
              'figure="decode_seconds"}')
    labels = {"severity": "warning", "namespace": "llm", "name": "bot", "pool": "h100",
              "figure": "decode_seconds"}
    cases = [([], "1.3x60", [{"exp_labels": labels}]),
             ([], "1.05x60", []),
             ([], "1x40 1.3x20", []),  # drifting for 20m only
             (["--set-json", "operator.calibrationDriftMargin=0.4"], "1.3x60", [])]
    for extra, values, expected in cases:
        (rule,) = by_kind(render(helm, *ENABLED, *extra), "PrometheusRule")
        groups = copy.deepcopy(rule["spec"])
        for group in groups["groups"]:
            group["rules"] = [r for r in group["rules"] if r["alert"] == "KVTuneCalibrationDrift"]
            for r in group["rules"]:
                r.pop("annotations")
        rules = tmp_path / "rules.yaml"
        rules.write_text(yaml.safe_dump(groups))
        spec = tmp_path / "test.yaml"
        spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                        "tests": [{"interval": "1m", "input_series": [
                                            {"series": series, "values": values}],
                                            "alert_rule_test": [{
                                                "eval_time": "59m",
                                                "alertname": "KVTuneCalibrationDrift",
                                                "exp_alerts": expected}]}]}))
        proc = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, (extra, values, proc.stdout + proc.stderr)
