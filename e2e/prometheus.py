"""A real Prometheus server for tests and the demo: Debian's ``prometheus`` binary on a free
loopback port, a 1 s scrape interval, its TSDB in a temporary directory.

``running_prometheus(targets)`` starts it, waits for ``/-/ready`` and stops the whole process
group afterwards, also when the body raises. Targets can be changed while it runs
(``PrometheusServer.set_targets``) through a file_sd file, so a test can start its exporter
after Prometheus.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# scripts/setup.sh stops the Prometheus daemons its own apt-get install started: those that
# appeared while it ran. Its test (tests/scripts/test_setup_script.py) holds this lock
# exclusively while setup.sh runs, and each start here holds it shared, so a Prometheus another
# test process (pytest -n) starts meanwhile waits a second instead of being taken for one.
START_LOCK = Path(tempfile.gettempdir()) / "kvtune-prometheus-start.lock"


@contextlib.contextmanager
def start_lock(*, exclusive: bool = False) -> Iterator[None]:
    with START_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


class PrometheusNotAvailable(RuntimeError):
    """The prometheus binary is missing or did not become ready."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render_config(
    *,
    scrape_interval_seconds: float,
    targets_file: Path,
    rule_files: Sequence[Path] = (),
    job: str = "vllm",
) -> dict[str, Any]:
    """The prometheus.yml: one job reading its targets from a file_sd file (re-read on change)."""
    interval = f"{int(scrape_interval_seconds * 1000)}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
            }
        ],
    }


@dataclass
class PrometheusServer:
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes]
    targets_file: Path
    log_path: Path
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_targets(self, targets: Sequence[str], labels: dict[str, str] | None = None) -> None:
        """Replace the scraped targets (``host:port``); Prometheus re-reads the file within ~1 s."""
        self.set_target_groups([(targets, labels or self.extra_labels)])

    def set_target_groups(
        self, groups: Sequence[tuple[Sequence[str], dict[str, str]]]
    ) -> None:
        """Several target groups, each with its own target labels (as Kubernetes service
        discovery gives each pod its ``namespace`` and ``pod``)."""
        entry = [{"targets": list(targets), "labels": dict(labels)} for targets, labels in groups]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry), encoding="utf-8")
        tmp.replace(self.targets_file)  # atomic: Prometheus never reads half a file

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query through the HTTP API (raw JSON result list)."""
        qs = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{qs}", timeout=5) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(self, promql: str, timeout_seconds: float = 60.0,
                 min_value: float | None = None) -> list[dict[str, Any]]:
        """Poll until ``promql`` has a result (and, if given, a value >= ``min_value``)."""
        deadline = time.monotonic() + timeout_seconds
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, RuntimeError):
                last = self.query(promql)
                if last and (min_value is None
                             or any(float(r["value"][1]) >= min_value for r in last)):
                    return last
            time.sleep(0.25)
        raise TimeoutError(
            f"Prometheus at {self.url}: {promql!r} gave {last!r} after {timeout_seconds:.0f}s "
            f"(wanted a result{'' if min_value is None else f' >= {min_value}'}); "
            f"log: {self.log_path}"
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def _wait_ready(server: PrometheusServer, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise PrometheusNotAvailable(
                f"prometheus exited with {server.process.returncode}: "
                f"{server.log_path.read_text(errors='replace')[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise PrometheusNotAvailable(
        f"prometheus on {server.url} not ready after {timeout_seconds:.0f}s; log: {server.log_path}"
    )


def start_prometheus(
    targets: Sequence[str] = (),
    *,
    scrape_interval_seconds: float = 1.0,
    rule_files: Sequence[Path] = (),
    labels: dict[str, str] | None = None,
    binary: str = "prometheus",
    ready_timeout_seconds: float = 60.0,
) -> PrometheusServer:
    exe = shutil.which(binary)
    if exe is None:
        raise PrometheusNotAvailable(
            f"{binary!r} not on PATH; install Debian's prometheus package (scripts/setup.sh)"
        )
    data_dir = Path(tempfile.mkdtemp(prefix="kvtune-prom-"))
    targets_file = data_dir / "targets.json"
    config_path = data_dir / "prometheus.yml"
    config_path.write_text(
        yaml.safe_dump(render_config(scrape_interval_seconds=scrape_interval_seconds,
                                     targets_file=targets_file, rule_files=rule_files)),
        encoding="utf-8",
    )
    last_error: Exception | None = None
    for _ in range(3):  # a free port can be taken between choosing and binding it
        port = free_port()
        log_path = data_dir / f"prometheus-{port}.log"
        with log_path.open("wb") as log, start_lock():
            proc = subprocess.Popen(
                [exe, f"--config.file={config_path}",
                 f"--storage.tsdb.path={data_dir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}",
                 "--web.enable-lifecycle",
                 "--storage.tsdb.retention.time=1d"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        server = PrometheusServer(port, data_dir, proc, targets_file, log_path,
                                  dict(labels or {}))
        server.set_targets(targets)
        try:
            _wait_ready(server, ready_timeout_seconds)
            return server
        except PrometheusNotAvailable as exc:
            server.stop()
            last_error = exc
    raise PrometheusNotAvailable(f"prometheus did not start: {last_error}")


@contextlib.contextmanager
def running_prometheus(
    targets: Sequence[str] = (), **kwargs: Any
) -> Iterator[PrometheusServer]:
    server = start_prometheus(targets, **kwargs)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)
