"""`kvtune demo`: the README's main job, on this machine, with nothing but loopback."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click
from kvtune.e2e.binaries import cache_dir
from kvtune.e2e.cluster import LocalCluster
from kvtune.e2e.demo import EXAMPLE, Demo
from kvtune.e2e.errors import ClusterError


@click.command()
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the demo cluster keeps data, kubeconfig and logs "
              "[default: ~/.cache/kvtune/demo].")
@click.option("--example", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=EXAMPLE, show_default=True, help="The InferenceDeployment to apply.")
@click.option("--keep", is_flag=True,
              help="Keep everything running after the report, until Ctrl-C.")
@click.option("--timeout", "timeout_seconds", type=float, default=180.0, show_default=True,
              help="Seconds to wait for each step (Ready, pods Running).")
def demo(state_dir: Path | None, example: Path, keep: bool, timeout_seconds: float) -> None:
    """Bring up the local control plane with fake H100/H200/B200 pools, install kvtune's CRDs,
    start the operator, apply an InferenceDeployment with H100 and H200 pools, and print what
    kvtune decided per pool and the pods Running on the fake GPU nodes. Then tear it all down
    (or, with --keep, leave it up until Ctrl-C)."""
    cluster = LocalCluster(state_dir or cache_dir() / "demo")
    # SIGTERM (a CI timeout, `kill`) must tear down like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        Demo(cluster, example, echo=click.echo, timeout_seconds=timeout_seconds).run()
        if keep:
            click.echo(f"\nRunning. export KUBECONFIG={cluster.kubeconfig_path}  "
                       "(Ctrl-C to stop everything)")
            threading.Event().wait()
    except ClusterError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
    finally:
        cluster.down()
        click.echo("demo: every process stopped", err=True)
