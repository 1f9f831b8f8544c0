"""The tuner is pure except at named edges (docs/architecture.md): an ``ast`` walk finds every
file read or write, environment read and package-data access in ``tuner/`` and checks that it
is in one of the edge modules below, each with why it may. A new read elsewhere fails here:
load through ``facts/data_files.py`` (package data) or take the parsed facts as arguments."""

from __future__ import annotations

import ast
from pathlib import Path

TUNER = Path(__file__).resolve().parents[2] / "tuner"

# The edges, by path under tuner/: what each reads or writes.
EDGES = {
    "facts/data_files.py": "the package's own data (facts/data/*.json, efficiency.json)",
    "facts/model_files.py": "a user's config.json and the quantization file beside it",
    "traces.py": "a user's trace (load_trace)",
    "planner/search_budget.py": "the process's own resident set (/proc/self/statm)",
    "simulator/plot.py": "the PNG of kvtune simulate --plot",
}
# Calls that touch files or folders (open(), pathlib's and importlib.resources' methods).
IO_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir",
            "is_file", "is_dir", "exists", "glob", "rglob", "mkdir", "unlink", "savefig",
            "getenv", "listdir", "scandir"}
IO_MODULES = {"importlib.resources", "os", "shutil", "tempfile", "subprocess", "socket",
              "urllib.request", "http.client"}


def _io_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else (
                fn.id if isinstance(fn, ast.Name) else None)
            if name in IO_CALLS:
                found.append((node.lineno, f"{name}()"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name in IO_MODULES]
        elif isinstance(node, ast.ImportFrom):
            modules = {node.module or ""} | {f"{node.module}.{a.name}" for a in node.names}
            found += [(node.lineno, f"from {node.module} import") for m in modules
                      if m in IO_MODULES][:1]
        elif isinstance(node, ast.Attribute) and node.attr == "environ":
            found.append((node.lineno, "environ"))
    return found


def test_the_tuner_reads_and_writes_files_only_at_its_named_edges() -> None:
    stray = [
        f"tuner/{rel}:{line}: {what}"
        for path in sorted(TUNER.rglob("*.py"))
        if (rel := path.relative_to(TUNER).as_posix()) not in EDGES
        for line, what in _io_uses(ast.parse(path.read_text("utf-8")))
    ]
    assert not stray, "I/O outside the tuner's edges (load through facts/data_files.py):\n" \
        + "\n".join(stray)


def test_every_edge_still_does_io_and_the_walk_sees_a_stray_read() -> None:
    # An edge that no longer reads anything should leave the list; and the walk must see
    # the patterns it is meant to catch.
    for rel in EDGES:
        assert _io_uses(ast.parse((TUNER / rel).read_text("utf-8"))), rel
    sample = ("import json\nfrom importlib import resources\n"
              "def f(p):\n    return json.loads(p.read_text())\n")
    assert [w for _, w in _io_uses(ast.parse(sample))] == [
        "from importlib import", "read_text()"]
