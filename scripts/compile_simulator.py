"""Compile the simulator's scheduler to C extension modules (mypyc) in an installed kvtune.

    python scripts/compile_simulator.py [--site-packages DIR]

The scheduler's Python is most of what a simulated request costs once the block pool's loops
are compiled (numba, ``tuner/simulator/compiled.py``): ~120 Python calls per scheduling loop,
none above 5 % of a run. mypyc compiles the same typed sources (``mypy --strict`` clean) to C,
and the simulator runs them 1.6-3.4x faster on the bench's traces
(``bench/simulate_mypyc_bench.py``; docs/simulator.md "Speed"), with the same results bit for
bit (``tests/simulator/test_sim_mypyc.py``).

What it does: copies the installed ``kvtune`` package to a scratch directory, runs mypyc on
the modules ``compiled.MYPYC_MODULES`` names, and puts the extension modules beside their
sources in DIR (the shared ``*__mypyc`` library at DIR's top, as every mypyc-compiled package
has it). Python imports an extension module before a source of the same name, so the
compiled scheduler is what runs; deleting the ``.so`` files gives the Python back.

Needs mypy (the dev extra) and a C compiler; DIR is the ``site-packages`` of a venv where the
wheel is installed (default: this interpreter's ``kvtune``). It refuses the checkout's own
tree: an extension module there would hide every later edit of its source.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_SKIP = shutil.ignore_patterns("__pycache__", "*.so", ".mypy_cache")


def _installed_site_packages() -> Path:
    import kvtune

    return Path(next(iter(kvtune.__path__))).resolve().parent


def _modules() -> tuple[str, ...]:
    from kvtune.tuner.simulator.compiled import MYPYC_MODULES

    return MYPYC_MODULES


def compile_into(site_packages: Path) -> list[Path]:
    """The extension modules written under ``site_packages`` (mypyc, see the module's doc)."""
    package = site_packages / "kvtune"
    if not (package / "tuner" / "simulator" / "scheduler.py").is_file():
        raise SystemExit(f"--site-packages={site_packages}: no installed kvtune there "
                         "(kvtune/tuner/simulator/scheduler.py is missing); pass the "
                         "site-packages of a venv where the kvtune wheel is installed")
    modules = _modules()
    with tempfile.TemporaryDirectory(prefix="kvtune-mypyc-") as tmp:
        stage = Path(tmp)
        shutil.copytree(package, stage / "kvtune", ignore=_SKIP)
        paths = [str(Path(*m.split(".")).with_suffix(".py")) for m in modules]
        done = subprocess.run([sys.executable, "-m", "mypyc", *paths], cwd=stage,
                              capture_output=True, text=True, check=False,
                              env={**os.environ, "MYPYC_OPT_LEVEL": "3"})
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-3000:]
            raise SystemExit(f"compile_simulator: mypyc failed (needs mypy and a C compiler):\n"
                             f"{tail}")
        written = []
        for so in sorted(stage.glob("*.so")) + sorted(stage.glob("kvtune/**/*.so")):
            dest = site_packages / so.relative_to(stage)
            shutil.copy2(so, dest)
            written.append(dest)
    return written


def stage_checkout(dest: Path, repo: Path = REPO) -> Path:
    """The checkout's packages laid out as installed (``dest/kvtune/...``, by pyproject's
    ``[tool.setuptools.package-dir]``), for a compile without building a wheel."""
    with (repo / "pyproject.toml").open("rb") as f:
        mapping: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(mapping.items()):
        shutil.copytree(repo / folder, dest / Path(*name.split(".")), ignore=_SKIP,
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
    (building / "done").write_text(", ".join(_modules()) + "\n")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--site-packages", type=Path, default=None,
                        help="the site-packages holding the installed kvtune (default: this "
                             "interpreter's)")
    args = parser.parse_args(argv)
    site = (args.site_packages or _installed_site_packages()).resolve()
    if not any(site.glob("kvtune-*.dist-info")):
        raise SystemExit(f"--site-packages={site}: not a wheel install (an editable checkout?); "
                         "a compiled module there would hide every later edit of its source. "
                         "Install the wheel in a venv (scripts/wheel_check.py --install-only) "
                         "and pass its site-packages")
    start = time.monotonic()
    written = compile_into(site)
    print(f"compile_simulator: {len(written)} extension modules in {site} "
          f"({time.monotonic() - start:.0f} s): {', '.join(_modules())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
