"""The replay exporter's edge: a thread that advances the modelled instance in step with the
wall clock (``speed`` model seconds per wall second) and an HTTP server on 127.0.0.1 with

- ``GET /metrics``: vLLM 0.33.0's metrics (names, kinds, labels, buckets from
  ``kvtune.operator.vllm_metrics``), Prometheus text format;
- ``GET /health``: 200;
- ``GET /control/state``: JSON with the trace playing, model time, queue and cache figures;
- ``POST /control/trace``: JSON ``{"trace": PATH, "speed": N?, "offset_seconds": S?,
  "shuffle_seed": K?}`` switches
  the traffic to another trace from now on (requests in flight finish), so a test can shift
  the workload under a running Prometheus.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kvtune.e2e.replay_instance import Instance, InstanceConfig, TraceSchedule
from kvtune.operator import vllm_metrics as vm
from kvtune.tuner.traces import load_trace
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector


class _InstanceCollector(Collector):
    def __init__(self, replay: Replay) -> None:
        self._replay = replay

    def collect(self) -> Iterator[Metric]:
        with self._replay.lock:
            inst = self._replay.instance
            m = inst.metrics
            labels = [inst.config.model_name, "0"]
            for spec in vm.METRICS:
                if spec.kind == "gauge":
                    g = GaugeMetricFamily(spec.name, spec.documentation, labels=spec.labels)
                    g.add_metric(labels, m.gauges[spec.name])
                    yield g
                elif spec.kind == "counter":
                    c = CounterMetricFamily(spec.name, spec.documentation, labels=spec.labels)
                    if spec.name == vm.REQUEST_SUCCESS:
                        for reason, n in m.finished.items():
                            c.add_metric([*labels, reason], n)
                    else:
                        c.add_metric(labels, m.counters[spec.name])
                    yield c
                else:
                    h = m.histograms[spec.name]
                    hf = HistogramMetricFamily(spec.name, spec.documentation,
                                               labels=spec.labels)
                    hf.add_metric(labels, h.cumulative(), h.total)
                    yield hf
            info_labels = inst.cache_config_labels()
            info = GaugeMetricFamily(vm.CACHE_CONFIG_INFO,
                                     "Information of the LLMEngine CacheConfig",
                                     labels=list(info_labels))
            info.add_metric(list(info_labels.values()), 1.0)
            yield info


@dataclass
class ReplayState:
    trace: str
    speed: float
    model_seconds: float
    running: int
    waiting: int
    kv_cache_usage: float
    finished: int
    rejected_too_long: int


class Replay:
    """The instance, the schedule, and the clock that maps wall time to model time."""

    def __init__(self, config: InstanceConfig, trace_path: Path, speed: float,
                 offset_seconds: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 shuffle_seed: int | None = None) -> None:
        if speed <= 0:
            raise ValueError(f"--speed={speed}: must be > 0 (model seconds per wall second)")
        self.lock = threading.Lock()
        self.instance = Instance(config)
        self._clock = clock
        self._wall0 = clock()
        self._model0 = 0.0
        self.speed = speed
        self.schedule = self._schedule(trace_path, offset_seconds, start_seconds=0.0,
                                       shuffle_seed=shuffle_seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _schedule(path: Path, offset_seconds: float, start_seconds: float,
                  shuffle_seed: int | None = None) -> TraceSchedule:
        trace = load_trace(path)
        return TraceSchedule(list(trace.requests), start_seconds, offset_seconds,
                             name=trace.name, shuffle_seed=shuffle_seed)

    def model_now(self) -> float:
        return self._model0 + (self._clock() - self._wall0) * self.speed

    def tick(self, chunk_model_seconds: float = 1.0) -> None:
        # Advance in short chunks so a scrape never waits behind a long catch-up.
        target = self.model_now()
        while True:
            with self.lock:
                t = min(target, self.instance.now_seconds + chunk_model_seconds)
                self.instance.advance_to(t, self.schedule.due(t))
                if t >= target:
                    return

    def switch_trace(self, path: Path, speed: float | None = None,
                     offset_seconds: float = 0.0, shuffle_seed: int | None = None) -> None:
        with self.lock:
            now_model = self.model_now()
            if speed is not None:
                if speed <= 0:
                    raise ValueError(f"speed={speed}: must be > 0")
                self._model0, self._wall0, self.speed = now_model, self._clock(), speed
            self.schedule = self._schedule(path, offset_seconds, start_seconds=now_model,
                                           shuffle_seed=shuffle_seed)

    def state(self) -> ReplayState:
        with self.lock:
            inst = self.instance
            return ReplayState(
                trace=self.schedule.name, speed=self.speed, model_seconds=inst.now_seconds,
                running=len(inst.running), waiting=len(inst.waiting),
                kv_cache_usage=inst.usage(), finished=sum(inst.metrics.finished.values()),
                rejected_too_long=inst.rejected_too_long,
            )

    def start(self, tick_seconds: float = 0.05) -> None:
        def loop() -> None:
            while not self._stop.wait(tick_seconds):
                self.tick()

        self._thread = threading.Thread(target=loop, name="kvtune-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _handler(replay: Replay, registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # scrapes every second
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # The scraper may have given up (scrape timeout); the next scrape gets fresh data.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, generate_latest(registry),
                           "text/plain; version=0.0.4; charset=utf-8")
            elif self.path == "/health":
                self._send(200, b"", "text/plain")
            elif self.path == "/control/state":
                self._send(200, json.dumps(replay.state().__dict__).encode(),
                           "application/json")
            else:
                self._send(404, b"not found\n", "text/plain")

        def do_POST(self) -> None:
            if self.path != "/control/trace":
                self._send(404, b"not found\n", "text/plain")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                seed = body.get("shuffle_seed")
                replay.switch_trace(Path(body["trace"]), body.get("speed"),
                                    float(body.get("offset_seconds", 0.0)),
                                    None if seed is None else int(seed))
            except (KeyError, ValueError, OSError, TypeError) as exc:
                self._send(400, f"{exc}\n".encode(), "text/plain")
                return
            self._send(200, json.dumps(replay.state().__dict__).encode(), "application/json")

    return Handler


class ReplayServer:
    """The replay plus its HTTP server; ``start()`` returns once it is listening."""

    def __init__(self, replay: Replay, port: int = 0, host: str = "127.0.0.1") -> None:
        self.replay = replay
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_InstanceCollector(replay))
        self.httpd = ThreadingHTTPServer((host, port), _handler(replay, self.registry))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.replay.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="kvtune-replay-http",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.replay.stop()


def parse_config_overrides(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``K=V`` pairs for InstanceConfig, typed from the dataclass defaults."""
    defaults = InstanceConfig()
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not hasattr(defaults, key):
            fields = ", ".join(sorted(InstanceConfig.__dataclass_fields__))
            raise ValueError(f"--config {pair!r}: expected K=V with K one of: {fields}")
        current = getattr(defaults, key)
        value: Any
        if isinstance(current, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--config {key}={raw!r}: expected true or false")
            value = raw.lower() in ("true", "1")
        elif isinstance(current, int):
            value = int(raw)
        elif isinstance(current, float):
            value = float(raw)
        else:
            value = raw
        out[key] = value
    return out
