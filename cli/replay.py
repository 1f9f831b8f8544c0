"""``kvtune replay``: serve vLLM 0.33.0's metrics from a modelled instance playing a trace."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from kvtune.cli.options import gpu_option, model_option, tp_option
from kvtune.replay.exporter import ENGINES, Replay, ReplayServer, parse_config_overrides
from kvtune.replay.instance import InstanceConfig
from kvtune.replay.sim import Hardware
from kvtune.tuner.errors import KVTuneError


@click.command()
@click.option("--trace", "trace_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Azure CSV or Mooncake JSONL trace (examples/traces ships one of each).")
@click.option("--speed", default=1.0, show_default=True, type=float,
              help="Model seconds per wall second.")
@click.option("--port", default=8000, show_default=True, type=int,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--model-name", default="replay-model", show_default=True,
              help="The model_name label.")
@click.option("--offset", "offset_seconds", default=0.0, type=float,
              help="Start this many trace seconds into the trace.")
@click.option("--config", "config_pairs", multiple=True, metavar="K=V",
              help="Instance setting, e.g. num_gpu_blocks=60000 block_size=16 "
                   "max_model_len=131072 enable_prefix_caching=true (repeatable).")
@click.option("--shuffle-seed", type=int, default=None,
              help="Permute the requests (arrival times kept): a stationary sample of the trace.")
@click.option("--then", "then", multiple=True, metavar="TRACE@SECONDS",
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
@click.option("--follow-interval", default=2.0, show_default=True, type=float,
              help="Seconds between polls of the followed Deployment.")
def replay(trace_path: str, speed: float, port: int, model_name: str, offset_seconds: float,
           config_pairs: tuple[str, ...], shuffle_seed: int | None,
           then: tuple[str, ...], engine: str, catalog_model: str | None,
           gpu_name: str | None, tensor_parallel: int, follow_deployment: str | None,
           kubeconfig: str | None, follow_interval: float) -> None:
    """Play TRACE through a model of a vLLM instance and serve /metrics with vLLM's exact
    metric names, types, labels and buckets. POST /control/trace {"trace": PATH} switches
    the traffic while running; POST /control/config {"args": [vllm flags]} restarts the
    instance with a new configuration (a rollout)."""
    from kvtune.replay.follow import DeploymentFollower, parse_target

    follower: DeploymentFollower | None = None
    try:
        overrides = parse_config_overrides(config_pairs)
        pinned = overrides.get("num_gpu_blocks")
        hardware = None
        if catalog_model or gpu_name:
            if engine != "simulator":
                raise ValueError("--model/--gpu need --engine simulator")
            hardware = Hardware(model=catalog_model or Hardware.model,
                                gpu=gpu_name or Hardware.gpu,
                                tensor_parallel=tensor_parallel)
        config = InstanceConfig(**{"model_name": model_name, **overrides})
        schedule: list[tuple[float, Path]] = []
        for item in then:
            path, sep, secs = item.rpartition("@")
            if not sep or not path:
                raise ValueError(f"--then {item!r}: expected TRACE@SECONDS")
            schedule.append((float(secs), Path(path)))
        server = ReplayServer(Replay(config, Path(trace_path), speed, offset_seconds,
                                     shuffle_seed=shuffle_seed, engine=engine,  # type: ignore[arg-type]
                                     hardware=hardware,
                                     num_gpu_blocks_override=pinned if hardware else None),
                              port)
        if follow_deployment:
            namespace, name = parse_target(follow_deployment)
            follower = DeploymentFollower(server.replay, namespace, name, kubeconfig,
                                          follow_interval)
    except KVTuneError as exc:  # a bad trace, model or GPU: bad input, exit 1
        raise click.ClickException(str(exc)) from exc
    except (ValueError, OSError, LookupError) as exc:
        raise click.UsageError(str(exc)) from exc
    server.start()
    if follower is not None:
        follower.start()
    cfg = server.replay.instance.config
    click.echo(f"kvtune replay: {Path(trace_path).name} at {speed:g}x, "
               f"metrics on http://{server.target}/metrics ({engine} engine, "
               f"{cfg.num_gpu_blocks} blocks of {cfg.block_size})", err=True)
    stop = threading.Event()
    timers = [threading.Timer(secs, server.replay.switch_trace, args=(path,))
              for secs, path in schedule]
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
