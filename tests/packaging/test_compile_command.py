"""`kvtune compile-simulator` on an installed wheel: what it refuses, and how its build stays
tied to the install (listed in the wheel's RECORD, so pip removes it with the sources).

The compile itself (mypyc on an installed wheel, the same results to the last bit) runs in the
operator image's first stage: tests/runtime/test_images_run.py; on the checkout:
tests/simulator/test_sim_mypyc.py."""

from __future__ import annotations

import os
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtune.cli import compile_simulator as command
from kvtune.cli.main import cli

REPO = Path(__file__).resolve().parents[2]


def _refused(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner(env=env).invoke(cli, ["compile-simulator", *args])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_it_refuses_a_checkout_and_a_folder_without_kvtune(tmp_path: Path) -> None:
    line = _refused("--site-packages", str(REPO))
    assert f"--site-packages={REPO}" in line and "no installed kvtune there" in line
    # A folder laid out like kvtune's, without a wheel's dist-info (a staged or edited tree).
    (tmp_path / "kvtune" / "tuner" / "simulator").mkdir(parents=True)
    (tmp_path / "kvtune" / "tuner" / "simulator" / "scheduler.py").write_text("")
    line = _refused("--site-packages", str(tmp_path))
    assert "not a wheel install" in line and "pip install" in line


def test_mypyc_checks_under_the_checkouts_mypy_settings() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        checkout = tomllib.load(f)["tool"]["mypy"]
    as_ini = {key: (",".join(value) if isinstance(value, list) else str(value))
              for key, value in checkout.items() if key != "strict"}
    assert as_ini == command.MYPY_CONFIG


def _fake_site(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    (site / "kvtune" / "tuner" / "simulator").mkdir(parents=True)
    (site / "kvtune" / "tuner" / "simulator" / "scheduler.py").write_text("")
    (site / "kvtune-0.1.0.dist-info").mkdir()
    (site / "kvtune-0.1.0.dist-info" / "RECORD").write_text(
        "kvtune/tuner/simulator/scheduler.py,sha256=x,0\nkvtune-0.1.0.dist-info/RECORD,,\n")
    return site


def test_it_names_what_mypyc_lacks(tmp_path: Path) -> None:
    site = _fake_site(tmp_path)
    line = _refused("--site-packages", str(site), env={"PATH": str(tmp_path), "CC": ""})
    assert "no C compiler on PATH" in line and "apt-get install gcc" in line


def test_remove_deletes_its_own_build_and_nothing_else(tmp_path: Path) -> None:
    site = _fake_site(tmp_path)
    ours = [site / "kvtune" / "tuner" / "simulator" / "scheduler.cpython-311-x86_64-linux-gnu.so",
            site / "abc123__mypyc.cpython-311-x86_64-linux-gnu.so"]
    # Another mypyc-compiled package's shared library (mypy's own wheel has one).
    theirs = site / "81d243bd__mypyc.cpython-311-x86_64-linux-gnu.so"
    for path in (*ours, theirs):
        path.write_bytes(b"\x7fELF")
    command._set_recorded(site, ours)
    assert command.compiled_files(site) == ours
    result = CliRunner().invoke(cli, ["compile-simulator", "--site-packages", str(site),
                                      "--remove"])
    assert result.exit_code == 0, result.output
    assert "removed 2 compiled modules" in result.output
    assert not any(path.exists() for path in ours) and theirs.exists()
    record = (site / "kvtune-0.1.0.dist-info" / "RECORD").read_text()
    assert ".so" not in record and "scheduler.py,sha256=x,0" in record


@pytest.mark.slow
def test_pip_removes_a_build_with_the_wheel(built_dists: tuple[Path, Path],
                                            tmp_path: Path) -> None:
    """A compiled module that outlived its sources would run the old scheduler under a newer
    kvtune: the RECORD lines make pip uninstall (and so upgrade) remove it."""
    _, wheel = built_dists
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Not from the checkout: `python -m` puts the working directory first on sys.path, and the
    # checkout's operator/ would hide the standard library's.
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300, cwd=tmp_path,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip())
    built = [site / "kvtune" / "tuner" / "simulator" / "scheduler.cpython-311-x86_64-linux-gnu.so",
             site / "abc123__mypyc.cpython-311-x86_64-linux-gnu.so"]
    for path in built:
        path.write_bytes(b"\x7fELF")
    command._set_recorded(site, built)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "kvtune"], check=True,
                   timeout=300, cwd=tmp_path)
    assert not any(path.exists() for path in built)
    assert not (site / "kvtune").exists(), sorted(map(str, (site / "kvtune").rglob("*")))
