"""The replay exporter's edge: a thread that advances the modelled instance in step with the
wall clock (``speed`` model seconds per wall second) and an HTTP server on 127.0.0.1 with

- ``GET /metrics``: vLLM 0.33.0's metrics (names, kinds, labels, buckets from
  ``kvtune.operator.prometheus.vllm_metrics``), Prometheus text format;
- ``GET /health``: 200;
- ``GET /control/state``: JSON with the trace playing, model time, queue and cache figures;
- ``POST /control/trace``: JSON ``{"trace": PATH, "speed": N?, "offset_seconds": S?,
  "shuffle_seed": K?}`` switches
  the traffic to another trace from now on (requests in flight finish), so a test can shift
  the workload under a running Prometheus;
- ``POST /control/config``: JSON ``{"args": ["--block-size=32", ...]}`` (``vllm serve``
  flags, as the operator renders them) or ``{"block_size": 32, "kv_cache_dtype": "fp8",
  ...}``: restarts the instance with the new configuration, as a rollout does (see
  ``Replay.reconfigure``).

Two engines: ``simulator`` (``replay_sim.py``: kvtune's simulator, the planner's block pool,
scheduler and step times) and ``simple`` (``replay_instance.py``: a small fixed-step model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.replay.instance import Instance, InstanceConfig, TraceSchedule
from kvtune.replay.sim import Hardware, SimInstance, engine_for
from kvtune.tuner.knobs import BY_NAME, FLAG_TO_NAME, KNOBS, TENSOR_PARALLEL_FLAG
from kvtune.tuner.traces import Trace, load_trace


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
                    elif spec.name in m.by_source:
                        for source, tokens in m.by_source[spec.name].items():
                            c.add_metric([*labels, source], tokens)
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


Engine = Literal["simulator", "simple"]
ENGINES: tuple[Engine, ...] = ("simulator", "simple")


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
    engine: str = "simple"
    restarts: int = 0
    dropped_on_restart: int = 0
    num_gpu_blocks: int = 0
    block_size: int = 0
    # Model seconds the replay is behind the wall clock x speed (0: keeping up).
    lag_model_seconds: float = 0.0


# The most wall time one background tick spends catching up before it gives the lock up
# for the loop's sleep (a scrape or a control request waits at most about this long).
_TICK_WALL_BUDGET_SECONDS = 0.25
# The pause between chunks of a budgeted tick, long enough for the OS to run a waiter.
_HANDOFF_SECONDS = 0.001


class Replay:
    """The instance, the schedule, and the clock that maps wall time to model time."""

    def __init__(self, config: InstanceConfig, trace_path: Path, speed: float,
                 offset_seconds: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 shuffle_seed: int | None = None, engine: Engine = "simple",
                 hardware: Hardware | None = None,
                 num_gpu_blocks_override: int | None = None) -> None:
        if speed <= 0:
            raise ValueError(f"--speed={speed}: must be > 0 (model seconds per wall second)")
        if engine not in ENGINES:
            raise ValueError(f"--engine={engine!r}: one of {', '.join(ENGINES)}")
        self.lock = threading.Lock()
        self.engine: Engine = engine
        # Simulator engine: without a model, the configured num_gpu_blocks and Llama-3.1-8B's
        # step times on an H100; with one, num_gpu_blocks from the planner's KV math.
        self.hardware = hardware or Hardware(size_kv_cache=False)
        self.num_gpu_blocks_override = num_gpu_blocks_override
        self.restarts = 0
        self.dropped_on_restart = 0
        self.instance: Instance | SimInstance = self._make_instance(config, 0.0)
        self._clock = clock
        self._wall0 = clock()
        self._model0 = 0.0
        self._lag = 0.0
        self.speed = speed
        self.schedule = self._schedule(load_trace(trace_path), offset_seconds,
                                       start_seconds=0.0, shuffle_seed=shuffle_seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _make_instance(self, config: InstanceConfig, start_seconds: float
                       ) -> Instance | SimInstance:
        if self.engine == "simple":
            inst = Instance(config)
            inst.now_seconds = start_seconds
            return inst
        sized, engine, cost = engine_for(config, self.hardware, self.num_gpu_blocks_override)
        return SimInstance(sized, engine, cost, start_seconds=start_seconds)

    def reconfigure(self, changes: dict[str, Any]) -> None:
        """Restart the instance with ``changes`` (InstanceConfig fields; ``num_gpu_blocks``
        pins the KV-cache size like ``--num-gpu-blocks-override``), as a rollout does: a new
        vLLM process, so counters and histograms start from zero and the prefix cache is
        cold. Requests in flight are dropped from the replay, not re-queued: vLLM finishes
        them on the old pod during its termination grace period (the rendered pod template
        gives 120 s) and that pod's series end with it; the new pod serves what arrives
        after the restart. Raises ValueError (nothing changes) for a configuration vLLM
        would not start with."""
        with self.lock:
            fields = dict(changes)
            override = self.num_gpu_blocks_override
            if "num_gpu_blocks" in fields:
                override = int(fields["num_gpu_blocks"])
            elif (("gpu_memory_utilization" in fields or "kv_cache_memory_bytes" in fields)
                  and self.hardware.size_kv_cache):
                override = None  # sized from memory again
            hardware = self.hardware
            if "tensor_parallel" in fields:
                hardware = dataclasses.replace(hardware,
                                               tensor_parallel=int(fields.pop("tensor_parallel")))
            try:
                config = dataclasses.replace(self.instance.config, **fields)
            except TypeError as exc:
                raise ValueError(str(exc)) from exc
            now = self.instance.now_seconds
            previous = self.num_gpu_blocks_override, self.hardware
            self.num_gpu_blocks_override, self.hardware = override, hardware
            try:
                fresh = self._make_instance(config, now)
            except ValueError:
                self.num_gpu_blocks_override, self.hardware = previous
                raise
            self.dropped_on_restart += len(self.instance.running) + len(self.instance.waiting)
            self.instance = fresh
            self.restarts += 1

    @staticmethod
    def _schedule(trace: Trace, offset_seconds: float, start_seconds: float,
                  shuffle_seed: int | None = None) -> TraceSchedule:
        return TraceSchedule(list(trace.requests), start_seconds, offset_seconds,
                             name=trace.name, shuffle_seed=shuffle_seed)

    def model_now(self) -> float:
        return self._model0 + (self._clock() - self._wall0) * self.speed

    def tick(self, chunk_model_seconds: float = 1.0,
             wall_budget_seconds: float | None = None) -> None:
        """Advance the instance to the clock's model time, or for at most
        ``wall_budget_seconds`` of wall time when given (the rest on the next call)."""
        # Advance in short chunks so a scrape never waits behind a long catch-up. Python's
        # locks are not fair: a thread that releases one and takes it again at once keeps it
        # from a waiter, so a lagging replay catching up in one call would hold off a scrape
        # or a control request for the whole catch-up. The background loop passes a budget
        # and pauses between chunks and between calls, which lets them in.
        target = self.model_now()
        deadline = None if wall_budget_seconds is None else time.monotonic() + wall_budget_seconds
        while True:
            with self.lock:
                t = min(target, self.instance.now_seconds + chunk_model_seconds)
                self.instance.advance_to(t, self.schedule.due(t))
                if t >= target or (deadline is not None and time.monotonic() >= deadline):
                    self._lag = max(0.0, self.model_now() - self.instance.now_seconds)
                    return
            if deadline is not None:
                time.sleep(_HANDOFF_SECONDS)  # a waiter woken by the release takes the lock

    def switch_trace(self, path: Path, speed: float | None = None,
                     offset_seconds: float = 0.0, shuffle_seed: int | None = None) -> None:
        if speed is not None and speed <= 0:
            raise ValueError(f"speed={speed}: must be > 0")
        # Read the trace before taking the lock: the replay keeps serving while it loads.
        trace = load_trace(path)
        with self.lock:
            now_model = self.model_now()
            if speed is not None:
                self._model0, self._wall0, self.speed = now_model, self._clock(), speed
            self.schedule = self._schedule(trace, offset_seconds, start_seconds=now_model,
                                           shuffle_seed=shuffle_seed)

    def state(self) -> ReplayState:
        with self.lock:
            inst = self.instance
            return ReplayState(
                trace=self.schedule.name, speed=self.speed, model_seconds=inst.now_seconds,
                running=len(inst.running), waiting=len(inst.waiting),
                kv_cache_usage=inst.usage(), finished=sum(inst.metrics.finished.values()),
                rejected_too_long=inst.rejected_too_long, engine=self.engine,
                restarts=self.restarts, dropped_on_restart=self.dropped_on_restart,
                num_gpu_blocks=inst.config.num_gpu_blocks, block_size=inst.config.block_size,
                lag_model_seconds=self._lag,
            )

    def start(self, tick_seconds: float = 0.05) -> None:
        def loop() -> None:
            while not self._stop.wait(tick_seconds):
                self.tick(wall_budget_seconds=_TICK_WALL_BUDGET_SECONDS)

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
            if self.path not in ("/control/trace", "/control/config"):
                self._send(404, b"not found\n", "text/plain")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/control/config":
                    replay.reconfigure(config_changes(body))
                else:
                    seed = body.get("shuffle_seed")
                    replay.switch_trace(Path(body["trace"]), body.get("speed"),
                                        float(body.get("offset_seconds", 0.0)),
                                        None if seed is None else int(seed))
            except (KeyError, ValueError, OSError, TypeError, AttributeError) as exc:
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
        elif isinstance(current, int | float):
            kind = type(current)
            try:
                value = kind(raw)
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise ValueError(f"--config {key}={raw!r}: expected {what}") from None
        else:
            value = raw
        out[key] = value
    return out


# InstanceConfig's names for the knobs (``kvtune.tuner.knobs``) where they differ.
_INSTANCE_NAMES = {"kv_cache_dtype": "cache_dtype"}
# vLLM serve flags -> InstanceConfig fields: the knobs the replay models (from the knob
# table), vLLM's older spelling, the block-count override, and TP.
_FLAGS: dict[str, str] = {
    **{k.flag: _INSTANCE_NAMES.get(k.name, k.name) for k in KNOBS
       if _INSTANCE_NAMES.get(k.name, k.name) in InstanceConfig.__dataclass_fields__},
    "cache-dtype": "cache_dtype",
    "num-gpu-blocks-override": "num_gpu_blocks",
    "num-gpu-blocks": "num_gpu_blocks",
    # Not an InstanceConfig field: the simulator engine's step costs and KV per GPU.
    TENSOR_PARALLEL_FLAG: "tensor_parallel",
}


def changes_from_vllm_args(args: list[str]) -> dict[str, Any]:
    """The configuration in ``vllm serve`` arguments (``--flag=value`` or ``--flag value``,
    ``--[no-]enable-prefix-caching``); other flags (model, host, port, TP, ...) are not the
    replay's concern and are skipped."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--"):
            continue
        flag, eq, value = arg[2:].partition("=")
        knob = BY_NAME.get(FLAG_TO_NAME.get(flag, ""))
        if knob is not None and knob.type is bool:  # --[no-]enable-prefix-caching
            if knob.flag in _FLAGS:
                out[_FLAGS[knob.flag]] = not flag.startswith("no-")
            continue
        field_name = _FLAGS.get(flag)
        if field_name is None:
            continue
        if not eq:
            if i >= len(args):
                raise ValueError(f"--{flag}: needs a value")
            value = args[i]
            i += 1
        out[field_name] = value
    if "gpu_memory_utilization" in out and "kv_cache_memory_bytes" not in out:
        out["kv_cache_memory_bytes"] = 0  # the rendered flags carry one or the other
    return _typed(out)


