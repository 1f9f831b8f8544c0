"""`kvtune cluster up|down|status`: the local control plane for trying kvtune by hand.

`up` leaves the cluster running after the command returns (detached) and records its processes
in the state directory; `down` stops them from there.
"""

from __future__ import annotations

from pathlib import Path

import click

from kvtune.e2e import gpu_nodes
from kvtune.e2e.cluster import LocalCluster, default_state_dir
from kvtune.e2e.errors import ClusterError

_STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the cluster keeps its data, certificates, kubeconfig and logs "
    "[default: ~/.cache/kvtune/cluster].",
)


@click.group()
def cluster() -> None:
    """Start, stop or inspect the local control plane (etcd, kube-apiserver,
    kube-controller-manager, kube-scheduler, kwok with fake GPU nodes), all on 127.0.0.1."""


@cluster.command()
@_STATE_DIR
@click.option(
    "--pools",
    default="H100=4,H200=4,B200=2",
    show_default=True,
    help="Fake GPU node pools, CLASS=NODES[xGPUS_PER_NODE], comma-separated.",
)
def up(state_dir: Path | None, pools: str) -> None:
    """Bring the cluster up and print its KUBECONFIG and node pools."""
    try:
        parsed = gpu_nodes.parse_pools(pools)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--pools") from error
    local = LocalCluster(state_dir or default_state_dir(), parsed, detached=True)
    try:
        local.up()
    except ClusterError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"local cluster up in {local.ready_seconds:.1f}s: {local.server}")
    click.echo(f"export KUBECONFIG={local.kubeconfig_path}")
    _print_pools(local)
    click.echo(f"logs: {local.state_dir / 'logs'}/<component>.log")
    click.echo(f"stop it with: kvtune cluster down --state-dir {local.state_dir}")


@cluster.command()
@_STATE_DIR
def down(state_dir: Path | None) -> None:
    """Stop every process of the cluster recorded in the state directory."""
    local = LocalCluster.from_state_dir(state_dir or default_state_dir())
    before = local.status()
    local.down()
    stopped = [c.component for c in before.components if c.running]
    click.echo(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@cluster.command()
@_STATE_DIR
def status(state_dir: Path | None) -> None:
    """Show whether each component runs, the apiserver is ready, and the nodes per pool.
    Exits 1 when the cluster is not (fully) running."""
    local = LocalCluster.from_state_dir(state_dir or default_state_dir())
    current = local.status()
    if not current.components:
        raise click.ClickException(
            f"--state-dir={str(local.state_dir)!r}: no cluster recorded there; start one with "
            f"`kvtune cluster up --state-dir {local.state_dir}`")
    click.echo(f"server: {current.server}  apiserver ready: {current.apiserver_ready}")
    click.echo(f"export KUBECONFIG={current.kubeconfig}")
    for component in current.components:
        state = "running" if component.running else "STOPPED"
        click.echo(
            f"  {component.component:<24} pid {component.pid:<8} {state:<8} {component.log_path}"
        )
    for pool, ready in current.nodes_ready.items():
        click.echo(f"  pool {pool:<5} nodes ready {ready}")
    if not (current.running and current.apiserver_ready):
        stopped = [c.component for c in current.components if not c.running]
        raise click.ClickException(
            "the cluster is not fully running ("
            + (f"stopped: {', '.join(stopped)}" if stopped else "the apiserver is not ready")
            + "); see the logs above, or restart it with `kvtune cluster down` then `up`")


def _print_pools(local: LocalCluster) -> None:
    ready = local.nodes_ready_by_pool()
    for pool in local.pools:
        gpu = gpu_nodes.GPU_CLASSES[pool.gpu_class]
        names = pool.node_names()
        click.echo(
            f"  pool {pool.gpu_class:<5} {ready.get(pool.gpu_class, '0/0')} nodes Ready "
            f"({names[0]}..{names[-1]}), {pool.gpus_per_node} x nvidia.com/gpu each, "
            f"nvidia.com/gpu.product={gpu.product}"
        )
