"""The checkout's simulator compiled by mypyc, for the tests and the bench.

``kvtune compile-simulator`` (``cli/compile_simulator.py``) compiles an installed wheel; this
module gives a checkout the same build without installing it: ``compiled_checkout()`` lays the
checkout's packages out as installed in a cache folder, compiles them there, and
``env_with_site`` puts that folder first on ``PYTHONPATH``. The checkout itself is never
compiled: an extension module there would hide every later edit of its source.

    python scripts/compile_simulator.py    builds (or finds) the compiled checkout, prints it
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import tomllib
from pathlib import Path

from kvtune.cli.compile_simulator import STAGING_IGNORE, compile_into
from kvtune.tuner.simulator.compiled import MYPYC_MODULES

REPO = Path(__file__).resolve().parents[1]


def stage_checkout(dest: Path, repo: Path = REPO) -> Path:
    """The checkout's packages laid out as installed (``dest/kvtune/...``, by pyproject's
    ``[tool.setuptools.package-dir]``), for a compile without building a wheel."""
    with (repo / "pyproject.toml").open("rb") as f:
        mapping: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(mapping.items()):
        shutil.copytree(repo / folder, dest / Path(*name.split(".")), ignore=STAGING_IGNORE,
                        dirs_exist_ok=True)
    return dest


def compiled_checkout(repo: Path = REPO) -> Path:
    """A site directory holding the checkout's packages with the simulator compiled: put it
    first on ``PYTHONPATH`` (``env_with_site``). Kept in the cache by the digest of the
    sources, mypy's version and Python's, so only a change of either compiles again (~80 s on
    2 cores)."""
    import importlib.metadata

    from kvtune.e2e.binaries import cache_dir

    building = cache_dir() / "mypyc" / f"stage.tmp{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    stage_checkout(building, repo)
    digest = hashlib.sha256(f"{sys.version} mypy {importlib.metadata.version('mypy')}".encode())
    for path in sorted(building.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(building)).encode() + b"\0")
            digest.update(path.read_bytes())
    site = building.with_name(digest.hexdigest()[:16])
    if (site / "done").is_file():
        shutil.rmtree(building)
        return site
    compile_into(building)
    (building / "done").write_text(", ".join(MYPYC_MODULES) + "\n")
    shutil.rmtree(site, ignore_errors=True)
    building.rename(site)
    return site


def env_with_site(site: Path) -> dict[str, str]:
    """This process's environment with ``site`` first on ``PYTHONPATH``. No empty entry: that
    would put the working directory first (a checkout's ``operator`` folder would hide the
    standard library's)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    return env


def main() -> int:
    start = time.monotonic()
    site = compiled_checkout()
    print(f"compiled checkout: {site} ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
