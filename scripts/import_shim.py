"""Build (and print the path of) a tree of links that spells kvtune's import names.

The folders are mapped to import names by setuptools (``[tool.setuptools.package-dir]`` in
pyproject.toml: ``tuner/`` is ``kvtune.tuner``, ``runtime_images/entrypoint/`` is
``kvtune.runtime``, ...), which static tools (mypy, import-linter's grimp) cannot follow through
the editable-install hook. The tree is made from that table, so it cannot drift from it:
``build/import-shim/kvtune/__init__.py`` links to ``kvtune_pkg/__init__.py`` and
``build/import-shim/kvtune/<name>`` to each mapped folder.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build(repo: Path = REPO) -> Path:
    mapping: dict[str, str] = tomllib.loads((repo / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-dir"]
    shim = repo / "build" / "import-shim"
    root = shim / "kvtune"
    root.mkdir(parents=True, exist_ok=True)
    for name, folder in mapping.items():
        parts = name.split(".")
        if parts == ["kvtune"]:
            link, target = root / "__init__.py", repo / folder / "__init__.py"
        else:
            link, target = root.joinpath(*parts[1:]), repo / folder
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        # Made under a name of this process's own, then renamed over the link: two test
        # processes (pytest -n) building the tree at once both end with the right link,
        # instead of one failing on a link the other just made.
        fresh = link.with_name(f".{link.name}.{os.getpid()}.tmp")
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(target)
        os.replace(fresh, link)
    return shim


if __name__ == "__main__":
    sys.stdout.write(f"{build()}\n")
