"""`kvtune operator`: run the kvtune operator (kopf) in this process."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

import click

from kvtune.cli.params import PORT, finite
from kvtune.cli.search_budget_options import search_budget_options
from kvtune.operator.render import render_fairness

if TYPE_CHECKING:  # kopf is imported only when the operator runs
    from kopf._core.engines.peering import Identity

# Handler modules other parts of kvtune add; each is registered when it is installed.
OPTIONAL_HANDLER_MODULES = ("kvtune.operator.retune.retune_handlers",)


def load_handlers() -> list[str]:
    """Import the operator's handler modules (registering them with kopf); returns the names."""
    loaded = ["kvtune.operator.handlers"]
    importlib.import_module(loaded[0])
    for name in OPTIONAL_HANDLER_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
            loaded.append(name)
    return loaded


def render_limits(in_flight: int, cpu_seconds: float, window_seconds: float,
                  spread_seconds: float) -> render_fairness.Limits:
    """The template render budget per namespace from the ``--template-*`` options."""
    return render_fairness.Limits(in_flight=in_flight, cpu_seconds=cpu_seconds,
                                  window_seconds=window_seconds, spread_seconds=spread_seconds)


@click.command()
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Kubeconfig file (default: in-cluster service account, else ~/.kube/config).")
@click.option("--namespace", "-n", "namespaces", multiple=True,
              help="Namespace(s) to serve (repeatable; default: all namespaces).")
@click.option("--metrics-port", type=PORT, default=8080, show_default=True,
              help="Port of the operator's /metrics (0: off).")
@click.option("--metrics-address", default="127.0.0.1", show_default=True,
              help="Address /metrics binds (0.0.0.0 in a pod).")
@click.option("--standalone", is_flag=True,
              help="Run without peering (one operator instance, no KopfPeering objects).")
@click.option("--peering", "peering_name", default=None,
              help="Peering object name, so only one of several replicas handles objects.")
@click.option("--liveness", "liveness_endpoint", default=None,
              help="Liveness endpoint URL, e.g. http://0.0.0.0:8081/healthz.")
@click.option("--priority", type=int, default=None,
              help="Peering priority (highest is active). Default with --peering: derived from "
              "$POD_NAME (or host and pid), so replicas differ; equal priorities pause all.")
@click.option("--pod-security", type=click.Choice(["baseline", "restricted"]),
              default="baseline", show_default=True,
              help="Pod Security Standard every rendered vLLM pod must meet (the chart's "
              "podPolicy.level), besides kvtune's own pod rules (operator/render/pod_policy.py).")
@click.option("--allowed-service-account", "service_accounts", multiple=True,
              help="A ServiceAccount a tenant's pod template may name, besides default and "
              "kvtune-runtime (repeatable; the chart's podPolicy.allowedServiceAccounts).")
@click.option("--allowed-secret", "secrets", multiple=True,
              help="A Secret a tenant's pod template may reference (volume, env, envFrom, "
              "imagePullSecrets; repeatable; the chart's podPolicy.allowedSecrets). Without "
              "it, none.")
@click.option("--allowed-image", "images", multiple=True,
              help="An image (exact, or a glob like registry.example.com/vllm/*) a tenant's pod "
              "may run besides kvtune's runtime images (repeatable; the chart's "
              "podPolicy.allowedImages). Without it: the spec's runtime.image.")
@click.option("--tenant-secrets-admission", "secrets_admission", is_flag=True,
              help="The chart's tenant-secrets admission policy is installed: the API server "
              "checks that whoever writes a spec may read each Secret in spec.runtime.secrets, "
              "so the operator may mount them. Without it, no tenant Secret is mounted.")
@click.option("--gpu-price", "gpu_prices", multiple=True, metavar="CLASS=USD",
              help="Price of one GPU of a class per hour for the cost figures in status "
              "(repeatable; the chart's gpuPrices). A pool's gpuPriceUsdPerHour overrides it; "
              "without either, kvtune's list prices (tuner/facts/data/gpu_prices.json).")
@click.option("--host-memory-price", type=finite(0, 1e3, min_open=True), metavar="USD",
              default=None, help="USD per GiB-hour of host memory, for the CPU KV tier's cost "
              "in status (the chart's hostMemoryPriceUsdPerGiBHour; as `kvtune plan "
              "--host-memory-price`). Without it the tier is not priced.")
@click.option("--template-renders-in-flight", type=click.IntRange(1, 64),
              default=render_fairness.IN_FLIGHT_PER_TENANT, show_default=True,
              help="Renders of one namespace's pod templates that may run at once (the "
              "chart's templates.rendersInFlightPerNamespace); beyond it a render is deferred.")
@click.option("--template-cpu-seconds", type=finite(0, 3600, min_open=True),
              default=render_fairness.CPU_SECONDS_PER_WINDOW, show_default=True,
              help="Renderer CPU seconds one namespace's templates may use per window (the "
              "chart's templates.cpuSecondsPerWindow).")
@click.option("--template-cpu-window-seconds", type=finite(1, 86400),
              default=render_fairness.WINDOW_SECONDS, show_default=True,
              help="The sliding window of --template-cpu-seconds (templates.cpuWindowSeconds).")
