"""Starting and stopping the control plane's processes, so that none is ever left behind.

Every component runs in its own session (process group), with stdout and stderr in its own
log file. Three layers make sure nothing outlives its owner:

* ``Supervisor.stop_all`` (called from ``finally`` blocks): SIGTERM to each group, then SIGKILL
  after a grace period, in reverse start order;
* an ``atexit`` hook that stops every supervisor still holding processes (a test that failed,
  an exception nobody caught);
* for an *owned* cluster (tests, the demo), ``PR_SET_PDEATHSIG``: the kernel kills the
  components when the Python process that started them dies, even by SIGKILL.

A *detached* cluster (``kvtune cluster up``) outlives the command on purpose; its process
records (pid and the kernel's start time, so a reused pid is never killed) are saved in the
state directory, and ``kvtune cluster down`` stops them from another process.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from kvtune.e2e.errors import ClusterError, log_tail

_PR_SET_PDEATHSIG = 1
_LIVE: set[Supervisor] = set()


class ProcessRecord(BaseModel):
    component: str
    pid: int
    start_ticks: int
    log_path: Path
    argv: list[str]


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or
    None when there is no such live process. Zombies count as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_running(record: ProcessRecord) -> bool:
    return _start_ticks(record.pid) == record.start_ticks


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel for SIGKILL when our parent dies.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# util-linux's setpriv sets PR_SET_PDEATHSIG and execs the command (same pid): no Python code
# between fork and exec, which can deadlock when other threads hold locks (the demo's replay
# exporter and Prometheus helpers run threads). The preexec_fn is the fallback without it.
_SETPRIV = shutil.which("setpriv")


def _signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    if not is_running(record):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, sig)


class Supervisor:
    """The processes of one cluster, in start order."""

    def __init__(self, log_dir: Path, die_with_parent: bool) -> None:
        self.log_dir = log_dir
        self.die_with_parent = die_with_parent
        self.records: list[ProcessRecord] = []
        self._popens: dict[int, subprocess.Popen[bytes]] = {}

    @classmethod
    def adopt(cls, log_dir: Path, records: Sequence[ProcessRecord]) -> Supervisor:
        """A supervisor for processes that another Python process started (``cluster down``)."""
        supervisor = cls(log_dir, die_with_parent=False)
        supervisor.records = list(records)
        return supervisor

    def start(
        self, component: str, argv: list[str], env: dict[str, str] | None = None
    ) -> ProcessRecord:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{component}.log"
        executable = Path(argv[0])
        if not (executable.is_file() and os.access(executable, os.X_OK)):
            raise ClusterError(
                component,
                f"executable {executable} is missing or not executable; run "
                "e2e/build-binaries.sh (or scripts/setup.sh) to build it",
                log_path,
            )
        with log_path.open("ab") as log:
            log.write(f"# {time.strftime('%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            log.flush()
            wrapped, preexec = argv, None
            if self.die_with_parent and _SETPRIV is not None:
                wrapped = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]
            elif self.die_with_parent:
                preexec = _die_with_parent
            try:
                popen = subprocess.Popen(
                    wrapped,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **(env or {})},
                    start_new_session=True,
                    preexec_fn=preexec,
                )
            except OSError as error:
                reason = f"could not execute {executable}: {error}"
                raise ClusterError(component, reason, log_path) from error
        ticks = _start_ticks(popen.pid)
        record = ProcessRecord(
            component=component,
            pid=popen.pid,
            start_ticks=ticks if ticks is not None else -1,
            log_path=log_path,
            argv=argv,
        )
        self.records.append(record)
        self._popens[popen.pid] = popen
        _LIVE.add(self)
        return record

    def exit_status(self, record: ProcessRecord) -> int | None:
        """The exit status if the process has ended (None while it runs; -1 when unknown)."""
        popen = self._popens.get(record.pid)
        if popen is not None:
            return popen.poll()
        return None if is_running(record) else -1

    def raise_if_exited(self) -> None:
        """A component that died while others wait on it fails fast, with its own log."""
        for record in self.records:
            status = self.exit_status(record)
            if status is not None:
                raise ClusterError(record.component, _why_exited(record, status), record.log_path)

    def _stop(self, record: ProcessRecord, sig: signal.Signals, grace_seconds: float) -> None:
        """``sig`` to the record's process group, then SIGKILL after ``grace_seconds``; returns
        once it is gone."""
        _signal_group(record, sig)
        deadline = time.monotonic() + grace_seconds
        while self._alive(record) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._alive(record):
            _signal_group(record, signal.SIGKILL)
            while self._alive(record):
                time.sleep(0.02)

    def stop_all(self, grace_seconds: float = 10.0) -> None:
        """Stop the groups one by one, newest first (kwok ... etcd), each with SIGTERM and, if
        it is still there after ``grace_seconds``, SIGKILL. One at a time because an apiserver
        whose etcd is already gone spends many seconds retrying before it exits."""
        for record in reversed(self.records):
            self._stop(record, signal.SIGTERM, grace_seconds)
        self.records.clear()
        self._popens.clear()
        _LIVE.discard(self)

    def restart(self, component: str, sig: signal.Signals = signal.SIGTERM,
                grace_seconds: float = 10.0) -> ProcessRecord:
        """Stop one component (``sig``, then SIGKILL after ``grace_seconds``) and start it
        again with the same command line (the chaos tests restart the API server)."""
        record = next(r for r in self.records if r.component == component)
        self._stop(record, sig, grace_seconds)
        self.records.remove(record)
        self._popens.pop(record.pid, None)
        argv = record.argv
        if _SETPRIV is not None and argv[:1] == [_SETPRIV]:
            argv = argv[argv.index("--") + 1:]
        return self.start(component, argv)

    def _alive(self, record: ProcessRecord) -> bool:
        popen = self._popens.get(record.pid)
        if popen is not None:
            return popen.poll() is None  # poll() also reaps it
        return is_running(record)

    def detach(self) -> None:
        """Let the processes outlive this Python process (``kvtune cluster up``)."""
        self._popens.clear()
        _LIVE.discard(self)


def _why_exited(record: ProcessRecord, status: int) -> str:
    tail = log_tail(record.log_path, 4)
    if status < 0 and status != -1:
        how = f"was killed by signal {-status}"
    elif status == -1:
        how = "is no longer running"
    else:
        how = f"exited with status {status}"
    hint = ""
    in_use = re.search(r"([0-9.]+:[0-9]+): bind: address already in use", tail)
    if in_use is not None:
        hint = (f" ({in_use.group(1)} is already in use by another process; free it, or let "
                "LocalCluster choose free ports)")
    return f"{how} during start-up{hint}: {tail}"


@atexit.register
def _stop_everything() -> None:
    for supervisor in list(_LIVE):
        supervisor.stop_all(grace_seconds=5.0)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose arguments contain ``text`` (a state directory):
    how the tests prove that nothing of a cluster was left running."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state not in ("Z", "X"):
            found.append(f"{proc.name}: {cmdline.strip()}")
    return found
