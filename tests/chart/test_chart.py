"""The Helm chart: lint, render (cluster-wide and namespaced), schema, CRD copy, docs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/kvtune"
NAMESPACED = ["--set", "operator.namespaced=true", "--set", "operator.watchNamespaces={llm,batch}"]


@pytest.fixture(scope="module")
def helm() -> Path:
    """helm built from the Go module proxy (cached; built on first use)."""
    from kvtune.e2e.binaries import ensure_built

    return ensure_built(["helm"])["helm"]


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, check=check,
                          timeout=120)


def render(helm: Path, *args: str, release: str = "kvtune") -> list[dict[str, Any]]:
    out = run_helm(helm, "template", release, str(CHART), "--namespace", "kvtune-system",
                   "--include-crds", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rules_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for d in by_kind(docs, kind) for rule in d["rules"]]


@pytest.mark.parametrize("extra", [[], NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_helm_lint(helm: Path, extra: list[str]) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *extra, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_helm_is_built_as_helm_releases_it(helm: Path, tmp_path: Path) -> None:
    # Built with helm's own ldflags: its version, and the Kubernetes version `helm template`
    # assumes without --kube-version stamped from client-go (unstamped it is v1.20, below the
    # chart's kubeVersion >= 1.30, and every render needed --kube-version).
    from kvtune.e2e.binaries import COMPONENTS, cache_key, required_version

    component = COMPONENTS["helm"]
    version = run_helm(helm, "version", "--short").stdout
    assert version.startswith(required_version(component)), version
    probe = tmp_path / "probe"
    (probe / "templates").mkdir(parents=True)
    (probe / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (probe / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n")
    (doc,) = yaml.safe_load_all(run_helm(helm, "template", str(probe)).stdout)
    stamped = cache_key(component).split("-kube")[1]
    assert doc["data"]["kube"] == f"v{stamped}.0"
    assert int(stamped.split(".")[1]) >= 30  # the chart's kubeVersion floor


def test_default_render(helm: Path) -> None:
    docs = render(helm)
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "operator", "--peering=kvtune", "--liveness=http://0.0.0.0:8081/healthz",
        "--metrics-port=8080", "--metrics-address=0.0.0.0", "--pod-security=baseline",
        # admissionPolicy.enabled: the tenant-secrets policy checks spec.runtime.secrets.
        "--tenant-secrets-admission",
        "--template-renders-in-flight=1", "--template-cpu-seconds=6",
        "--template-cpu-window-seconds=60", "--template-retry-spread-seconds=2",
        # The goodput search's budget, under the 512Mi limit (operator/search/search_budget.py).
        "--search-cpu-seconds=60", "--search-memory-mib=256"]
    assert pod["serviceAccountName"] == "kvtune"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Peering: kopf's CRDs (crds/ folder) and this release's cluster-wide peering object.
    crd_names = {d["metadata"]["name"] for d in by_kind(docs, "CustomResourceDefinition")}
    assert {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"} <= crd_names
    (peering,) = by_kind(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "kvtune"
    # The one Role of cluster mode: the closed loop's model calibration, in the release's
    # namespace, get/update on its one ConfigMap only (docs/calibration-loop.md).
    (role,) = by_kind(docs, "Role")
    assert role["metadata"] == {**role["metadata"], "name": "kvtune-model-calibration",
                                "namespace": "kvtune-system"}
    assert [r for r in role["rules"] if r.get("resourceNames")] == [{
        "apiGroups": [""], "resources": ["configmaps"],
        "resourceNames": ["kvtune-model-calibration"], "verbs": ["get", "update"]}]
    # The status subresource is a rule of its own; no wildcard anywhere.
    rules = rules_of(docs, "ClusterRole")
    status_rules = [r for r in rules if "inferencedeployments/status" in r["resources"]
                    and "patch" in r["verbs"]]
    assert status_rules and all(r["resources"] == ["inferencedeployments/status"]
                                for r in status_rules)
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
    peering_patch = [r for r in rules if r["resources"] == ["clusterkopfpeerings"]
                     and "patch" in r["verbs"]]
    assert peering_patch == [{"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"],
                              "resourceNames": ["kvtune"], "verbs": ["get", "patch"]}]
    (svc,) = by_kind(docs, "Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert by_kind(docs, "ServiceMonitor") == [] and by_kind(docs, "PrometheusRule") == []
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deploy["spec"]["selector"]
    assert by_kind(render(helm, "--set", "replicaCount=1"), "PodDisruptionBudget") == []


def test_gpu_prices_reach_the_operator(helm: Path) -> None:
    # (helm's --set reads 2.49 as a string; a values file or --set-json gives numbers)
    docs = render(helm, "--set-json", 'gpuPrices={"H100": 2.49, "A100-80GB": 1.1}')
    (deploy,) = by_kind(docs, "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--gpu-price")] == [
        "--gpu-price=A100-80GB=1.1", "--gpu-price=H100=2.49"]


def test_the_host_memory_price_reaches_the_operator(helm: Path) -> None:
    """issue 27: the chart's host-memory price becomes the operator's --host-memory-price,
    which its own parser reads back; unset, no flag (the CPU tier is not priced)."""
    from click.testing import CliRunner

    from kvtune.cli.operator_cmd import operator

    def flags(*values: str) -> list[str]:
        (deploy,) = by_kind(render(helm, *values), "Deployment")
        args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        return [a for a in args if a.startswith("--host-memory-price")]

    assert flags() == []
    assert flags("--set-json", "hostMemoryPriceUsdPerGiBHour=0.004") == [
        "--host-memory-price=0.004"]
    bad = CliRunner().invoke(operator, ["--host-memory-price=0"])
    assert bad.exit_code != 0 and "--host-memory-price" in bad.output


def test_the_template_render_budget_reaches_the_operator(helm: Path) -> None:
    """The chart's `templates` values become the operator's --template-* options, which the
    operator's own parser reads back as the budget every sandboxed render asks."""
    from kvtune.cli.operator_cmd import operator, render_limits
    from kvtune.operator.render.render_fairness import Limits

    def limits(*values: str) -> Limits:
        (deploy,) = by_kind(render(helm, *values), "Deployment")
        args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[0] == "operator"
        ctx = operator.make_context("operator", args[1:])
        return render_limits(ctx.params["template_renders_in_flight"],
                             ctx.params["template_cpu_seconds"],
                             ctx.params["template_cpu_window_seconds"],
                             ctx.params["template_retry_spread_seconds"])

    assert limits() == Limits()  # the chart's defaults are the operator's
    assert limits("--set-json", 'templates={"rendersInFlightPerNamespace": 3, '
                  '"cpuSecondsPerWindow": 1.5, "cpuWindowSeconds": 120, '
                  '"retrySpreadSeconds": 0.5}') == Limits(
        in_flight=3, cpu_seconds=1.5, window_seconds=120.0, spread_seconds=0.5)
    # The schema refuses a budget no render could pass, naming the value.
    for key, bad in (("rendersInFlightPerNamespace", "0"), ("cpuSecondsPerWindow", "0"),
                     ("cpuWindowSeconds", "0"), ("retrySpreadSeconds", "-1"),
                     ("cpuSecondsPerMinute", "6")):
        out = run_helm(helm, "template", "kvtune", str(CHART), "--set-json",
                       f"templates.{key}={bad}", check=False)
        assert out.returncode != 0 and "/templates" in out.stderr and key in out.stderr, (
            key, out.stderr)


