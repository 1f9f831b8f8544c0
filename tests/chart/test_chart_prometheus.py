"""The chart's Prometheus values become the operator's own configuration (issue 11 item 3):
the allow-list, TLS CA and bearer token from Secrets, size and time bounds — and the
operator reads that configuration back as rendered."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvtune.operator.prometheus.prom_http import PrometheusAccess, PrometheusNotAllowed

CHART = Path(__file__).resolve().parents[2] / "charts/kvtune"


@pytest.fixture(scope="module")
def helm() -> Path:
    from kvtune.e2e.binaries import ensure_built

    return ensure_built(["helm"])["helm"]


def _operator_pod(helm: Path, *sets: str) -> dict[str, Any]:
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([str(helm), "template", "kvtune", str(CHART), "--namespace", "kvtune",
                          "--kube-version", "1.35.4", *args], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    deploy = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
    pod: dict[str, Any] = deploy["spec"]["template"]["spec"]
    return pod


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}


def test_by_default_no_prometheus_is_allowed(helm: Path) -> None:
    env = _env(_operator_pod(helm))
    access = PrometheusAccess.from_env(env)
    assert access.allowed == () and access.verify() is True
    with pytest.raises(PrometheusNotAllowed, match=r"prometheus\.allowedURLs"):
        access.check("http://prometheus.monitoring.svc:9090")


def test_allow_list_tls_and_token_reach_the_operator(helm: Path) -> None:
    pod = _operator_pod(helm, "prometheus.allowedURLs={https://prom.monitoring.svc:9090/api}",
                        "prometheus.tls.caSecret=prom-ca",
                        "prometheus.auth.bearerTokenSecret=prom-token",
                        "prometheus.maxResponseBytes=100000", "prometheus.timeoutSeconds=5")
    access = PrometheusAccess.from_env(_env(pod))
    assert access.check("https://prom.monitoring.svc:9090/api") == \
        "https://prom.monitoring.svc:9090/api"
    with pytest.raises(PrometheusNotAllowed):
        access.check("https://prom.monitoring.svc:9090/other")
    assert access.max_response_bytes == 100000 and access.timeout_seconds == 5.0
    assert access.verify() == "/etc/kvtune/prometheus-ca/ca.crt"
    assert access.bearer_token_file == "/etc/kvtune/prometheus-token/token"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["prometheus-ca"]["secret"]["secretName"] == "prom-ca"
    assert volumes["prometheus-token"]["secret"]["secretName"] == "prom-token"
    assert mounts["prometheus-ca"]["mountPath"] == "/etc/kvtune/prometheus-ca"
    assert mounts["prometheus-token"]["readOnly"] is True


def test_the_values_schema_refuses_a_url_with_credentials(helm: Path) -> None:
    bad = subprocess.run([str(helm), "template", "kvtune", str(CHART), "--kube-version",
                          "1.35.4", "--set", "prometheus.allowedURLs={http://u:p@x:9090}"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "allowedURLs" in bad.stderr
