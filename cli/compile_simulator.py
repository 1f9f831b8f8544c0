"""`kvtune compile-simulator`: compile the simulator's scheduler to C (mypyc) where kvtune is
installed, or take the compiled build out again.

Why: once the block pool's loops are compiled (numba, ``tuner/simulator/compiled.py``), the
scheduler's Python is most of what a simulated request costs: ~120 Python calls per
scheduling loop, none above 5 % of a run. mypyc compiles the same typed sources (``mypy
--strict`` clean) to C extension modules, and the simulator runs them 1.6-3.4x faster
(``bench/simulate_mypyc_bench.py``; docs/simulator.md "Speed") with the same results bit for
bit (``tests/simulator/test_sim_mypyc.py``). The operator image ships this build (its
Dockerfile's first stage runs this command); a pip install is pure Python until its user runs
it, because a wheel with C modules would be one wheel per platform.

What it does: copies the installed ``kvtune`` package to a scratch folder, runs mypyc on the
modules ``compiled.MYPYC_MODULES`` names, and puts the extension modules beside their sources
(the shared ``*__mypyc`` library at the top of site-packages, as every mypyc-compiled package
has it). Python imports an extension module before a source of the same name, so the compiled
scheduler is what runs; ``--remove`` deletes the ``.so`` files and gives the Python back.

It refuses a source checkout (an editable install): an extension module there would hide
every later edit of its source.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import click

from kvtune.tuner.simulator.compiled import MYPYC_MODULES

# What a staged copy of the package leaves out (an earlier build's .so files among them).
STAGING_IGNORE = shutil.ignore_patterns("__pycache__", "*.so", ".mypy_cache")
_SITE_OPTION = "--site-packages"
# mypyc type-checks what it compiles, under the settings the sources are checked with in the
# checkout (pyproject.toml's [tool.mypy]; the wheel does not carry it, and
# tests/packaging/test_compile_command.py holds the two equal). Without the pydantic plugin a
# model's constructor is typed by its fields and valid calls fail; without
# ignore_missing_imports, numba's missing stubs do. All but ``strict``: its extra checks change
# no type mypyc compiles by, and an install has no stub packages (the dev extra's types-PyYAML),
# so under strict a yaml call returning Any fails where the checkout passes.
MYPY_CONFIG = {"python_version": "3.11", "plugins": "pydantic.mypy",
               "ignore_missing_imports": "True"}


def installed_site_packages() -> Path:
    """The folder that holds this interpreter's ``kvtune`` package."""
    import kvtune

    return Path(next(iter(kvtune.__path__))).resolve().parent


def _module_file(module: str) -> Path:
    return Path(*module.split(".")).with_suffix(".py")


def _record(site_packages: Path) -> Path:
    """The installed wheel's RECORD: pip removes every file it lists on uninstall or
    upgrade, so the compiled modules are listed there too and never outlive their sources."""
    found = sorted(site_packages.glob("kvtune-*.dist-info/RECORD"))
    if len(found) != 1:
        raise click.ClickException(
            f"{_SITE_OPTION}={site_packages}: expected one kvtune-*.dist-info/RECORD, found "
            f"{len(found)}; reinstall the kvtune wheel there (pip install --force-reinstall)")
    return found[0]


def compiled_files(site_packages: Path) -> list[Path]:
    """The extension modules an earlier compile wrote under ``site_packages``. The wheel is
    pure Python (``py3-none-any``), so every ``.so`` its RECORD lists came from a compile."""
    lines = _record(site_packages).read_text().splitlines()
    return [site_packages / line.split(",", 1)[0] for line in lines
            if line.split(",", 1)[0].endswith(".so")]


def _set_recorded(site_packages: Path, compiled: list[Path]) -> None:
    record = _record(site_packages)
    kept = [line for line in record.read_text().splitlines()
            if line and not line.split(",", 1)[0].endswith(".so")]
    added = [f"{path.relative_to(site_packages).as_posix()},," for path in compiled]
    record.write_text("\n".join(kept + added) + "\n")


def remove_compiled(site_packages: Path) -> list[Path]:
    """Delete the compiled modules (and their RECORD lines): the Python runs again."""
    gone = compiled_files(site_packages)
    for path in gone:
        path.unlink(missing_ok=True)
    _set_recorded(site_packages, [])
    return gone


