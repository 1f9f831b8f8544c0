"""The operator from the built wheel, installed in a clean virtualenv (no editable link to the
checkout), against the real local control plane: what the operator image runs. The hand list
of packages once left kvtune.operator.rollout out of the wheel, and only this catches it."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from op_cluster_helpers import (
    OperatorProcess,
    condition,
    create_infd,
    get_infd,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC

from kvtune.e2e.operator_command import ENV_VAR

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
NS = "pkg-wheel-operator"


@pytest.fixture(scope="module")
def wheel_kvtune(built_dists: tuple[Path, Path], wheel_check: ModuleType,
                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make test` installed the wheel already (KVTUNE_OPERATOR_BIN); else install it here."""
    given = os.environ.get(ENV_VAR)
    if given:
        return Path(given)
    kvtune: Path = wheel_check.make_venv(built_dists[1], tmp_path_factory.mktemp("wheel") / "venv")
    return kvtune


def test_the_installed_wheel_runs_the_operator(
    local_cluster: Any, wheel_kvtune: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's modules come from the venv's site-packages, not from this checkout.
    where = subprocess.run(
        [str(wheel_kvtune.parent / "python"), "-I", "-c",
         "import kvtune.operator.rollout as m, kvtune.cli.operator_cmd as c; "
         "print(m.__file__); print(c.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    venv = wheel_kvtune.parent.parent.resolve()
    assert all(Path(p).resolve().is_relative_to(venv / "lib") for p in where), where
    assert not any(Path(p).resolve().is_relative_to(REPO / part) for p in where
                   for part in ("operator", "cli")), where

    api = prepare_namespaces(local_cluster, NS)
    monkeypatch.setenv(ENV_VAR, str(wheel_kvtune))
    proc = OperatorProcess(Path(local_cluster.kubeconfig_path), [NS], tmp_path / "operator.log")
    proc.start()
    try:
        create_infd(api, NS, "support-bot", copy.deepcopy(SAMPLE_SPEC))

        def ready() -> dict[str, Any] | None:
            obj = get_infd(api, NS, "support-bot")
            cond = condition(obj, "Ready")
            return obj if cond is not None and cond["status"] == "True" else None

        obj = wait_for(ready, "the wheel's operator to make support-bot Ready", 120, proc.log)
        assert obj["status"]["poolSummary"] == "H200x2,H100x1"
        assert "kvtune operator: handlers" in proc.log_text()
    finally:
        proc.stop()
