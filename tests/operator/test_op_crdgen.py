"""The CRD in crds/ is the one the types generate, and it is a structural schema with the
validations the API server enforces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from kvtune.cli.crds import crds
from kvtune.operator.api import crdgen

CRDS_DIR = Path(__file__).resolve().parents[2] / "crds"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for k, v in node.items():
            out += _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _walk(v, f"{path}[{i}]")
    return out


def test_crds_folder_is_up_to_date() -> None:
    result = CliRunner().invoke(crds, ["--check", "--dir", str(CRDS_DIR)])
    assert result.exit_code == 0, result.output + " (run `make crds`)"


def test_check_notices_a_stale_file(tmp_path: Path) -> None:
    (tmp_path / "inferencedeployments.kvtune.io.yaml").write_text("stale\n")
    result = CliRunner().invoke(crds, ["--check", "--dir", str(tmp_path)])
    assert result.exit_code == 1 and "out of date" in result.output


def test_schema_is_structural() -> None:
    schema = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "const" not in node, path
        assert node.get("type") != "null", path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True, path
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["model", "pools"]
    pools = spec["properties"]["pools"]
    assert pools["minItems"] == 1 and pools["maxItems"] == 8
    item = pools["items"]["properties"]
    # 1, 2, 4, 8 or "auto": an int-or-string (no structural mixed enum), checked by CEL.
    tp = item["tensorParallel"]
    assert tp["x-kubernetes-int-or-string"] is True and "type" not in tp
    assert tp["default"] == 1 and "enum" not in tp
    assert tp["x-kubernetes-validations"] == [{
        "rule": "type(self) == string ? self == 'auto' : self in [1, 2, 4, 8]",
        "message": "tensorParallel must be 1, 2, 4, 8 or auto; set one of them"}]
    assert item["replicas"]["minimum"] == 0
    mode = spec["properties"]["tuning"]["properties"]["mode"]
    assert mode["enum"] == ["auto", "recommend", "off"] and mode["default"] == "auto"


def test_cel_rules_and_printer_columns() -> None:
    doc = crdgen.crd()
    version = doc["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("canaryReplicas" in r for r in rules)
    assert any("exists_one" in r for r in rules)
    pin = spec["properties"]["tuning"]["properties"]["pin"]
    assert any("% 16" in r["rule"] for r in pin["x-kubernetes-validations"])
    assert "fp8" in pin["properties"]["kvCacheDtype"]["enum"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Model", "Pools", "Mode", "Ready", "Reason", "Age", "Message"]
    # `kubectl get infd` shows why an object is not Ready: the Ready condition's reason and
    # message, at the default priority (not only with -o wide).
    for name, field in (("Ready", "status"), ("Reason", "reason"), ("Message", "message")):
        assert columns[name]["jsonPath"] == \
            f'.status.conditions[?(@.type=="Ready")].{field}', columns[name]
        assert columns[name].get("priority", 0) == 0
    assert doc["spec"]["names"]["shortNames"] == ["infd"]
    text = (CRDS_DIR / "inferencedeployments.kvtune.io.yaml").read_text()
    assert yaml.safe_load(text) == doc
