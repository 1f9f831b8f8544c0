"""`kvtune demo`: the README's main job, on this machine, with nothing but loopback."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from kvtune.cli.params import finite
from kvtune.e2e.binaries import cache_dir
from kvtune.e2e.cluster import LocalCluster
from kvtune.e2e.demo import DEFAULT_TRACE, EXAMPLE, Demo
from kvtune.e2e.errors import ClusterError


@click.command()
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the demo cluster keeps data, kubeconfig and logs "
              "[default: ~/.cache/kvtune/demo].")
@click.option("--example", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=EXAMPLE, show_default=True, help="The InferenceDeployment to apply.")
@click.option("--keep", is_flag=True,
              help="Keep everything running after the report, until Ctrl-C.")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_TRACE,
              show_default=True,
              help="Request trace replayed as vLLM metrics into Prometheus, for the operator "
              "to profile (Azure CSV or Mooncake JSONL).")
@click.option("--no-traffic", is_flag=True,
              help="Skip Prometheus and the replay: plan on the declared workload only.")
@click.option("--timeout", "timeout_seconds", type=finite(0, 86400, min_open=True),
              default=180.0, show_default=True,
              help="Seconds to wait for each step (Ready, pods Running).")
def demo(state_dir: Path | None, example: Path, keep: bool, trace: Path, no_traffic: bool,
         timeout_seconds: float) -> None:
    """Bring up the local control plane with fake H100/H200/B200 pools, install kvtune's CRDs,
    replay a real trace's vLLM metrics into Prometheus, start the operator, apply an
    InferenceDeployment with H100 and H200 pools, and print what kvtune decided per pool (on the
    declared workload, then on the traffic it observed) and the pods Running on the fake GPU
    nodes. Then tear it all down (or, with --keep, leave it up until Ctrl-C)."""
    cluster = LocalCluster(state_dir or cache_dir() / "demo")
    # SIGTERM (a CI timeout, `kill`) must tear down like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        Demo(cluster, example, echo=click.echo, timeout_seconds=timeout_seconds,
             trace=None if no_traffic else trace).run(keep=keep)
    except ClusterError as error:
        raise click.ClickException(str(error)) from None
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
    finally:
        cluster.down()
        click.echo("demo: every process stopped", err=True)
