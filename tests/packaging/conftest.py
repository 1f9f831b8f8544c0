"""The built sdist and wheel, once per session: the ones `make test` built just before pytest
(scripts/wheel_check.py, passed in KVTUNE_WHEEL_DIR), else built here into a temporary folder
(one for all workers under pytest -n)."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_wheel_check() -> ModuleType:
    path = REPO / "scripts" / "wheel_check.py"
    spec = importlib.util.spec_from_file_location("wheel_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wheel_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def wheel_check() -> ModuleType:
    return load_wheel_check()


@pytest.fixture(scope="session")
def built_dists(
    wheel_check: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """(sdist, wheel) of this checkout."""
    given = os.environ.get("KVTUNE_WHEEL_DIR")
    if given:
        dist = Path(given)
        (sdist,) = dist.glob("kvtune-*.tar.gz")
        (wheel,) = dist.glob("kvtune-*.whl")
        return sdist, wheel
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        sdist, wheel = wheel_check.build_dists(tmp_path_factory.mktemp("wheel") / "dist")
        return sdist, wheel
    # Under pytest -n, one build for all workers, in their common temporary folder: two
    # builds at once would both write the checkout's kvtune.egg-info.
    shared = tmp_path_factory.getbasetemp().parent / "packaging-dists"
    with (shared.parent / "packaging-dists.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / ".complete").exists():
            wheel_check.build_dists(shared)
            (shared / ".complete").touch()
    (sdist,) = shared.glob("kvtune-*.tar.gz")
    (wheel,) = shared.glob("kvtune-*.whl")
    return sdist, wheel
