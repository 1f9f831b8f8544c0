"""Alert rules: ``promtool check rules`` on every rendering, ``promtool test rules`` showing
each alert firing on a synthetic series and quiet on a healthy one.

promtool's unit tests compare annotations exactly; the rendered annotations hold templates
(``$value``), so the unit tests run on the same rules with annotations removed (expressions,
``for`` and labels untouched), and ``promtool check rules`` validates the annotation
templates on the full rendering.
"""

from __future__ import annotations

import copy
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvtune.operator.prometheus import alerts

pytestmark = pytest.mark.prometheus

NS, NAME, MODEL = "llm", "support-bot", "meta-llama/Llama-3.1-8B-Instruct"
BODY: dict[str, Any] = {
    "apiVersion": "kvtune.io/v1alpha1", "kind": "InferenceDeployment",
    "metadata": {"name": NAME, "namespace": NS},
    "spec": {
        "model": {"name": MODEL},
        "workload": {"profile": "rag", "sharedPrefixTokens": 1000},
        "slo": {"ttftP95": "2s", "tpotP95": "80ms"},
        "pools": [{"gpuClass": "H200", "replicas": 2}],
        "tuning": {"prometheus": {"url": "http://prometheus:9090", "window": "1h"}},
    },
    "status": {"pools": [{"name": "h200", "gpuClass": "H200", "tensorParallel": 1,
                          "replicas": 2, "phase": "Applied",
                          # 2 MiB blocks (8B, bf16, 16 tokens): 100 GiB of the H200's.
                          "expected": {"numGpuBlocks": 51200,
                                       "kvCacheBytes": 51200 * 2**21}}]},
}


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not on PATH: run scripts/setup.sh (Debian's prometheus package)")
    return exe


def _check(path: Path) -> str:
    proc = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.parametrize("lo_hi", [(0, 0), (7, 7), (9, 11), (95, 105), (43520, 58880),
                                   (999, 1001), (1, 100000)])
def test_integer_range_regex_exact(lo_hi: tuple[int, int]) -> None:
    lo, hi = lo_hi
    pattern = re.compile(f"^(?:{alerts.integer_range_regex(lo, hi)})$")
    for n in range(max(0, lo - 200), hi + 200, max(1, (hi - lo) // 500)):
        assert bool(pattern.match(str(n))) == (lo <= n <= hi), (n, pattern.pattern)
    for n in (lo, hi):
        assert pattern.match(str(n))


def test_integer_range_regex_random() -> None:
    rng = random.Random(5)
    for _ in range(200):
        lo = rng.randrange(0, 200_000)
        hi = lo + rng.randrange(0, 50_000)
        pattern = re.compile(f"^(?:{alerts.integer_range_regex(lo, hi)})$")
        for n in [lo - 1, lo, hi, hi + 1, *(rng.randrange(max(0, lo - 1000), hi + 1000)
                                            for _ in range(50))]:
            if n >= 0:
                assert bool(pattern.match(str(n))) == (lo <= n <= hi), (lo, hi, n)


def test_slo_bucket_rounds_down_to_a_vllm_bound() -> None:
    from kvtune.operator.prometheus import vllm_metrics as vm
    assert alerts.slo_bucket(2.0, vm.TIME_TO_FIRST_TOKEN_BUCKETS) == 1.0
    assert alerts.slo_bucket(0.08, vm.INTER_TOKEN_LATENCY_BUCKETS) == 0.075
    assert alerts.le_string(1.0) == "1.0" and alerts.le_string(0.075) == "0.075"


@pytest.mark.parametrize("variant", ["full", "no-slo", "no-prefix-sharing", "no-status"])
def test_every_rendering_passes_promtool_check(variant: str, tmp_path: Path) -> None:
    body = copy.deepcopy(BODY)
    if variant == "no-slo":
        del body["spec"]["slo"]
    elif variant == "no-prefix-sharing":
        body["spec"]["workload"] = {"profile": "chat"}
    elif variant == "no-status":
        del body["status"]
    inputs = alerts.inputs_from_body(body)
    plain = tmp_path / "rules.yaml"
    plain.write_text(yaml.safe_dump(alerts.rule_file(inputs)))
    out = _check(plain)
    names = {r.get("alert") for g in alerts.rule_groups(inputs) for r in g["rules"]}
    assert ("PrefixCacheHitRateLow" in names) == (variant != "no-prefix-sharing")
    assert ("TTFTSLOBurnFast" in names) == (variant != "no-slo")
    assert ("KVCacheCapacityOffPlan" in names) == (variant != "no-status")
    assert ({"KVCacheVRAMShareHigh", "KVCacheVRAMShareLow"} <= names) == (
        variant != "no-status")
    assert "SUCCESS" in out
    # The PrometheusRule carries the same groups; promtool checks its spec as a rule file.
    pr = alerts.prometheus_rule(inputs)
    assert pr["kind"] == "PrometheusRule" and pr["metadata"]["namespace"] == NS
    from_pr = tmp_path / "from-prometheusrule.yaml"
    from_pr.write_text(yaml.safe_dump(pr["spec"]))
    _check(from_pr)


def test_cli_renders_both_formats(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kvtune.cli.alerts import alerts as cmd

    src = tmp_path / "idep.yaml"
    src.write_text(yaml.safe_dump(BODY))
    out = tmp_path / "rules.yaml"
    result = CliRunner().invoke(cmd, ["-f", str(src), "-o", "rules", "--out-file", str(out)])
    assert result.exit_code == 0, result.output
    _check(out)
    result = CliRunner().invoke(cmd, ["-f", str(src)])
    assert result.exit_code == 0 and "kind: PrometheusRule" in result.output


# --- promtool test rules --------------------------------------------------------------------

SERIES_LABELS = f'namespace="{NS}",model_name="{MODEL}",instance="10.0.0.1:8000",engine="0"'
RULE_LABELS = {"namespace": NS, "kvtune_deployment": NAME}
PER_INSTANCE = {"model_name": MODEL, "instance": "10.0.0.1:8000", "engine": "0"}


def _s(metric: str, values: str, extra: str = "") -> dict[str, str]:
    labels = SERIES_LABELS + (f",{extra}" if extra else "")
    return {"series": f"{metric}{{{labels}}}", "values": values}


def _info(num_gpu_blocks: str) -> dict[str, str]:
    """One pod's ``vllm:cache_config_info`` with ``num_gpu_blocks`` blocks."""
    return {"series": f'vllm:cache_config_info{{namespace="{NS}",pod="{NAME}-h200-7d9f-x2",'
                      f'num_gpu_blocks="{num_gpu_blocks}",engine="0"}}', "values": "1x30"}


# name -> (alertname, eval time, series when firing, series when healthy, extra labels)
SCENARIOS: dict[str, tuple[str, str, list[dict[str, str]], list[dict[str, str]],
                           dict[str, str]]] = {
    "saturated": (
        "KVCacheSaturated", "20m",
        [_s("vllm:kv_cache_usage_perc", "0.95x30"), _s("vllm:num_requests_waiting", "3x30")],
        [_s("vllm:kv_cache_usage_perc", "0.95x30"), _s("vllm:num_requests_waiting", "0x30")],
        {**PER_INSTANCE, "severity": "warning"},
    ),
    "underused": (
        "KVCacheUnderused", "70m",
        [_s("vllm:kv_cache_usage_perc", "0.2x80"),
         _s("vllm:request_success_total", "0+60x80", 'finished_reason="stop"')],
        [_s("vllm:kv_cache_usage_perc", "0.7x80"),
         _s("vllm:request_success_total", "0+60x80", 'finished_reason="stop"')],
        {**PER_INSTANCE, "severity": "info"},
    ),
    "hit-rate": (
        "PrefixCacheHitRateLow", "70m",
        [_s("vllm:prefix_cache_hits_total", "0+10x80"),
         _s("vllm:prefix_cache_queries_total", "0+100x80")],
        [_s("vllm:prefix_cache_hits_total", "0+60x80"),
         _s("vllm:prefix_cache_queries_total", "0+100x80")],
        {"severity": "warning"},
    ),
    "ttft-gap": (
        "PrefixCacheTTFTGapSmall", "70m",
        [_s("vllm:request_prompt_tokens_sum", "0+1000x80"),
         _s("vllm:request_prefill_kv_computed_tokens_sum", "0+900x80")],
        [_s("vllm:request_prompt_tokens_sum", "0+1000x80"),
         _s("vllm:request_prefill_kv_computed_tokens_sum", "0+300x80")],
        {"severity": "warning"},
    ),
    "preemptions": (
        "KVCachePreemptionsRising", "95m",
        # Quiet for an hour, then 5 a minute: rising.
        [_s("vllm:num_preemptions_total", "0x60 0+5x40")],
        # 5 a minute all along: sustained but not rising.
        [_s("vllm:num_preemptions_total", "0+5x100")],
        {"severity": "warning"},
    ),
    "ttft-burn": (
        "TTFTSLOBurnFast", "70m",
        # Every request slower than the 2 s SLO, read at its own bound (the pods render it).
        [_s("vllm:time_to_first_token_seconds_bucket", "0x80", 'le="2.0"'),
         _s("vllm:time_to_first_token_seconds_count", "0+10x80")],
        [_s("vllm:time_to_first_token_seconds_bucket", "0+10x80", 'le="2.0"'),
         _s("vllm:time_to_first_token_seconds_count", "0+10x80")],
        {"severity": "page"},
    ),
    "tpot-burn": (
        "TPOTSLOBurnFast", "70m",
        [_s("vllm:request_time_per_output_token_seconds_bucket", "0+2x80", 'le="0.08"'),
         _s("vllm:request_time_per_output_token_seconds_count", "0+10x80")],
        [_s("vllm:request_time_per_output_token_seconds_bucket", "0+10x80", 'le="0.08"'),
         _s("vllm:request_time_per_output_token_seconds_count", "0+10x80")],
        {"severity": "page"},
    ),
    "capacity": (
        "KVCacheCapacityOffPlan", "20m",
        [{"series": f'vllm:cache_config_info{{namespace="{NS}",pod="{NAME}-h200-7d9f-x2",'
                    f'num_gpu_blocks="30000",engine="0"}}', "values": "1x30"}],
        [{"series": f'vllm:cache_config_info{{namespace="{NS}",pod="{NAME}-h200-7d9f-x2",'
                    f'num_gpu_blocks="51000",engine="0"}}', "values": "1x30"}],
        {"severity": "warning", "pool": "h200", "pod": f"{NAME}-h200-7d9f-x2",
         "num_gpu_blocks": "30000"},
    ),
    # H200 (150,121,480,192 bytes) at 2 MiB a block: over half above 35,791 blocks, under
    # a fifth below 14,317.
    "vram-high": (
        "KVCacheVRAMShareHigh", "20m",
        [_info("51200")], [_info("30000")],
        {"severity": "info", "pool": "h200", "pod": f"{NAME}-h200-7d9f-x2",
         "num_gpu_blocks": "51200"},
    ),
    "vram-high-at-the-bound": (
        "KVCacheVRAMShareHigh", "20m",
        [_info("35792")], [_info("35791")],
        {"severity": "info", "pool": "h200", "pod": f"{NAME}-h200-7d9f-x2",
         "num_gpu_blocks": "35792"},
    ),
    "vram-low": (
        "KVCacheVRAMShareLow", "20m",
        [_info("14316")], [_info("14317")],
        {"severity": "info", "pool": "h200", "pod": f"{NAME}-h200-7d9f-x2",
         "num_gpu_blocks": "14316"},
    ),
    "profile-stale": (
        "KVTuneProfileStale", "20m",
        [{"series": f'kvtune_profile_stale{{namespace="{NS}",name="{NAME}"}}',
          "values": "1x30"},
         {"series": f'kvtune_profile_last_success_timestamp_seconds{{namespace="{NS}",'
                    f'name="{NAME}"}}', "values": "0x30"}],
        [{"series": f'kvtune_profile_stale{{namespace="{NS}",name="{NAME}"}}',
          "values": "0x30"},
         {"series": f'kvtune_profile_last_success_timestamp_seconds{{namespace="{NS}",'
                    f'name="{NAME}"}}', "values": "0+60x30"}],
        {"severity": "warning"},
    ),
}


def _without_annotations(rules: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(rules)
    for group in out["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return out


def test_each_alert_fires_on_its_symptom_and_stays_quiet_when_healthy(tmp_path: Path) -> None:
    inputs = alerts.inputs_from_body(BODY)
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(yaml.safe_dump(_without_annotations(alerts.rule_file(inputs))))
    rendered = {r.get("alert") for g in alerts.rule_groups(inputs) for r in g["rules"]}
    assert {s[0] for s in SCENARIOS.values()} <= rendered
    tests = []
    for name, (alertname, at, firing, healthy, labels) in SCENARIOS.items():
        expected = {**RULE_LABELS, **labels}
        tests.append({"name": f"{name}: fires", "interval": "1m", "input_series": firing,
                      "alert_rule_test": [{"eval_time": at, "alertname": alertname,
                                           "exp_alerts": [{"exp_labels": expected}]}]})
        tests.append({"name": f"{name}: quiet when healthy", "interval": "1m",
                      "input_series": healthy,
                      "alert_rule_test": [{"eval_time": at, "alertname": alertname,
                                           "exp_alerts": []}]})
    # The slower burn windows page/ticket on a moderate burn where the fast one stays quiet:
    # 20 % of requests too slow is 4x the 5 % budget (above 3x, below 6x and 14.4x).
    moderate = [_s("vllm:time_to_first_token_seconds_bucket", "0+8x200", 'le="2.0"'),
                _s("vllm:time_to_first_token_seconds_count", "0+10x200")]
    tests.append({"name": "ttft-burn: moderate burn tickets, does not page", "interval": "1m",
                  "input_series": moderate,
                  "alert_rule_test": [
                      {"eval_time": "180m", "alertname": "TTFTSLOBurnSlow",
                       "exp_alerts": [{"exp_labels": {**RULE_LABELS, "severity": "ticket"}}]},
                      {"eval_time": "180m", "alertname": "TTFTSLOBurnFast", "exp_alerts": []},
                      {"eval_time": "180m", "alertname": "TTFTSLOBurnMedium",
                       "exp_alerts": []},
                  ]})
    test_path = tmp_path / "rules_test.yaml"
    test_path.write_text(yaml.safe_dump({"rule_files": [str(rules_path)],
                                         "evaluation_interval": "1m", "tests": tests}))
    proc = subprocess.run([_promtool(), "test", "rules", str(test_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_rules_evaluate_live_on_the_replayed_vllm_series(tmp_path: Path) -> None:
    """The rendered rules loaded into a real Prometheus scraping the replay exporter: the
    capacity rule goes pending when vLLM's num_gpu_blocks is far from the plan's, the TTFT
    burn recording rules produce values, and a healthy rule stays quiet."""
    import json
    import urllib.request

    from kvtune.e2e.prometheus import running_prometheus
    from kvtune.e2e.traces import AZURE_TRACE
    from kvtune.replay.exporter import Replay, ReplayServer
    from kvtune.replay.instance import InstanceConfig

    body = copy.deepcopy(BODY)
    body["status"]["pools"][0]["expected"]["numGpuBlocks"] = 30000  # replay runs 60000
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(alerts.rule_file(alerts.inputs_from_body(body))))
    from kvtune.operator.prometheus import slo_buckets

    # The pods render the SLO targets as bounds (slo_buckets): the replayed instance too.
    custom = tuple((family, tuple(bounds))
                   for family, bounds in slo_buckets.custom_buckets(2.0, 0.08).items())
    server = ReplayServer(Replay(InstanceConfig(model_name=MODEL,
                                                custom_histogram_buckets=custom),
                                 AZURE_TRACE, speed=20.0), port=0)
    server.start()
    try:
        with running_prometheus(rule_files=[rules]) as prom:
            prom.set_targets([server.target],
                             labels={"namespace": NS, "pod": f"{NAME}-h200-5c7d-q8"})
            prom.wait_for('ALERTS{alertname="KVCacheCapacityOffPlan",alertstate="pending"}',
                          timeout_seconds=60)
            prom.wait_for(f'kvtune:ttft_slo_errors:ratio_rate5m{{kvtune_deployment="{NAME}"}}',
                          timeout_seconds=60)
            with urllib.request.urlopen(f"{prom.url}/api/v1/alerts", timeout=5) as resp:
                active = json.load(resp)["data"]["alerts"]
            names = {a["labels"]["alertname"] for a in active}
            capacity = next(a for a in active
                            if a["labels"]["alertname"] == "KVCacheCapacityOffPlan")
            assert capacity["labels"]["num_gpu_blocks"] == "60000"
            assert "expects 30000" in capacity["annotations"]["description"]
            # Azure at 20x on a 60,000-block cache is far from saturated.
            assert "KVCacheSaturated" not in names
    finally:
        server.stop()


# --- the SLO read at its exact bound (issue 22 item 8) -------------------------------------

def _with_pod_template(body: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["spec"]["runtime"] = {"podTemplate": {"configMapRef": {"name": "pods"}}}
    return out


def test_burn_rules_read_the_exact_threshold_when_the_pods_render_it() -> None:
    exact = alerts.inputs_from_body(BODY)
    assert exact.slo_buckets_rendered
    text = yaml.safe_dump(alerts.rule_file(exact))
    assert 'le=\\"2.0\\"' in text or 'le="2.0"' in text
    assert 'le=\\"0.08\\"' in text or 'le="0.08"' in text
    assert 'le="1.0"' not in text and 'le=\\"1.0\\"' not in text
    ttft = next(r for g in alerts.rule_groups(exact) for r in g["rules"]
                if r.get("alert") == "TTFTSLOBurnFast")
    assert "read at its own bucket bound" in ttft["annotations"]["description"]


def test_burn_rules_say_when_they_judge_at_a_lower_bound() -> None:
    # A user's pod template may drop kvtune's arguments: the default bound at or below.
    lower = alerts.inputs_from_body(_with_pod_template(BODY))
    assert not lower.slo_buckets_rendered
    rules = {r["alert"]: r for g in alerts.rule_groups(lower) for r in g["rules"]
             if "alert" in r}
    records = [r["expr"] for g in alerts.rule_groups(lower) for r in g["rules"]
               if r.get("record", "").startswith("kvtune:ttft")]
    assert all('le="1.0"' in e for e in records), records
    desc = rules["TTFTSLOBurnFast"]["annotations"]["description"]
    assert "judged at the lower bucket bound 1s" in desc and "--custom-histogram-buckets" in desc


def test_requests_between_the_default_bound_and_the_target_burn_no_budget(
        tmp_path: Path) -> None:
    """Every request takes 1.5 s against a 2 s target: within the SLO. Read at the exact
    bound the burn alert stays quiet; read at vLLM's default 1.0 bound it pages."""
    between = [_s("vllm:time_to_first_token_seconds_bucket", "0x80", 'le="1.0"'),
               _s("vllm:time_to_first_token_seconds_bucket", "0+10x80", 'le="2.0"'),
               _s("vllm:time_to_first_token_seconds_count", "0+10x80")]
    for name, body, firing in (("exact", BODY, False),
                               ("lower", _with_pod_template(BODY), True)):
        rules_path = tmp_path / f"{name}.yaml"
        rules_path.write_text(yaml.safe_dump(_without_annotations(
            alerts.rule_file(alerts.inputs_from_body(body)))))
        exp = [{"exp_labels": {**RULE_LABELS, "severity": "page"}}] if firing else []
        test_path = tmp_path / f"{name}_test.yaml"
        test_path.write_text(yaml.safe_dump({
            "rule_files": [str(rules_path)], "evaluation_interval": "1m",
            "tests": [{"name": name, "interval": "1m", "input_series": between,
                       "alert_rule_test": [{"eval_time": "70m", "alertname": "TTFTSLOBurnFast",
                                            "exp_alerts": exp}]}]}))
        proc = subprocess.run([_promtool(), "test", "rules", str(test_path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, name + ": " + proc.stdout + proc.stderr
