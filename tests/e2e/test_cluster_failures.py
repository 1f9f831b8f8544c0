"""Failures of the local control plane: each error names the component, says why and gives
the log file's path, and no process of the cluster is left running afterwards."""

from __future__ import annotations

import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvtune.e2e import binaries
from kvtune.e2e import cluster as cluster_module
from kvtune.e2e.cluster import LocalCluster
from kvtune.e2e.errors import ClusterError
from kvtune.e2e.gpu_nodes import NodePool
from kvtune.e2e.processes import processes_mentioning


def _assert_nothing_left(state_dir: Path) -> None:
    assert processes_mentioning(str(state_dir)) == []
    assert not (state_dir / "cluster.json").exists()


@pytest.mark.cluster
def test_port_in_use_names_etcd_and_its_log(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy_port = squatter.getsockname()[1]
        cluster = LocalCluster(tmp_path / "c", ports={"etcd-client": busy_port})
        with pytest.raises(ClusterError) as caught:
            cluster.up()
    error = caught.value
    assert error.component == "etcd"
    assert "already in use" in str(error)
    assert str(busy_port) in str(error)  # etcd's own log line, quoted
    assert error.log_path == tmp_path / "c" / "logs" / "etcd.log"
    assert str(error.log_path) in str(error) and error.log_path.is_file()
    _assert_nothing_left(tmp_path / "c")


@pytest.mark.cluster
def test_a_port_taken_after_it_was_chosen_is_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race free_ports() cannot close: another process binds a port between our probe and
    # the component's bind. Simulated by handing etcd a port that is already taken, once.
    real_free_ports = cluster_module.free_ports
    calls: list[int] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy_port = squatter.getsockname()[1]

        def racy_free_ports(count: int) -> list[int]:
            ports = real_free_ports(count)
            calls.append(count)
            return [busy_port, *ports[1:]] if len(calls) == 1 else ports

        monkeypatch.setattr(cluster_module, "free_ports", racy_free_ports)
        cluster = LocalCluster(tmp_path / "c", pools=(NodePool("H100", 1),))
        try:
            cluster.up()
            assert len(calls) == 2
            assert cluster.ports["etcd-client"] != busy_port
            assert cluster.nodes_ready_by_pool() == {"H100": "1/1"}
            # The first attempt's failure stays in the log.
            assert "address already in use" in cluster.log_path("etcd").read_text()
        finally:
            cluster.down()
    _assert_nothing_left(tmp_path / "c")


@pytest.mark.cluster
def test_a_component_that_fails_to_start_stops_the_others(tmp_path: Path) -> None:
    # A stand-in scheduler that fails as a real binary would (bad flag, missing file, ...):
    # by then etcd, the apiserver and the controller-manager are up and must be stopped.
    broken = tmp_path / "kube-scheduler"
    broken.write_text("#!/bin/sh\necho 'E1130 cannot load scheduler config: boom' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    cluster = LocalCluster(tmp_path / "c", executables={"kube-scheduler": broken})
    with pytest.raises(ClusterError) as caught:
        cluster.up()
    error = caught.value
    assert error.component == "kube-scheduler"
    assert "exited with status 3 during start-up" in str(error)
    assert "cannot load scheduler config: boom" in str(error)
    assert error.log_path == tmp_path / "c" / "logs" / "kube-scheduler.log"
    assert str(error.log_path) in str(error)
    # The others had really started (their logs exist) and were all stopped.
    for started in ("etcd", "kube-apiserver", "kube-controller-manager"):
        assert (tmp_path / "c" / "logs" / f"{started}.log").stat().st_size > 0
    _assert_nothing_left(tmp_path / "c")


def test_missing_executable_is_named_with_the_fix(tmp_path: Path) -> None:
    executables = {
        name: tmp_path / "not-built" / name
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
    }
    cluster = LocalCluster(tmp_path / "c", executables=executables)
    with pytest.raises(ClusterError) as caught:
        cluster.up()
    assert caught.value.component == "etcd"
    assert "missing or not executable" in str(caught.value)
    assert "build-binaries.sh" in str(caught.value)
    _assert_nothing_left(tmp_path / "c")


def test_failing_build_names_the_component_and_its_build_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real `go build` that fails: the pinned etcd version does not exist and the module
    # proxy is switched off, so Go gives up at once instead of compiling for minutes.
    gomod = tmp_path / "gomod"
    (gomod / "etcd").mkdir(parents=True)
    (gomod / "etcd" / "go.mod").write_text(
        "module kvtune.invalid/e2e/etcd\n\ngo 1.26.0\n\n"
        "require go.etcd.io/etcd/server/v3 v3.6.999\n"
    )
    monkeypatch.setenv("KVTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVTUNE_GOMOD_DIR", str(gomod))
    monkeypatch.setenv("GOPROXY", "off")
    cluster = LocalCluster(tmp_path / "c")
    with pytest.raises(ClusterError) as caught:
        cluster.up()
    error = caught.value
    assert error.component == "build of etcd v3.6.999"
    log = tmp_path / "cache" / "logs" / "build-etcd-v3.6.999.log"
    assert error.log_path == log and str(log) in str(error)
    assert "module lookup disabled by GOPROXY=off" in log.read_text()
    assert "exited with status 1" in str(error)
    # Nothing half-built is cached as if it were complete.
    etcd = binaries.COMPONENTS["etcd"]
    assert not binaries.is_built(etcd, gomod)
    assert not (tmp_path / "cache" / "bin" / "etcd-v3.6.999").exists()
    _assert_nothing_left(tmp_path / "c")


def test_components_die_with_a_killed_owner(tmp_path: Path) -> None:
    # `finally` and atexit do not run when the owner is SIGKILLed (a CI timeout): the kernel's
    # parent-death signal must still stop what it started.
    sleeper = tmp_path / "sleeper"  # a path that names the test's directory in `ps`
    shutil.copy("/bin/sleep", sleeper)
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from kvtune.e2e.processes import Supervisor\n"
        f"s = Supervisor(Path({str(tmp_path)!r}), die_with_parent=True)\n"
        f"r = s.start('sleeper', [{str(sleeper)!r}, '300'])\n"
        "print(r.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    pid = int(owner.stdout.readline())
    deadline = time.monotonic() + 30
    # Wait until the component has exec'd (its command line names the state dir).
    while not any(line.startswith(f"{pid}:") for line in processes_mentioning(str(tmp_path))):
        assert time.monotonic() < deadline, "the component never started"
        time.sleep(0.02)
    owner.kill()
    owner.wait()
    while processes_mentioning(str(tmp_path)):
        assert time.monotonic() < deadline, processes_mentioning(str(tmp_path))
        time.sleep(0.02)