@click.option("--template-retry-spread-seconds", type=finite(0, 600),
              default=render_fairness.SPREAD_SECONDS, show_default=True,
              help="Seconds between one namespace's deferred renders' retries "
              "(templates.retrySpreadSeconds).")
@search_budget_options
@click.option("--verbose", "-v", is_flag=True)
def operator(kubeconfig: str | None, namespaces: tuple[str, ...], metrics_port: int,
             metrics_address: str, standalone: bool, peering_name: str | None,
             liveness_endpoint: str | None, priority: int | None, pod_security: str,
             service_accounts: tuple[str, ...], secrets: tuple[str, ...],
             images: tuple[str, ...], secrets_admission: bool,
             gpu_prices: tuple[str, ...], host_memory_price: float | None,
             template_renders_in_flight: int, template_cpu_seconds: float,
             template_cpu_window_seconds: float, template_retry_spread_seconds: float,
             search_cpu_seconds: float, search_memory_mib: int, verbose: bool) -> None:
    """Run the kvtune operator until interrupted."""
    import kopf

    from kvtune.operator import handlers
    from kvtune.operator.monitoring import metrics
    from kvtune.operator.render import pod_policy, template_sandbox, tenant_reach
    from kvtune.operator.search import gpu_prices as prices
    from kvtune.operator.search import reuse_summary, search_budget, search_jobs
    from kvtune.tuner.errors import KVTuneError
    from kvtune.tuner.facts.prices import parse_overrides

    try:
        prices.CONFIG.overrides = parse_overrides(gpu_prices, "--gpu-price")
    except KVTuneError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu-price") from None
    reuse_summary.CONFIG.usd_per_gib_hour = host_memory_price
    # The operator's settings are taken before anything connects.
    template_sandbox.BUDGET.configure(render_limits(
        template_renders_in_flight, template_cpu_seconds, template_cpu_window_seconds,
        template_retry_spread_seconds))

    # Every capacity search's budget (the chart's search values).
    search_budget.CONFIG.cpu_seconds = search_cpu_seconds
    search_budget.CONFIG.memory_bytes = search_memory_mib * 2**20
    # Where searches run (search.mode, search.job: the environment): refused before start.
    try:
        jobs = search_jobs.settings()
    except search_jobs.SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    if jobs.mode != "inProcess" and not jobs.image:
        raise click.ClickException(f"search.mode={jobs.mode} needs the search Job's image: set "
                                   f"{search_jobs.ENV_IMAGE} (the chart sets the operator's)")
    if standalone and peering_name:
        raise click.UsageError("--standalone and --peering exclude each other; pick one")
    # Fail fast on a broken kubeconfig or an API server that does not answer: kopf would
    # retry silently forever.
    from kvtune.cli.kube_access import ClusterUnreachable, api_client, check_api_server

    try:
        version = check_api_server(api_client(kubeconfig), kubeconfig)
    except ClusterUnreachable as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"kvtune operator: API server {version}", err=True)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers.CONFIG.kubeconfig = kubeconfig
    handlers.CONFIG.namespaces = namespaces
    pod_policy.CONFIG.level = "restricted" if pod_security == "restricted" else "baseline"
    pod_policy.CONFIG.service_accounts = service_accounts
    pod_policy.CONFIG.secrets = secrets
    tenant_reach.CONFIG.images = images
    tenant_reach.CONFIG.secrets_checked_at_admission = secrets_admission
    loaded = load_handlers()
    click.echo(f"kvtune operator: handlers {', '.join(loaded)}; namespaces "
               f"{', '.join(namespaces) or 'all'}; metrics on {metrics_address}:{metrics_port}",
               err=True)
    metrics.serve(metrics_port, metrics_address)
    if peering_name and priority is None:
        # kopf pauses every operator that sees a live peer of the same priority, so the
        # replicas of one Deployment (issue 6's chart runs two) must each get their own.
        who = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        priority = int(hashlib.sha256(who.encode()).hexdigest()[:6], 16)
    kopf.run(
        identity=peering_identity(os.environ) if peering_name else None,
        priority=priority,
        standalone=standalone or not peering_name,
        peering_name=peering_name,
        namespaces=list(namespaces),
        clusterwide=not namespaces,
        liveness_endpoint=liveness_endpoint,
    )


def peering_identity(env: Mapping[str, str]) -> Identity | None:
    """The pod's own name as its peering identity, so a container that restarts in its pod
    (a crash, an OOM kill, a failed liveness probe) takes its record back at once. kopf's own
    identity is new per process (user@host/start time/random): the restarted process then
    sees its dead predecessor as a live peer of its own priority and pauses until that
    record's lifetime runs out (20 s measured, where a clean start takes 5). Outside a pod:
    kopf's default. A pod name is unique in its namespace while the pod lives, and the chart's
    two replicas are two pods."""
    pod, namespace = env.get("POD_NAME"), env.get("POD_NAMESPACE")
    if not pod:
        return None
    return cast("Identity", f"{namespace}/{pod}" if namespace else pod)
