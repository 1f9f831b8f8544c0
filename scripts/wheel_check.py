"""Build kvtune's sdist and wheel the way a user gets them, and check what is in the wheel.

``python scripts/wheel_check.py [--out build/wheel-check]`` builds the sdist, then the wheel
from that sdist (what ``pip install kvtune`` from an index does), and fails when a file under
a folder of ``[tool.setuptools.package-dir]`` is missing from the wheel. tests/packaging/ uses
the same functions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    _, wheel = build_dists(args.out / "dist")
    missing = missing_from_wheel(wheel)
    if missing:
        print(f"wheel_check: {wheel.name} lacks {len(missing)} file(s) of the package folders: "
              f"{', '.join(missing[:10])}; check setup.py's discovery", file=sys.stderr)
        return 1
    print(f"wheel_check: {wheel.name} holds every file of the package folders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
