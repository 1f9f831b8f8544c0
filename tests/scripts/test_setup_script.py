"""scripts/setup.sh installs Debian's prometheus and stops the daemons that install started,
and only those: a node exporter (or Prometheus) that ran before is left running.

The real script runs with stand-ins for the system it would change (apt-get, systemctl) on
PATH; the daemons are real processes whose executable is named like Debian's."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from kvtune.e2e.prometheus import start_lock

REPO = Path(__file__).resolve().parents[2]
SLEEP = shutil.which("sleep") or "/bin/sleep"


def _system_path(tmp: Path) -> Path:
    """A bin folder with the system's tools except prometheus, promtool and lua5.1, so that the
    script finds them missing and installs them."""
    tools = tmp / "system-bin"
    tools.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for entry in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else ():
            if entry.name in ("prometheus", "promtool", "lua5.1", "systemctl", "apt-get"):
                continue
            if not (tools / entry.name).exists():
                (tools / entry.name).symlink_to(entry)
    return tools


def _daemon(folder: Path, name: str) -> Path:
    """An executable named like the daemon (a copy of sleep: its /proc exe is that name)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    shutil.copy(SLEEP, exe)
    return exe


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def _running(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan may wait for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_setup_stops_only_the_daemons_its_install_started(tmp_path: Path) -> None:
    user = _daemon(tmp_path / "user", "prometheus-node-exporter")
    # A node exporter the machine's owner runs: must survive.
    theirs = subprocess.Popen([str(user), "300"])
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    started = tmp_path / "started.pids"
    pkg = _daemon(tmp_path / "pkg", "prometheus-node-exporter")
    pkg_prom = _daemon(tmp_path / "pkg", "prometheus")
    # apt-get install: as Debian's maintainer scripts without systemd, start the daemons.
    (fake / "apt-get").write_text(
        "#!/bin/bash\n"
        '[ "$1" = install ] || exit 0\n'
        f'setsid "{pkg}" 300 </dev/null >/dev/null 2>&1 & echo $! >> "{started}"\n'
        f'setsid "{pkg_prom}" 300 </dev/null >/dev/null 2>&1 & echo $! >> "{started}"\n'
    )
    (fake / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{_system_path(tmp_path)}"}
    try:
        # setup.sh stops every new process named like a daemon: no test process may start
        # a real Prometheus while it runs (kvtune.e2e.prometheus.start_lock).
        with start_lock(exclusive=True):
            result = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "packages"],
                                    env=env, capture_output=True, text=True, timeout=120,
                                    check=False)
        assert result.returncode == 0, result.stderr
        assert "apt-get install" in result.stderr
        ours = [int(p) for p in started.read_text().split()]
        assert len(ours) == 2
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(p) for p in ours):
            time.sleep(0.1)
        assert not any(_running(p) for p in ours), result.stderr
        assert _alive(theirs), "setup.sh stopped a node exporter it did not start"
    finally:
        theirs.kill()
        theirs.wait()
        for pid in (started.read_text().split() if started.exists() else ()):
            subprocess.run(["kill", pid], check=False, capture_output=True)
