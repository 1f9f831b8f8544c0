"""Build kvtune's sdist and wheel the way a user gets them, and check what is in the wheel.

``python scripts/wheel_check.py [--out build/wheel-check]`` builds the sdist, then the wheel
from that sdist (what ``pip install kvtune`` from an index does), and fails when a file under
a folder of ``[tool.setuptools.package-dir]`` is missing from the wheel. tests/packaging/ uses
the same functions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "build" / "wheel-check"


def uv() -> str:
    """The uv of the venv that runs this (the dev extra), else the one on PATH."""
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.exists() else shutil.which("uv")
    if found is None:
        raise SystemExit("wheel_check: uv not found: run scripts/setup.sh python")
    return found


def uv_env() -> dict[str, str]:
    # The shared cache scripts/setup.sh fills: a warm build and install need no download.
    cache = os.environ.get("UV_CACHE_DIR", str(Path.home() / ".cache" / "kvtune" / "uv"))
    return {**os.environ, "UV_CACHE_DIR": cache}


def build_dists(out: Path, repo: Path = REPO) -> tuple[Path, Path]:
    """(sdist, wheel) of ``repo`` in ``out`` (emptied first); the wheel is built from the
    sdist, so a file the sdist lacks is missing from the wheel too."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    done = subprocess.run([uv(), "build", "--quiet", "--out-dir", str(out), str(repo)],
                          env=uv_env(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"wheel_check: uv build failed:\n{done.stdout}{done.stderr}")
    (sdist,) = out.glob("kvtune-*.tar.gz")
    (wheel,) = out.glob("kvtune-*.whl")
    return sdist, wheel


def package_dirs(repo: Path = REPO) -> dict[str, str]:
    with (repo / "pyproject.toml").open("rb") as f:
        mapping: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return mapping


def _tracked(repo: Path, folder: str) -> list[str]:
    """Files under ``folder`` relative to it: git's list in a checkout (untracked scratch
    files are not the project's), every file otherwise (an unpacked sdist)."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--", folder],
                            capture_output=True, text=True, check=False)
    root = repo / folder
    if listed.returncode == 0 and listed.stdout:
        paths = [repo / p for p in listed.stdout.split("\0") if p]
    else:
        paths = [p for p in root.rglob("*") if p.is_file()]
    return [p.relative_to(root).as_posix() for p in paths
            if "__pycache__" not in p.parts and p.suffix != ".pyc"]


def expected_wheel_files(repo: Path = REPO) -> set[str]:
    """The path in the wheel of every file under a mapped folder: modules and data alike
    (templates, JSON facts, go.mod files the e2e binaries read)."""
    mapping = package_dirs(repo)
    expected: set[str] = set()
    for name, folder in mapping.items():
        nested = [f for f in mapping.values() if f != folder and f.startswith(folder + "/")]
        prefix = "/".join(name.split("."))
        for rel in _tracked(repo, folder):
            if any(f"{folder}/{rel}".startswith(n + "/") for n in nested):
                continue
            expected.add(f"{prefix}/{rel}")
    return expected


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if not n.endswith("/")}


def missing_from_wheel(wheel: Path, repo: Path = REPO) -> list[str]:
    return sorted(expected_wheel_files(repo) - wheel_files(wheel))


# Modules of the wheel that need an optional extra to import, each with the reason; a core
# install must import every other one, and the check fails when a listed one imports after all.
# None today: the extras (vllm, quality's torch, plot's matplotlib) are imported inside the
# functions that need them (kvtune.oracle, kvtune.quality.measure, kvtune.tuner.simulator.plot).
OPTIONAL_MODULES: dict[str, str] = {}
# `kvtune plan` and `kvtune simulate` on the shipped examples: what a light install is for.
PLAN_ARGV = ["plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100", "--workload", "chat",
             "--no-search"]
SIMULATE_ARGV = ["simulate", "--trace", str(REPO / "examples" / "traces" / "synthetic_trace.jsonl"),
                 "--limit", "50", "--compare", "planned", "-m", "meta-llama/Llama-3.1-8B-Instruct",
                 "-g", "H100"]


def make_venv(wheel: Path, venv: Path) -> Path:
    """A fresh virtualenv with only ``wheel`` and its core dependencies installed (no editable
    link to this checkout); returns its ``kvtune`` executable."""
    shutil.rmtree(venv, ignore_errors=True)
    for argv in ([uv(), "venv", "--quiet", "--python", sys.executable, str(venv)],
                 [uv(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                  str(wheel)]):
        done = subprocess.run(argv, env=uv_env(), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"wheel_check: {' '.join(argv[:3])} failed:\n{done.stderr}")
    return venv / "bin" / "kvtune"


def _venv_python(venv: Path, code: str) -> subprocess.CompletedProcess[str]:
    # -I: neither the working folder (whose operator/ would shadow the standard library) nor
    # PYTHONPATH reaches the installed package; what imports comes from the venv alone.
    return subprocess.run([str(venv / "bin" / "python"), "-I", "-c", code], cwd=venv,
                          capture_output=True, text=True, check=False)


_IMPORT_ALL = """
import importlib, json, pkgutil, sys, kvtune
assert kvtune.__file__.startswith(sys.prefix), kvtune.__file__
result = {}
for info in pkgutil.walk_packages(kvtune.__path__, "kvtune."):
    if info.name.endswith(".__main__"):
        continue  # importing runs it; `python -m` of its package is the command's own test
    try:
        importlib.import_module(info.name)
        result[info.name] = None
    except Exception as error:
        result[info.name] = f"{type(error).__name__}: {error}".splitlines()[0]
