"""The project's own checks run with the tests: ruff over the tree, mypy --strict, and the import
contracts (what each part may import: docs/architecture.md). (crds/ and the chart's copy are
checked against the API types in tests/operator and tests/chart.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
                          env=env)


def test_ruff_is_clean() -> None:
    result = _run(str(BIN / "ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_on_every_part() -> None:
    """scripts/mypy.sh: the tuner, quality, the operator, e2e, replay, the oracle, the cli, the
    runtime."""
    result = _run(str(REPO / "scripts" / "mypy.sh"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


def test_import_contracts_hold() -> None:
    """[tool.importlinter] in pyproject.toml: the tuner imports no edge, the facts no planner,
    the operator no e2e/replay/cli, nothing the cli, the runtime no other part."""
    result = _run(str(REPO / "scripts" / "lint_imports.sh"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


# What the vLLM runtime image has besides the standard library: vLLM's own pydantic, and
# nvidia-ml-py installed by runtime_images/Dockerfile.* (imported by name at run time).
RUNTIME_IMAGE_PACKAGES = {"pydantic", "pynvml"}

_EXTERNAL_IMPORTS = """
import json, sys
import grimp
graph = grimp.build_graph("kvtune", include_external_packages=True)
# The entrypoint and the two standard-library modules of the tuner it reads (same wheel).
modules = graph.find_descendants("kvtune.runtime") | {"kvtune.runtime", "kvtune.tuner.knobs",
                                                      "kvtune.tuner.units"}
found = {i.split(".")[0] for m in modules for i in graph.find_modules_directly_imported_by(m)
         if not i.startswith("kvtune")}
print(json.dumps(sorted(found - set(sys.stdlib_module_names) - {"__future__"})))
"""


def test_the_runtime_entrypoint_imports_only_what_its_image_has() -> None:
    shim = _run(sys.executable, str(REPO / "scripts" / "import_shim.py")).stdout.strip()
    result = _run(sys.executable, "-c", _EXTERNAL_IMPORTS,
                  env={**os.environ, "PYTHONPATH": shim})
    assert result.returncode == 0, result.stderr
    third_party = set(json.loads(result.stdout))
    assert third_party, "grimp found no import at all: the shim is wrong"
    assert third_party <= RUNTIME_IMAGE_PACKAGES, third_party - RUNTIME_IMAGE_PACKAGES


def test_no_two_operator_modules_share_a_name() -> None:
    """Inside operator/ a module's name says which one it is (issue 24 item 4): no two
    modules, and no module and sub-package, with one name."""
    operator = REPO / "operator"
    names: dict[str, list[str]] = {}
    for path in operator.rglob("*.py"):
        if path.name != "__init__.py":
            names.setdefault(path.stem, []).append(path.relative_to(REPO).as_posix())
    for package in operator.glob("*/__init__.py"):
        names.setdefault(package.parent.name, []).append(
            package.parent.relative_to(REPO).as_posix() + "/")
    clashes = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert len(names) > 40, "too few modules found: the walk is wrong"
    assert not clashes, clashes


# Issue 24's shape limits: someone new reads a module in one sitting and a function on one
# screen. bench/ (scripts that print figures) and tests/ are outside them.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def _shipped_python_files() -> list[Path]:
    listed = _run("git", "ls-files", "*.py").stdout.split()
    return [REPO / f for f in listed if not f.startswith(("bench/", "tests/"))]


def test_no_module_or_function_outgrows_its_limit() -> None:
    import ast

    files = _shipped_python_files()
    assert len(files) > 200, "git ls-files found too few modules: is this a checkout?"
    too_long = []
    for path in files:
        source = path.read_text()
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(REPO)}: {lines} lines (limit {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: "
                                    f"{length} lines (limit {MAX_FUNCTION_LINES})")
    assert not too_long, "split these into named steps:\n" + "\n".join(too_long)
