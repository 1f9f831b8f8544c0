"""The Argo CD health check, run by a real Lua 5.1 against status fixtures.

Argo CD runs health checks in gopher-lua (Lua 5.1) with the live object in the global
``obj`` and reads the returned ``hs`` table. Two interpreters check the same cases: lupa's
bundled Lua 5.1 (always here, a dev dependency) and Debian's ``lua5.1`` when installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import lupa.lua51 as lua51
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "charts/kvtune/files/argocd/health.lua"
CASES = yaml.safe_load((Path(__file__).parent / "fixtures/argocd_health_cases.yaml").read_text())
ARGOCD_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


def _to_lua_table(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua_table(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua_table(runtime, v) for v in value])
    return value


def run_with_lupa(obj: dict[str, Any]) -> tuple[str, str]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    assert runtime.eval("_VERSION") == "Lua 5.1"
    runtime.globals().obj = _to_lua_table(runtime, obj)
    # Argo CD runs the script as a chunk and takes its return value.
    hs = runtime.execute(SCRIPT.read_text())
    return hs["status"], hs["message"]


def _lua_literal(value: Any) -> str:
    if isinstance(value, dict):
        fields = (f"[{json.dumps(k)}]={_lua_literal(v)}" for k, v in value.items())
        return "{" + ",".join(fields) + "}"
    if isinstance(value, list):
        return "{" + ",".join(_lua_literal(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # JSON escapes are valid Lua escapes for these strings
    return str(value)


def run_with_debian_lua(obj: dict[str, Any], lua: str) -> tuple[str, str]:
    program = (
        f"obj = {_lua_literal(obj)}\n"
        f"local check = assert(loadstring({json.dumps(SCRIPT.read_text())}))\n"
        "local hs = check()\nio.write(hs.status, '\\n', hs.message)\n"
    )
    out = subprocess.run([lua, "-"], input=program, capture_output=True, text=True,
                         check=True, timeout=30).stdout
    status, message = out.split("\n", 1)
    return status, message


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_health_with_lua51(case: dict[str, Any]) -> None:
    status, message = run_with_lupa(case["obj"])
    assert status in ARGOCD_STATUSES
    assert (status, case["message_contains"] in message) == (case["status"], True), message


@pytest.mark.skipif(shutil.which("lua5.1") is None, reason="Debian's lua5.1 is not installed")
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_health_with_debian_lua51(case: dict[str, Any]) -> None:
    assert run_with_debian_lua(case["obj"], "lua5.1") == run_with_lupa(case["obj"])


def test_every_health_status_is_covered() -> None:
    assert {c["status"] for c in CASES} == {"Healthy", "Progressing", "Degraded", "Suspended"}


def test_docs_and_chart_ship_the_same_script() -> None:
    script = SCRIPT.read_text().rstrip("\n")
    docs = (REPO / "docs/argocd.md").read_text()
    assert "resource.customizations.health.kvtune.io_InferenceDeployment: |" in docs
    indented = "\n".join(("    " + line) if line else "" for line in script.splitlines())
    assert indented in docs, "docs/argocd.md's argocd-cm snippet differs from health.lua"