def check_installed(site_packages: Path) -> None:
    """Raise a one-line ClickException unless ``site_packages`` holds a wheel's kvtune."""
    if not (site_packages / "kvtune" / "tuner" / "simulator" / "scheduler.py").is_file():
        raise click.ClickException(
            f"{_SITE_OPTION}={site_packages}: no installed kvtune there "
            "(kvtune/tuner/simulator/scheduler.py is missing); pass the site-packages of a "
            "venv where the kvtune wheel is installed")
    if not any(site_packages.glob("kvtune-*.dist-info")):
        raise click.ClickException(
            f"{_SITE_OPTION}={site_packages}: not a wheel install (a source checkout?); a "
            "compiled module there would hide every later edit of its source. Install the "
            "wheel in a venv (pip install kvtune, or `pip install .` from a checkout) and "
            "compile that")


def check_toolchain() -> None:
    """Raise a one-line ClickException naming what mypyc lacks: mypy, a C compiler, or
    Python's headers."""
    if importlib.util.find_spec("mypyc") is None:
        raise click.ClickException(
            "mypyc is not installed here: run `pip install 'kvtune[compile]'` (mypy) first")
    if not any(shutil.which(cc) for cc in (os.environ.get("CC", ""), "cc", "gcc", "clang")
               if cc):
        raise click.ClickException(
            "no C compiler on PATH (cc, gcc or clang; or set CC): install one "
            "(Debian/Ubuntu: apt-get install gcc)")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        raise click.ClickException(
            f"Python's headers are missing ({headers}): install them "
            f"(Debian/Ubuntu: apt-get install python{sys.version_info[0]}-dev)")


def compile_into(site_packages: Path) -> list[Path]:
    """Compile the listed modules of the kvtune under ``site_packages`` and write their
    extension modules there; returns what was written (the command also lists it in the
    wheel's RECORD; a staged checkout has none)."""
    package = site_packages / "kvtune"
    with tempfile.TemporaryDirectory(prefix="kvtune-mypyc-") as tmp:
        stage = Path(tmp)
        shutil.copytree(package, stage / "kvtune", ignore=STAGING_IGNORE)
        settings = "".join(f"{key} = {value}\n" for key, value in MYPY_CONFIG.items())
        (stage / "mypy.ini").write_text(f"[mypy]\n{settings}")
        paths = [str(_module_file(module)) for module in MYPYC_MODULES]
        done = subprocess.run([sys.executable, "-m", "mypyc", *paths], cwd=stage,
                              capture_output=True, text=True, check=False,
                              env={**os.environ, "MYPYC_OPT_LEVEL": "3"})
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise click.ClickException(f"mypyc failed (exit {done.returncode}): {tail}")
        written = []
        for so in sorted(stage.glob("*.so")) + sorted(stage.glob("kvtune/**/*.so")):
            dest = site_packages / so.relative_to(stage)
            shutil.copy2(so, dest)
            written.append(dest)
    return written


@click.command("compile-simulator")
@click.option(_SITE_OPTION, "site_packages", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="The site-packages holding the installed kvtune (default: "
                                 "the one this kvtune runs from).")
@click.option("--remove", is_flag=True,
              help="Delete the compiled modules: the simulator runs as Python again.")
def compile_simulator(site_packages: Path | None, remove: bool) -> None:
    """Compile the simulator's scheduler to C with mypyc (2-3x faster, same results).

    Needs mypy (`pip install 'kvtune[compile]'`), a C compiler and Python's headers;
    takes 1-2 minutes on 2 cores."""
    site = (site_packages or installed_site_packages()).resolve()
    check_installed(site)
    if remove:
        gone = remove_compiled(site)
        click.echo(f"kvtune compile-simulator: removed {len(gone)} compiled modules from "
                   f"{site}; the simulator runs as Python")
        return
    check_toolchain()
    start = time.monotonic()
    # An earlier build's shared library may carry another name: it goes first.
    remove_compiled(site)
    written = compile_into(site)
    _set_recorded(site, written)
    click.echo(f"kvtune compile-simulator: {len(written)} extension modules in {site} "
               f"({time.monotonic() - start:.0f} s); the simulator runs compiled "
               f"(`kvtune compile-simulator --remove` undoes it)")
