"""Packages and package data found from the folders, not listed by hand.

kvtune's folders sit at the top of the checkout (tuner/, operator/, ...) and map to one import
name through ``[tool.setuptools.package-dir]`` in pyproject.toml. setuptools' own ``find``
cannot prefix the names it finds with ``kvtune.``, so a hand list was kept, and it missed
``kvtune.operator.rollout``: the wheel could not run ``kvtune operator``. Here every folder
under a mapped folder that holds a ``.py`` file is a package, and every other file in it or
in its non-package subfolders (templates, data, go.mod) ships as package data.
tests/test_wheel_contents.py builds the wheel and checks that nothing was left out.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import setup

TOP = Path(__file__).resolve().parent
# Never shipped: build and editor droppings.
SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis"}
SKIP_SUFFIXES = {".pyc", ".pyo"}


def package_dirs() -> dict[str, str]:
    with (TOP / "pyproject.toml").open("rb") as f:
        mapping: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return mapping


def _is_package(folder: Path) -> bool:
    return any(p.suffix == ".py" for p in folder.iterdir() if p.is_file())


def _walk(folder: Path) -> list[Path]:
    """Every folder under ``folder`` (itself included), build droppings skipped."""
    found = [folder]
    for child in sorted(folder.iterdir()):
        if child.is_dir() and child.name not in SKIP_DIRS:
            found.extend(_walk(child))
    return found


def _owner(sub: Path, root: Path) -> Path:
    """The package folder a folder's files belong to: itself when it holds a .py file (or is
    the mapped folder), else the nearest such folder above it (a data folder)."""
    owner = sub
    while owner != root and not _is_package(owner):
        owner = owner.parent
    return owner


def discover(mapping: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """(packages, package_data) for a package-dir mapping. A mapped folder inside another
    mapped folder belongs to its own name only."""
    mapped = [(TOP / folder).resolve() for folder in mapping.values()]
    packages: list[str] = []
    data: dict[str, list[str]] = {}
    for name, folder in sorted(mapping.items()):
        root = (TOP / folder).resolve()
        nested = [m for m in mapped if root in m.parents]
        for sub in _walk(root):
            if any(m == sub or m in sub.parents for m in nested):
                continue
            owner = _owner(sub, root)
            pkg = ".".join([name, *owner.relative_to(root).parts])
            if owner == sub:
                packages.append(pkg)
            files = [
                p.relative_to(owner).as_posix()
                for p in sorted(sub.iterdir())
                if p.is_file() and p.suffix != ".py" and p.suffix not in SKIP_SUFFIXES
            ]
            if files:
                data.setdefault(pkg, []).extend(files)
    return packages, data


PACKAGES, PACKAGE_DATA = discover(package_dirs())

setup(packages=PACKAGES, package_data=PACKAGE_DATA)