def test_namespaced_mode_uses_roles(helm: Path) -> None:
    docs = render(helm, *NAMESPACED)
    (deploy,) = by_kind(docs, "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=llm" in args and "--namespace=batch" in args
    roles = by_kind(docs, "Role")
    # The watched namespaces', and the model calibration's in the release namespace.
    assert {r["metadata"]["namespace"] for r in roles} == {"llm", "batch", "kvtune-system"}
    assert [r["metadata"]["name"] for r in roles
            if r["metadata"]["namespace"] == "kvtune-system"] == ["kvtune-model-calibration"]
    for binding in by_kind(docs, "RoleBinding"):
        if binding["metadata"]["name"] == "kvtune-runtime-reporter":
            continue  # the runtime's (test_runtime_access_objects_are_the_operators_own)
        assert binding["subjects"][0]["namespace"] == "kvtune-system"
    # Only cluster-scoped reads stay cluster-wide (the aggregated view/edit roles aside).
    cluster_rules = [r for d in by_kind(docs, "ClusterRole")
                     if "aggregate-to-view" not in str(d["metadata"].get("labels"))
                     and "aggregate-to-edit" not in str(d["metadata"].get("labels"))
                     for r in d["rules"]]
    assert {res for r in cluster_rules for res in r["resources"]} == {
        "nodes", "customresourcedefinitions", "namespaces"}
    for rule in cluster_rules:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
    peerings = by_kind(docs, "KopfPeering")
    assert {p["metadata"]["namespace"] for p in peerings} == {"llm", "batch"}
    assert by_kind(docs, "ClusterKopfPeering") == []


def test_names_are_cut_to_63_characters(helm: Path) -> None:
    release = "a-long-release-name-for-a-platform-team-53-characters"  # Helm's maximum
    assert len(release) == 53
    docs = render(helm, release=release)
    names = [d["metadata"]["name"] for d in docs]
    assert all(len(n) <= 63 and not n.endswith("-") for n in names), names
    # Suffixed names keep their suffix so the roles stay distinguishable.
    kinds_names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(set(kinds_names)) == len(kinds_names)
    roles = {n for k, n in kinds_names if k == "ClusterRole"}
    for suffix in ("cluster-reader", "inferencedeployments", "rendered", "events", "peering"):
        assert any(n.endswith(f"-{suffix}") for n in roles), (suffix, roles)


@pytest.mark.parametrize(("args", "complaint"), [
    (["--set", "notAValue=1"], "at '': additional properties 'notAValue' not allowed"),
    (["--set", "operator.watchNamespace=llm"],
     "at '/operator': additional properties 'watchNamespace' not allowed"),
    (["--set", "replicaCount=two"], "at '/replicaCount': got string, want integer"),
    (["--set-string", "operator.namespaced=yes"],
     "at '/operator/namespaced': got string, want boolean"),
    (["--set", "operator.metricsPort=70000"], "at '/operator/metricsPort': maximum"),
    (["--set", "operator.watchNamespaces={Bad_NS}"], "/operator/watchNamespaces/0"),
    (["--set", "gpuPrices.H100=-1"], "/gpuPrices/H100"),
    (["--set-string", "gpuPrices.H100=cheap"], "/gpuPrices/H100"),
    (["--set-json", "hostMemoryPriceUsdPerGiBHour=-1"], "/hostMemoryPriceUsdPerGiBHour"),
])
def test_schema_rejects_unknown_keys_and_bad_types(
    helm: Path, args: list[str], complaint: str
) -> None:
    result = run_helm(helm, "template", "kvtune", str(CHART), *args, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr, result.stderr


def test_optional_monitoring_objects(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, "--set", "metrics.serviceMonitor.enabled=true",
                  "--set", "metrics.serviceMonitor.labels.release=prom",
                  "--set", "alerts.enabled=true", "--set", "argocd.healthCheckConfigMap=true")
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # The operator's series carry the InferenceDeployment's namespace: kept, not renamed
    # exported_namespace (the dashboard and KVTuneProfileStale select on `namespace`).
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    (rule,) = by_kind(docs, "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    # One source of KV-cache rules: the operator's per-deployment PrometheusRule. The chart
    # keeps only what no deployment can say (the operator is down, its reconciles fail),
    # nothing over vLLM's series; and the closed loop's drift over the operator's own gauge.
    assert alerts == {"KVTuneOperatorDown", "KVTuneReconcileErrors", "KVTuneCalibrationDrift"}
    assert not any("vllm:" in r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    promtool = shutil.which("promtool")
    if promtool:  # Debian's prometheus package (scripts/setup.sh installs it)
        rules_file = tmp_path / "rules.yaml"
        rules_file.write_text(yaml.safe_dump(rule["spec"]))
        check = subprocess.run([promtool, "check", "rules", str(rules_file)],
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    health = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("health")]
    script = health[0]["data"]["resource.customizations.health.kvtune.io_InferenceDeployment"]
    assert script == (CHART / "files/argocd/health.lua").read_text().rstrip("\n")


def test_dashboards_ship_in_a_labelled_configmap(helm: Path) -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    docs = render(helm)
    maps = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("dashboards")]
    if not files:
        assert maps == []
        pytest.skip("no dashboard in charts/kvtune/dashboards/ yet")
    (cm,) = maps
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(cm["data"]) == [f.name for f in files]
    for f in files:
        assert json.loads(cm["data"][f.name]) == json.loads(f.read_text())


def test_crds_in_the_chart_equal_the_generated_ones(helm: Path) -> None:
    generated = {p.name: p.read_text() for p in sorted((REPO / "crds").glob("*.yaml"))}
    copied = {p.name: p.read_text() for p in sorted((CHART / "files/crds").glob("*.yaml"))}
    assert copied == generated, "run charts/kvtune/hack/sync_crds.sh after `make crds`"
    if not generated:
        pytest.skip("crds/ is empty: nothing generated yet")
    docs = render(helm)
    rendered = {d["metadata"]["name"]: d for d in by_kind(docs, "CustomResourceDefinition")}
    for text in generated.values():
        crd = yaml.safe_load(text)
        live = rendered[crd["metadata"]["name"]]
        assert live["spec"] == crd["spec"]
        assert live["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    off = render(helm, "--set", "crds.install=false")
    assert {d["metadata"]["name"] for d in by_kind(off, "CustomResourceDefinition")} == {
        "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}


def test_readme_and_schema_are_generated_from_values() -> None:
    result = subprocess.run(
        [str(Path(__import__("sys").executable)), str(CHART / "hack/values_docs.py"), "--check"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert schema["properties"]["operator"]["additionalProperties"] is False


def _rbac_doc_rules(namespaced: bool) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) from docs/rbac.md's table, as the operator engineer wrote
    it from the operator's calls."""
    triples: set[tuple[str, str, str]] = set()
    for line in (REPO / "docs/rbac.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        group = cells[0].strip("`").replace('""', "")
        resources = re.findall(r"`([^`]+)`", cells[1])
        if len(resources) > 1:  # kopfpeerings / clusterkopfpeerings
            resources = [r for r in resources if r.startswith("kopf") == namespaced]
        if resources == ["namespaces"] and not namespaced:
            continue  # kopf needs it only when it serves named namespaces
        for resource in resources:
            for verb in re.findall(r"`([a-z]+)`", cells[2]):
                triples.add((group, resource, verb))
    return triples


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster-wide", "namespaced"])
def test_rbac_grants_exactly_what_docs_rbac_lists(helm: Path, namespaced: bool) -> None:
    # With every grant that a value switches on: runtime namespaces (calibration), routing,
    # search Jobs.
    docs = render(helm, *(NAMESPACED if namespaced else ["--set", "runtime.namespaces={llm}"]),
                  "--set", "routing.enabled=true", "--set", "search.mode=job")
    granted: set[tuple[str, str, str]] = set()
    for doc in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        if "aggregate-to" in str(doc["metadata"].get("labels")):
            continue  # the view/edit roles for people, not the operator's
        if doc["metadata"]["name"] in ("kvtune-runtime-reporter", "kvtune-endpoint-picker"):
            continue  # the runtime pods' and the endpoint pickers', not the operator's
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb))
    expected = _rbac_doc_rules(namespaced)
    assert len(expected) > 20, "docs/rbac.md's table was not parsed"
    assert granted == expected, (
        f"chart grants more: {sorted(granted - expected)}; less: {sorted(expected - granted)}")


def test_packaged_chart_carries_what_it_renders_and_no_tooling(helm: Path, tmp_path: Path) -> None:
    import tarfile

    run_helm(helm, "package", str(CHART), "-d", str(tmp_path))
    (archive,) = tmp_path.glob("kvtune-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    for needed in ("kvtune/values.schema.json", "kvtune/crds/kopf-peering.yaml",
                   "kvtune/files/argocd/health.lua", "kvtune/README.md"):
        assert needed in names
    assert {f"kvtune/files/crds/{p.name}" for p in (CHART / "files/crds").glob("*.yaml")} <= names
    assert {f"kvtune/dashboards/{p.name}" for p in (CHART / "dashboards").glob("*.json")} <= names
    assert not [n for n in names if n.startswith("kvtune/hack/")]


@pytest.mark.parametrize(("args", "namespaces"), [
    ([], set()),  # cluster mode: nowhere unless listed
    (["--set", "runtime.namespaces={llm}"], {"llm"}),
    (NAMESPACED, {"llm", "batch"}),
    ([*NAMESPACED, "--set", "runtime.namespaces={llm}"], {"llm"}),
], ids=["cluster", "cluster-listed", "namespaced", "namespaced-listed"])
def test_calibration_is_granted_per_runtime_namespace_never_cluster_wide(
        helm: Path, args: list[str], namespaces: set[str]) -> None:
    """Jobs and ConfigMap writes (the KV-quality calibration Job and its report) are a Role
    in each runtime namespace; no ClusterRole grants them (routing's ConfigMap writes only
    with routing.enabled)."""
    docs = render(helm, *args)
    writes = {"create", "patch", "update", "delete"}

    def writes_jobs_or_configmaps(rule: dict[str, Any]) -> bool:
        return bool(writes & set(rule["verbs"])) and bool(
            {"jobs", "configmaps"} & set(rule["resources"]))

    assert [r for r in rules_of(docs, "ClusterRole") if writes_jobs_or_configmaps(r)] == []
    granted = {d["metadata"]["namespace"] for d in by_kind(docs, "Role")
               if d["metadata"]["name"] not in ("kvtune-runtime-reporter",
                                                "kvtune-endpoint-picker",
                                                # the loop's one ConfigMap, release namespace
                                                "kvtune-model-calibration")
               and any(writes_jobs_or_configmaps(r) for r in d["rules"])}
    assert granted == namespaces
    routed = rules_of(render(helm, *args, "--set", "routing.enabled=true"),
                      "ClusterRole" if "operator.namespaced=true" not in args else "Role")
    assert any("inferencepools" in r["resources"] for r in routed)


@pytest.mark.parametrize("args", [[], NAMESPACED], ids=["cluster", "namespaced"])
def test_the_operator_may_only_read_the_endpoint_pickers_service_account(
        helm: Path, args: list[str]) -> None:
    """RoutingReady's check that kvtune-endpoint-picker exists: get on that one name, granted
    only with routing.enabled; no list, no other ServiceAccount, no write."""
    from kvtune.operator.routing import endpoint_picker

    kind = "Role" if args else "ClusterRole"

    def service_account_rules(extra: list[str]) -> list[dict[str, Any]]:
        return [r for d in by_kind(render(helm, *args, *extra), kind)
                if d["metadata"]["name"] not in ("kvtune-runtime-reporter",
                                                 "kvtune-endpoint-picker")
                for r in d["rules"] if "serviceaccounts" in r["resources"]]

    assert service_account_rules([]) == []
    rules = service_account_rules(["--set", "routing.enabled=true"])
    assert rules and all(r == {"apiGroups": [""], "resources": ["serviceaccounts"],
                               "resourceNames": [endpoint_picker.SERVICE_ACCOUNT],
                               "verbs": ["get"]} for r in rules)


@pytest.mark.parametrize(("args", "namespaces"), [
    ([], set()),  # cluster mode: nowhere unless listed
    (["--set", "runtime.namespaces={llm}"], {"llm"}),
    (NAMESPACED, {"llm", "batch"}),  # namespaced mode: every watched namespace
    ([*NAMESPACED, "--set", "runtime.namespaces={llm}"], {"llm"}),
], ids=["cluster", "cluster-listed", "namespaced", "namespaced-listed"])
def test_runtime_access_objects_are_the_operators_own(
        helm: Path, args: list[str], namespaces: set[str]) -> None:
    """The chart creates exactly what operator/render/runtime_access.py describes (the operator
    renders those names into the runtime pods), in the runtime namespaces only."""
    from kvtune.operator.render import runtime_access

    docs = render(helm, *args)
    ours = {(o["kind"], o["metadata"]["name"]) for o in runtime_access.namespace_objects("x")}
    rendered = [d for d in docs if (d["kind"], d["metadata"]["name"]) in ours]
    assert {d["metadata"]["namespace"] for d in rendered} == namespaces
    for ns in namespaces:
        expected = runtime_access.namespace_objects(ns)
        got = [d for d in rendered if d["metadata"]["namespace"] == ns]
        for doc in got:
            doc["metadata"]["labels"] = {}
        assert got == expected


@pytest.mark.parametrize(("args", "namespaces"), [
    ([], set()),  # routing off: no endpoint picker anywhere
    (["--set", "routing.enabled=true"], set()),  # cluster mode: nowhere unless listed
    (["--set", "routing.enabled=true", "--set", "runtime.namespaces={llm}"], {"llm"}),
    ([*NAMESPACED, "--set", "routing.enabled=true"], {"llm", "batch"}),
], ids=["off", "cluster", "cluster-listed", "namespaced"])
def test_endpoint_picker_access_objects_are_the_operators_own(
        helm: Path, args: list[str], namespaces: set[str]) -> None:
    """The chart creates exactly what operator/routing/endpoint_picker.py describes (the operator
    renders that ServiceAccount into the endpoint pickers' pods), in the runtime namespaces."""
    from kvtune.operator.routing import endpoint_picker

    docs = render(helm, *args)
    ours = {(o["kind"], o["metadata"]["name"]) for o in endpoint_picker.namespace_objects("x")}
    rendered = [d for d in docs if (d["kind"], d["metadata"]["name"]) in ours]
    assert {d["metadata"]["namespace"] for d in rendered} == namespaces
    for ns in namespaces:
        got = [d for d in rendered if d["metadata"]["namespace"] == ns]
        for doc in got:
            doc["metadata"]["labels"] = {}
        assert got == endpoint_picker.namespace_objects(ns)
    (deploy,) = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in
           deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[endpoint_picker.IMAGE_ENV] == endpoint_picker.DEFAULT_IMAGE
    # The chart's default resources are the operator's own default (one source each side).
    assert json.loads(env[endpoint_picker.RESOURCES_ENV]) == endpoint_picker.RESOURCES


def test_admission_policy_guards_the_operators_own_writes(helm: Path) -> None:
    docs = render(helm, "--set", "podPolicy.allowedServiceAccounts={weights-reader}",
                  "--set", "podPolicy.allowedSecrets={hf-token}",
                  "--set", "podPolicy.allowedImages={registry.example/vllm/*}")
    every = by_kind(docs, "ValidatingAdmissionPolicy")
    names = ["kvtune-operator-lws-leaders", "kvtune-operator-lws-workers",
             "kvtune-operator-pods", "kvtune-operator-shapes", "kvtune-operator-writes",
             "kvtune-tenant-secrets"]
    assert sorted(p["metadata"]["name"] for p in every) == names
    assert sorted(b["spec"]["policyName"] for b in by_kind(
        docs, "ValidatingAdmissionPolicyBinding")) == names
    # The tenant-secrets policy applies to every writer of an InferenceDeployment (issue 25
    # item 3): one authorizer check per index of spec.runtime.secrets (at most 16).
    (tenant,) = [p for p in every if p["metadata"]["name"] == "kvtune-tenant-secrets"]
    assert "matchConditions" not in tenant["spec"]
    checks = [v["expression"] for v in tenant["spec"]["validations"]]
    assert len(checks) == 16 and all(".check('get').allowed()" in c for c in checks)
    policies = [p for p in every if p is not tenant]
    assert {b["spec"]["validationActions"][0] for b in by_kind(
        docs, "ValidatingAdmissionPolicyBinding")} == {"Deny"}
    for policy in policies:
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == (
            "request.userInfo.username == 'system:serviceaccount:kvtune-system:kvtune'")
    text = " ".join(v["expression"] for p in policies for v in p["spec"]["validations"])
    assert "['kube-system','kube-public','kube-node-lease','kvtune-system']" in text
    assert "['default','kvtune-runtime','weights-reader']" in text
    assert "in ['hf-token']" in text
    # The policy's Pod Security lists are the renderer's (operator/render/pod_policy.py).
    from kvtune.operator.render import pod_policy

    caps = "[" + ",".join(f"'{c}'" for c in sorted(pod_policy.BASELINE_CAPABILITIES)) + "]"
    assert caps in text
    for sysctl in pod_policy.SAFE_SYSCTLS:
        assert f"'{sysctl}'" in text
    # Every kind the operator's RBAC lets it write is matched by the policies.
    matched = {r for p in policies for rule in p["spec"]["matchConstraints"]["resourceRules"]
               for r in rule["resources"]}
    assert {"deployments", "services", "poddisruptionbudgets", "jobs", "configmaps",
            "inferencepools", "httproutes", "prometheusrules", "podmonitors",
            "servicemonitors", "events", "inferencedeployments", "leaderworkersets"} <= matched
    # The pod rules are the same for every pod template the operator writes: a Deployment's
    # or Job's, and a LeaderWorkerSet's leader (the workerTemplate when it has none) and
    # workers (operator/render/workload_pods.py reads the same paths).
    pods = {p["metadata"]["name"].removeprefix("kvtune-operator-"): p for p in policies
            if p["metadata"]["name"] in names[:3]}
    templates = {k: p["spec"]["variables"][0] for k, p in pods.items()}
    assert templates == {
        "pods": {"name": "template", "expression": "object.spec.template"},
        "lws-leaders": {"name": "template", "expression": (
            "has(object.spec.leaderWorkerTemplate.leaderTemplate) ? "
            "dyn(object.spec.leaderWorkerTemplate.leaderTemplate) : "
            "dyn(object.spec.leaderWorkerTemplate.workerTemplate)")},
        "lws-workers": {"name": "template", "expression": (
            "dyn(object.spec.leaderWorkerTemplate.workerTemplate)")}}
    assert {r for rule in pods["lws-workers"]["spec"]["matchConstraints"]["resourceRules"]
            for r in rule["resources"]} == {"leaderworkersets"}
    rules = {k: [v["expression"] for v in p["spec"]["validations"]] for k, p in pods.items()}
    picker = "kvtune-endpoint-picker"
    assert len(rules["pods"]) == len(rules["lws-leaders"]) == len(rules["lws-workers"]) == 20
    # Only a Deployment kvtune renders for an endpoint picker may run as its account.
    assert [r for r in rules["lws-leaders"] if picker in r] == []
    assert rules["lws-workers"] == rules["lws-leaders"]
    for k in ("lws-leaders", "lws-workers"):
        assert [r for r in rules["pods"] if picker not in r] == [
            r for r in rules[k] if "serviceAccount" not in r]
    (deploy,) = by_kind(docs, "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--allowed-service-account=weights-reader" in args
    assert "--allowed-secret=hf-token" in args
    assert "--tenant-secrets-admission" in args
    assert "--allowed-image=registry.example/vllm/*" in args
    off = render(helm, "--set", "admissionPolicy.enabled=false")
    assert by_kind(off, "ValidatingAdmissionPolicy") == []
    (deploy,) = by_kind(off, "Deployment")
    assert "--tenant-secrets-admission" not in deploy["spec"]["template"]["spec"]["containers"][
        0]["args"]


def test_kube_version_floor_is_what_the_chart_renders(helm: Path) -> None:
    # The admission policy (on by default) is admissionregistration.k8s.io/v1
    # ValidatingAdmissionPolicy, served from Kubernetes 1.30: the chart refuses older clusters.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.30.0-0"
    kinds = {d["kind"] for d in render(helm, "--kube-version", "1.30.0")}
    assert "ValidatingAdmissionPolicy" in kinds
    old = run_helm(helm, "template", "kvtune", str(CHART), "--kube-version", "1.29.9",
                   check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr, old.stderr


def test_the_calibration_jobs_default_image_reaches_the_operator(helm: Path) -> None:
    # kvtune's runtime image for the pool's GPU class ({gpuClass}, filled in per pool by
    # operator/calibration/calibration_job.py), tagged as runtime_images/build.sh tags this release.
    def image(*args: str) -> str:
        (deploy,) = by_kind(render(helm, *args), "Deployment")
        (container,) = deploy["spec"]["template"]["spec"]["containers"]
        return next(e["value"] for e in container["env"]
                    if e["name"] == "KVTUNE_CALIBRATION_IMAGE")

    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert image() == f"ghcr.io/kvtune/kvtune-vllm-{{gpuClass}}:{version}-vllm0.33.0"
    assert image("--set", "calibration.image.repository=reg.local/kvq",
                 "--set-string", "calibration.image.tag=7") == "reg.local/kvq:7"
    assert image("--set", "calibration.image.repository=") == ""


def test_search_jobs_values_reach_the_operator_and_grant_only_with_jobs(helm: Path) -> None:
    """search.mode and search.job become the operator's environment, read back by the
    operator's own parser; Jobs are granted only with mode job or auto (docs/search-jobs.md)."""
    from kvtune.operator.search import search_jobs

    def settings_and_roles(*values: str) -> tuple[search_jobs.JobSettings, list[Any], str]:
        docs = render(helm, *values)
        (deploy,) = by_kind(docs, "Deployment")
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        roles = [d for d in by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
                 if d["metadata"]["name"].endswith("-searchjobs")]
        return search_jobs.settings(env), roles, container["image"]

    s, roles, image = settings_and_roles()
    assert s.mode == "inProcess" and roles == []
    assert s.image == image  # the Job runs the operator's own image
    assert dict(s.resources) == search_jobs.DEFAULT_RESOURCES
    assert (s.backoff_limit, s.ttl_seconds) == (2, 3600)
    s, roles, _ = settings_and_roles("--set", "search.mode=job", "--set",
                                     "search.job.image=reg.example/kvtune:9", "--set",
                                     "search.job.backoffLimit=5")
    assert (s.mode, s.image, s.backoff_limit) == ("job", "reg.example/kvtune:9", 5)
    (role,) = roles
    assert role["kind"] == "ClusterRole"
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]} == {
        (("jobs",), ("get", "list", "create", "patch", "delete")),
        (("configmaps",), ("list", "create", "patch", "delete"))}
    _, roles, _ = settings_and_roles("--set", "search.mode=auto", *NAMESPACED)
    assert {r["metadata"]["namespace"] for r in roles} == {"llm", "batch"}
    assert all(r["kind"] == "Role" for r in roles)
    out = run_helm(helm, "template", "kvtune", str(CHART), "--set", "search.mode=sometimes",
                   check=False)
    assert out.returncode != 0 and "/search/mode" in out.stderr, out.stderr