print(json.dumps(result))
"""


def import_problems(venv: Path) -> list[str]:
    """Every module of the installed package, imported in the venv: the ones that fail
    (OPTIONAL_MODULES excepted) and the optional ones that import after all."""
    done = _venv_python(venv, _IMPORT_ALL)
    if done.returncode != 0:
        return [f"import kvtune failed: {done.stderr.strip().splitlines()[-1:]}"]
    result: dict[str, str | None] = json.loads(done.stdout)
    problems = [f"{name}: {error}" for name, error in sorted(result.items())
                if error is not None and name not in OPTIONAL_MODULES]
    problems += [f"{name}: imports without its extra; remove it from OPTIONAL_MODULES"
                 for name in OPTIONAL_MODULES if result.get(name, "absent") is None]
    problems += [f"{name}: not in the wheel; remove it from OPTIONAL_MODULES"
                 for name in OPTIONAL_MODULES if name not in result]
    return problems


_COMMAND_PATHS = """
import json, click
from kvtune.cli.main import cli
def walk(command, path):
    yield path
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from walk(command.get_command(ctx, name), [*path, name])
print(json.dumps(list(walk(cli, []))))
"""


def command_paths(venv: Path) -> list[list[str]]:
    """Every command and subcommand of the installed ``kvtune``, as argv prefixes."""
    done = _venv_python(venv, _COMMAND_PATHS)
    if done.returncode != 0:
        raise SystemExit(f"wheel_check: listing kvtune's commands failed:\n{done.stderr}")
    paths: list[list[str]] = json.loads(done.stdout)
    return paths


def run_kvtune(kvtune: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    # Run from a scratch folder: nothing of the checkout may be found by accident.
    return subprocess.run([str(kvtune), *argv], cwd=kvtune.parent, capture_output=True,
                          text=True, check=False, timeout=300)


def help_problems(kvtune: Path, paths: list[list[str]]) -> list[str]:
    """``kvtune ... --help`` of every command, in parallel (each is a fresh interpreter)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(lambda p: run_kvtune(kvtune, [*p, "--help"]), paths))
    return [f"kvtune {' '.join(p)} --help: exit {d.returncode}: {d.stderr.strip()[-300:]}"
            for p, d in zip(paths, done, strict=True)
            if d.returncode != 0 or "Usage:" not in d.stdout]


# `python -m` entry points of the wheel besides the console script: the calibration Job runs
# kvtune.quality's (operator/calibration/calibration_job.py). kvtune.runtime's reads NVML at once;
# its
# modules are imported above.
MODULE_ENTRY_POINTS = ["kvtune.quality"]


def module_entry_problems(venv: Path) -> list[str]:
    problems = []
    for module in MODULE_ENTRY_POINTS:
        done = subprocess.run([str(venv / "bin" / "python"), "-I", "-m", module, "--help"],
                              cwd=venv, capture_output=True, text=True, check=False)
        if done.returncode != 0 or "usage:" not in done.stdout:
            problems.append(f"python -m {module} --help: exit {done.returncode}: "
                            f"{done.stderr.strip()[-300:]}")
    return problems


def light_install_problems(kvtune: Path) -> list[str]:
    """`kvtune plan` and `kvtune simulate` work in the core install (no vLLM, torch or
    matplotlib; the venv really lacks them), and `--plot` says in one line which extra it needs."""
    problems = []
    for argv in (PLAN_ARGV, SIMULATE_ARGV):
        done = run_kvtune(kvtune, argv)
        if done.returncode != 0 or "vllm serve" not in done.stdout:
            problems.append(f"kvtune {argv[0]}: exit {done.returncode}: {done.stderr[-300:]}")
    plot = run_kvtune(kvtune, [*SIMULATE_ARGV, "--plot", str(kvtune.parent / "unused.png")])
    if plot.returncode != 1 or len(plot.stderr.strip().splitlines()) != 1 \
            or "kvtune[plot]" not in plot.stderr:
        problems.append(f"kvtune simulate --plot without matplotlib: exit {plot.returncode}, "
                        f"not one line naming the plot extra: {plot.stderr[-300:]}")
    absent = _venv_python(kvtune.parent.parent, "import importlib.util as u; print([m for m in "
                          "('vllm', 'torch', 'matplotlib') if u.find_spec(m)])")
    if absent.stdout.strip() != "[]":
        problems.append(f"the core install has optional packages: {absent.stdout.strip()}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--install-only", action="store_true",
                        help="Build and install the wheel; skip the imports, --help and plans.")
    args = parser.parse_args(argv)
    started = time.monotonic()
    _, wheel = build_dists(args.out / "dist")
    missing = missing_from_wheel(wheel)
    if missing:
        return _fail(f"{wheel.name} lacks {len(missing)} file(s) of the package folders: "
                     f"{', '.join(missing[:10])}; check setup.py's discovery")
    kvtune = make_venv(wheel, args.out / "venv")
    built = time.monotonic() - started
    if args.install_only:
        print(f"wheel_check: {wheel.name} installed in {kvtune.parent.parent} ({built:.0f} s)")
        return 0
    paths = command_paths(kvtune.parent.parent)
    venv = kvtune.parent.parent
    problems = (import_problems(venv) + help_problems(kvtune, paths)
                + module_entry_problems(venv) + light_install_problems(kvtune))
    if problems:
        return _fail(f"the installed wheel ({venv}) fails:\n  "
                     + "\n  ".join(problems))
    print(f"wheel_check: {wheel.name} installed in {venv}: every module imports, "
          f"{len(paths)} commands answer --help, plan and simulate run without the extras "
          f"(build+install {built:.0f} s, checks {time.monotonic() - started - built:.0f} s)")
    return 0


def _fail(message: str) -> int:
    print(f"wheel_check: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
