"""Every file, module, function and command that README.md and docs/*.md name in backticks
exists: a path (`operator/rollout/plan.py`, `tuner/facts/data/models/*.json`), a dotted kvtune
name (`kvtune.tuner.planner.planning.plan_pool`) and a command with its options
(`kvtune plan --from-cluster NAME -o patch`). Docs that name what was renamed or removed fail
here instead of misleading a reader."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import click
import pytest

from kvtune.cli.main import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PATH = re.compile(r"^[\w.\-*<>/]+\.(py|md|json|jsonl|yaml|yml|j2|sh|toml|csv|txt|tpl|mod)$")
DOTTED = re.compile(r"^kvtune(\.\w+)+$")
# Folders a doc's relative path may start from: the repository, and each package folder
# (docs/planner.md says `facts/kv_scheme.py` inside the tuner).
PACKAGE_FOLDERS = ["tuner", "operator", "cli", "e2e", "oracle", "replay", "quality",
                   "runtime_images/entrypoint", "runtime_images", "charts/kvtune"]
# Named on purpose though they are not in this repository, each with why.
IGNORED = {
    # vLLM 0.33.0's own source files (docs/quality.md, docs/simulator.md quote the wheel).
    "vllm_paths": ("model_executor/", "v1/", "layers/", "compressed_tensors/", "model_loader/",
                   "sched/", "vllm/"),
    # The CRDs' API group, not a module.
    "api_group": ("kvtune.io",),
}


def _spans() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = FENCE.sub("", doc.read_text(encoding="utf-8"))
        found += [(doc.relative_to(REPO).as_posix(), m.group(1).strip())
                  for m in SPAN.finditer(text)]
    return found


def _path_exists(token: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", token)
    for base in ["", *PACKAGE_FOLDERS]:
        root = REPO / base
        if any(ch in pattern for ch in "*?"):
            if any(root.glob(pattern)):
                return True
        elif (root / pattern).exists():
            return True
    return False


def _ignored(token: str) -> bool:
    return token.startswith(IGNORED["vllm_paths"])


def _dotted_exists(name: str) -> bool:
    """The longest importable prefix, then attributes for the rest."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _command_problem(words: list[str]) -> str | None:
    """None when ``kvtune WORDS`` names a real command (and subcommand) whose every long
    option exists; else what is wrong."""
    command: click.Command = cli
    ctx = click.Context(cli)
    rest = words
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            # A bare word after a leaf-less group is a value, not a command (``kvtune`` alone).
            return f"no command {rest[0]!r}"
        command, rest = sub, rest[1:]
        ctx = click.Context(command)
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    known |= {"--help"}
    for word in rest:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag not in known and not flag.strip("-").isupper():
            return f"{command.name} has no option {flag}"
    return None


SPANS = _spans()


def test_the_docs_name_things_at_all() -> None:
    # The parser must find each kind, or the checks below check nothing.
    tokens = [t for _, t in SPANS]
    assert sum(bool(PATH.match(t)) for t in tokens) > 100
    assert sum(bool(DOTTED.match(t)) for t in tokens) > 5
    assert sum(t.startswith("kvtune ") for t in tokens) > 20


@pytest.mark.parametrize("kind", ["paths", "dotted", "commands"])
def test_every_name_in_the_docs_exists(kind: str) -> None:
    missing = []
    for doc, token in SPANS:
        if kind == "paths" and PATH.match(token) and "/" in token and not _ignored(token):
            if not _path_exists(token):
                missing.append(f"{doc}: `{token}`")
        elif kind == "dotted" and DOTTED.match(token) and token not in IGNORED["api_group"]:
            if not _dotted_exists(token):
                missing.append(f"{doc}: `{token}`")
        elif kind == "commands" and token.startswith("kvtune "):
            try:
                words = shlex.split(token)[1:]
            except ValueError:
                words = token.split()[1:]
            problem = _command_problem(words)
            if problem is not None:
                missing.append(f"{doc}: `{token}`: {problem}")
    assert not missing, "the docs name what does not exist:\n" + "\n".join(missing)