def config_changes(body: dict[str, Any]) -> dict[str, Any]:
    """``POST /control/config``'s body: ``{"args": [...]}`` (vLLM flags) or field names
    (``block_size``, ``kv_cache_dtype``, ``max_model_len``, ``max_num_seqs``,
    ``max_num_batched_tokens``, ``enable_prefix_caching``, ``num_gpu_blocks``,
    ``gpu_memory_utilization``, ``kv_cache_memory_bytes``, ``tensor_parallel_size``; dashes
    allowed)."""
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    if "args" in body:
        args = body["args"]
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError("args: expected a list of strings")
        return changes_from_vllm_args(args)
    out: dict[str, Any] = {}
    for key, value in body.items():
        name = _FLAGS.get(key.replace("_", "-"))
        if name is None:
            raise ValueError(f"{key!r}: not a setting; expected one of "
                             f"{', '.join(sorted(set(_FLAGS.values())))}")
        out[name] = value
    return _typed(out)


def _typed(raw: dict[str, Any]) -> dict[str, Any]:
    defaults = InstanceConfig()
    out: dict[str, Any] = {}
    for key, value in raw.items():
        current = 1 if key == "tensor_parallel" else getattr(defaults, key)
        if isinstance(value, str) and isinstance(current, bool):
            out[key] = value.lower() in ("true", "1")
        elif isinstance(current, bool):
            out[key] = bool(value)
        elif isinstance(current, int):
            out[key] = int(value)
        elif isinstance(current, float):
            out[key] = float(value)
        else:
            out[key] = str(value)
    return out
