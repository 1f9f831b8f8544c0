"""`kvtune cluster up|status|down`: a detached cluster outlives `up`, refuses a second `up`
on the same state dir, and `down` (another process) stops every component."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvtune.e2e.processes import processes_mentioning

pytestmark = pytest.mark.cluster
KVTUNE = str(Path(sys.executable).parent / "kvtune")


def kvtune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KVTUNE, *args], capture_output=True, text=True, timeout=600, check=False
    )


def test_cluster_up_status_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        up = kvtune("cluster", "up", "--state-dir", str(state), "--pools", "H100=2,B200=1x4")
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in up.stdout
        assert "pool H100  2/2 nodes Ready" in up.stdout
        assert "pool B200  1/1 nodes Ready" in up.stdout
        assert "4 x nvidia.com/gpu each" in up.stdout
        server = yaml.safe_load((state / "kubeconfig").read_text())["clusters"][0]["cluster"]
        assert server["server"].startswith("https://127.0.0.1:")

        # The processes outlived the `up` command.
        assert len(processes_mentioning(str(state))) == 5

        status = kvtune("cluster", "status", "--state-dir", str(state))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "apiserver ready: True" in status.stdout
        assert status.stdout.count(" running ") == 5
        assert "pool H100  nodes ready 2/2" in status.stdout

        again = kvtune("cluster", "up", "--state-dir", str(state))
        assert again.returncode == 1
        assert "already running" in again.stderr and "cluster down" in again.stderr
        assert len(processes_mentioning(str(state))) == 5  # the refusal stopped nothing
    finally:
        down = kvtune("cluster", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert "stopped: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok" in (
        down.stdout
    )
    assert processes_mentioning(str(state)) == []
    after = kvtune("cluster", "status", "--state-dir", str(state))
    assert after.returncode == 1 and "no cluster recorded" in after.stderr


def test_bad_pool_spec_is_a_usage_error(tmp_path: Path) -> None:
    result = kvtune("cluster", "up", "--state-dir", str(tmp_path), "--pools", "A100=2")
    assert result.returncode == 2
    assert "A100=2" in result.stderr and "H100=4x8" in result.stderr
    assert processes_mentioning(str(tmp_path)) == []
