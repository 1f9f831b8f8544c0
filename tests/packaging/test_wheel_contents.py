"""The wheel holds every module and data file of kvtune's package folders (issue 21: a hand
list of packages left out kvtune.operator.rollout, and the operator image could not start)."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow


def test_the_wheel_holds_every_file_of_the_package_folders(
    built_dists: tuple[Path, Path], wheel_check: ModuleType
) -> None:
    _, wheel = built_dists
    expected = wheel_check.expected_wheel_files()
    # The folders that were once forgotten, and a data file of each kind: the check must see them.
    # The operator's sub-packages (issue 24 item 4) each ship.
    for path in ("kvtune/operator/rollout/__init__.py",
                 "kvtune/operator/render/templates/pod.yaml.j2",
                 *(f"kvtune/operator/{sub}/__init__.py"
                   for sub in ("api", "kube", "prometheus", "render", "routing", "calibration",
                               "search", "monitoring", "retune")),
                 "kvtune/tuner/facts/data/gpus.json", "kvtune/e2e/kwok-stages.yaml",
                 "kvtune/e2e/gomod/k8s/go.mod", "kvtune/quality/data/calibration-v1.jsonl",
                 "kvtune/runtime/__main__.py", "kvtune/__init__.py"):
        assert path in expected, path
    assert wheel_check.missing_from_wheel(wheel) == []


def test_the_check_names_a_module_the_wheel_lacks(
    built_dists: tuple[Path, Path], wheel_check: ModuleType, tmp_path: Path
) -> None:
    """A wheel without kvtune.operator.rollout (the shipped defect) fails the check."""
    _, wheel = built_dists
    cut = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(cut, "w") as dst:
        for item in src.infolist():
            if not item.filename.startswith("kvtune/operator/rollout/"):
                dst.writestr(item, src.read(item))
    missing = wheel_check.missing_from_wheel(cut)
    assert "kvtune/operator/rollout/__init__.py" in missing
    assert all(m.startswith("kvtune/operator/rollout/") for m in missing)


def test_the_sdist_builds_the_wheel_alone(built_dists: tuple[Path, Path]) -> None:
    """The wheel is built from the sdist, so the sdist must carry setup.py (the discovery) and
    pyproject.toml's mapping; and the console script is in the wheel."""
    sdist, wheel = built_dists
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"setup.py", "pyproject.toml", "operator/rollout/__init__.py"} <= names
    with zipfile.ZipFile(wheel) as archive:
        entry_points = next(n for n in archive.namelist() if n.endswith("entry_points.txt"))
        assert "kvtune = kvtune.cli.main:cli" in archive.read(entry_points).decode()


def test_the_help_check_names_a_command_that_fails(wheel_check: ModuleType, tmp_path: Path) -> None:
    """scripts/wheel_check.py's --help pass fails on a command whose --help breaks (here a
    stand-in kvtune whose `plan` cannot import)."""
    fake = tmp_path / "kvtune"
    fake.write_text('#!/bin/sh\nif [ "$1" = plan ]; then echo "ModuleNotFoundError: x" >&2; '
                    'exit 1; fi\necho "Usage: kvtune $*"\n')
    fake.chmod(0o755)
    problems = wheel_check.help_problems(fake, [[], ["plan"], ["cluster", "up"]])
    assert len(problems) == 1 and problems[0].startswith("kvtune plan --help: exit 1")
    assert "ModuleNotFoundError" in problems[0]
