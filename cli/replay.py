"""``kvtune replay``: serve vLLM 0.33.0's metrics from a modelled instance playing a trace."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import click

from kvtune.cli.options import gpu_option, model_option, tp_option
from kvtune.cli.params import NON_NEGATIVE, PORT, POSITIVE, TimedTrace, finite
from kvtune.replay.exporter import ENGINES, Replay, ReplayServer, parse_config_overrides
from kvtune.replay.instance import InstanceConfig
from kvtune.replay.sim import Hardware
from kvtune.tuner.errors import KVTuneError

# The instance steps its model clock in fixed steps (step_seconds) to keep up with the wall
# clock: at 1,000x a 50 ms tick is 1,000 steps; far beyond, the loop never catches up.
MAX_SPEED = 1000.0


@click.command()
@click.option("--trace", "trace_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Azure CSV or Mooncake JSONL trace (examples/traces ships one of each).")
@click.option("--speed", default=1.0, show_default=True, type=finite(1e-3, MAX_SPEED),
              help="Model seconds per wall second.")
@click.option("--port", default=8000, show_default=True, type=PORT,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--model-name", default="replay-model", show_default=True,
              help="The model_name label.")
@click.option("--offset", "offset_seconds", default=0.0, type=NON_NEGATIVE,
              help="Start this many trace seconds into the trace.")
@click.option("--config", "config_pairs", multiple=True, metavar="K=V",
              help="Instance setting, e.g. num_gpu_blocks=60000 block_size=16 "
                   "max_model_len=131072 enable_prefix_caching=true (repeatable).")
@click.option("--shuffle-seed", type=click.IntRange(min=0), default=None,
              help="Permute the requests (arrival times kept): a stationary sample of the trace.")
@click.option("--then", "then", multiple=True, type=TimedTrace(),
              help="Switch to TRACE after SECONDS of wall time (repeatable).")
@click.option("--engine", type=click.Choice(ENGINES), default="simulator", show_default=True,
              help="simulator: kvtune's simulator (the planner's block pool, scheduler and "
                   "step times); simple: a small fixed-step instance model.")
@model_option("catalog_model", help_="Simulator engine: a catalog model; with --gpu, "
              "num_gpu_blocks comes from the planner's KV math unless --config "
              "num_gpu_blocks=N pins it.")
@gpu_option("gpu_name", help_="Simulator engine:")
@tp_option("tensor_parallel")
@click.option("--follow-deployment", default=None, metavar="NAMESPACE/NAME",
              help="Poll this Deployment's vllm container args and restart the instance "
                   "with them when they change (a rollout).")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False),
              help="For --follow-deployment (default: $KUBECONFIG / ~/.kube/config).")
@click.option("--follow-interval", default=2.0, show_default=True, type=POSITIVE,
              help="Seconds between polls of the followed Deployment.")
def replay(trace_path: str, speed: float, port: int, model_name: str, offset_seconds: float,
           config_pairs: tuple[str, ...], shuffle_seed: int | None,
           then: tuple[tuple[float, Path], ...], engine: str, catalog_model: str | None,
           gpu_name: str | None, tensor_parallel: int, follow_deployment: str | None,
           kubeconfig: str | None, follow_interval: float) -> None:
    """Play TRACE through a model of a vLLM instance and serve /metrics with vLLM's exact
    metric names, types, labels and buckets. POST /control/trace {"trace": PATH} switches
    the traffic while running; POST /control/config {"args": [vllm flags]} restarts the
    instance with a new configuration (a rollout)."""
    from kvtune.replay.follow import parse_target

    # Usage errors (exit 2): the options' values, before anything is read or started.
    try:
        overrides = parse_config_overrides(config_pairs)
        config = InstanceConfig(**{"model_name": model_name, **overrides})
        target = parse_target(follow_deployment) if follow_deployment else None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if (catalog_model or gpu_name) and engine != "simulator":
        raise click.UsageError("--model/--gpu need --engine simulator")
    hardware = None
    if catalog_model or gpu_name:
        hardware = Hardware(model=catalog_model or Hardware.model,
                            gpu=gpu_name or Hardware.gpu, tensor_parallel=tensor_parallel)
    # Runtime failures (exit 1): a trace, model or GPU that does not work, a port taken.
    server = _server(config, Path(trace_path), speed, offset_seconds, shuffle_seed, engine,
                     hardware, overrides.get("num_gpu_blocks"), port, then)
    follower = None
    if target is not None:
        try:
            follower = _follower(server, target, kubeconfig, follow_interval)
        except click.ClickException:
            server.httpd.server_close()  # not serving yet: shutdown() would wait forever
            raise
    _serve(server, follower, then, Path(trace_path).name, speed, engine)


def _server(config: InstanceConfig, trace: Path, speed: float, offset_seconds: float,
            shuffle_seed: int | None, engine: str, hardware: Hardware | None,
            pinned_blocks: int | None, port: int,
            then: tuple[tuple[float, Path], ...]) -> ReplayServer:
    from kvtune.tuner.traces import load_trace

    try:
        # Every --then trace is read now: a broken one fails here, not in a timer thread
        # of a server that keeps running.
        for _, path in then:
            load_trace(path)
        return ReplayServer(Replay(config, trace, speed, offset_seconds,
                                   shuffle_seed=shuffle_seed, engine=engine,  # type: ignore[arg-type]
                                   hardware=hardware,
                                   num_gpu_blocks_override=pinned_blocks if hardware else None),
                            port)
    except KVTuneError as exc:  # a bad trace, model or GPU
        raise click.ClickException(str(exc)) from None
    except ValueError as exc:  # vLLM would not start with this configuration
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(
            f"--port={port}: cannot listen on 127.0.0.1:{port} ({exc.strerror}); pass a free "
            "port, or 0 for any") from None


def _follower(server: ReplayServer, target: tuple[str, str], kubeconfig: str | None,
              interval_seconds: float) -> Any:
    from kubernetes.config import ConfigException

    from kvtune.replay.follow import DeploymentFollower

    try:
        return DeploymentFollower(server.replay, target[0], target[1], kubeconfig,
                                  interval_seconds)
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = f"--kubeconfig={kubeconfig!r}" if kubeconfig else "the kubeconfig"
        raise click.ClickException(
            f"--follow-deployment {target[0]}/{target[1]}: cannot load {where} "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); pass a "
            "working --kubeconfig") from None


def _serve(server: ReplayServer, follower: Any, then: tuple[tuple[float, Path], ...],
           trace_name: str, speed: float, engine: str) -> None:
    """Serves until SIGTERM or Ctrl-C. A --then switch that fails later (the file changed
    since it was checked) ends the command with one error line and exit 1."""
    server.start()
    if follower is not None:
        follower.start()
    cfg = server.replay.instance.config
    click.echo(f"kvtune replay: {trace_name} at {speed:g}x, "
               f"metrics on http://{server.target}/metrics ({engine} engine, "
               f"{cfg.num_gpu_blocks} blocks of {cfg.block_size})", err=True)
    stop = threading.Event()
    failures: list[str] = []

    def switch(path: Path) -> None:
        try:
            server.replay.switch_trace(path)
        except (KVTuneError, OSError, ValueError) as exc:
            failures.append(f"--then {path}: {exc}")
            stop.set()

    timers = [threading.Timer(secs, switch, args=(path,)) for secs, path in then]
    for timer in timers:
        timer.daemon = True
        timer.start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for timer in timers:
            timer.cancel()
        if follower is not None:
            follower.stop()
        server.stop()
    if failures:
        raise click.ClickException(failures[0])