def test_the_checks_catch_what_is_gone() -> None:
    assert not _path_exists("operator/rollout/nothing_here.py")
    assert _path_exists("tuner/facts/data/models/*.json")
    assert _path_exists("tuner/planner/decide_<knob>.py")
    assert not _dotted_exists("kvtune.tuner.planner.planning.no_such_function")
    assert _dotted_exists("kvtune.tuner.planner.planning.plan_pool")
    assert _command_problem(["plan", "--no-such-flag"]) is not None
    assert _command_problem(["cluster", "sideways"]) is not None
    assert _command_problem(["cluster", "up"]) is None
    assert _command_problem(["plan", "--from-cluster", "NAME", "-o", "patch"]) is None


# --- docs/architecture.md against the code (issue 24) ---------------------------------------
ARCHITECTURE = REPO / "docs" / "architecture.md"
OPERATOR = REPO / "operator"
# The operator's tree in the fenced drawing: from its ` operator/` line to the next part's.
OPERATOR_TREE = re.compile(r"^ operator/ .*?(?=^ tuner/ )", re.M | re.S)
TREE_MODULE = re.compile(r"(?<![\w/])([a-z_]+)\.py\b")
TREE_PACKAGE = re.compile(r"^   ([a-z_]+)/ ", re.M)
CONTRACT_ROW = re.compile(r"^\| `([a-z\-]+)` \| (.*) \|$", re.M)


def _pyproject_contracts() -> dict[str, dict[str, object]]:
    import tomllib

    with (REPO / "pyproject.toml").open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return {c["id"]: c for c in contracts}


def _operator_tree() -> str:
    found = OPERATOR_TREE.search(ARCHITECTURE.read_text(encoding="utf-8"))
    assert found, "docs/architecture.md lost its operator/ drawing"
    return found.group(0)


def test_the_architecture_drawing_names_only_operator_modules_that_exist() -> None:
    """Every `x.py` of the operator's drawing is a module of operator/ (module names are
    unique there: tests/test_code_quality.py), every sub-package drawn exists, and every
    sub-package that exists is drawn."""
    tree = _operator_tree()
    modules = {p.stem for p in OPERATOR.rglob("*.py")} | {"__init__"}
    named = set(TREE_MODULE.findall(tree))
    assert named, "no module found in the operator's drawing: the pattern is wrong"
    assert named <= modules, f"drawn but not in operator/: {sorted(named - modules)}"
    packages = {p.parent.name for p in OPERATOR.glob("*/__init__.py")}
    drawn = set(TREE_PACKAGE.findall(tree))
    assert drawn == packages, (f"drawn, no such sub-package: {sorted(drawn - packages)}; "
                               f"not drawn: {sorted(packages - drawn)}")
    top = {p.stem for p in OPERATOR.glob("*.py")} - {"__init__"}
    assert top <= named, f"operator/ modules the drawing leaves out: {sorted(top - named)}"


def test_the_architecture_contracts_are_pyprojects() -> None:
    """The contract table names exactly the contracts of [tool.importlinter], and the
    operator's layers in the order pyproject.toml checks them."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    rows = dict(CONTRACT_ROW.findall(text))
    contracts = _pyproject_contracts()
    assert set(rows) == set(contracts), (
        f"in the doc only: {sorted(set(rows) - set(contracts))}; "
        f"in pyproject only: {sorted(set(contracts) - set(rows))}")
    layers = contracts["operator-layers"]["layers"]
    assert isinstance(layers, list)
    said = [w.strip("`") for w in rows["operator-layers"].split(" (")[0].split(": ", 1)[1]
            .replace("\\|", "|").split(" > ")]
    assert said == [" | ".join(f"`{p}`" for p in layer.split(" | ")).strip("`")
                    for layer in layers], said
