"""Reaching the API server from a command, or saying in one line why not: no kubeconfig and
not in a pod, a kubeconfig that does not parse, a server that does not answer or refuses the
credentials. Used before any work (``kvtune plan --from-cluster``, ``kvtune operator``), so a
broken kubeconfig fails fast instead of retrying silently."""

from __future__ import annotations

import re
import time
from typing import Any


class ClusterUnreachable(Exception):
    """The message names the kubeconfig, what went wrong and the fix."""


def _reason(exc: BaseException) -> str:
    """The root of urllib3's nested errors: "[Errno 111] Connection refused", a TLS error."""
    inner: object = getattr(exc, "reason", None) or exc
    text = str(inner)
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if errno:
        return errno.group(0).strip()
    return (text.splitlines()[0][:160] if text else type(inner).__name__)


def _where(kubeconfig: str | None) -> str:
    return f"--kubeconfig={kubeconfig!r}" if kubeconfig else (
        "the kubeconfig ($KUBECONFIG or ~/.kube/config, else the pod's service account)")


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A kubernetes ApiClient from the kubeconfig (else in-cluster); ClusterUnreachable when
    neither loads."""
    import yaml
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        try:
            config.load_kube_config(config_file=kubeconfig, context=context,  # type: ignore[no-untyped-call]
                                    client_configuration=cfg)
        except config.ConfigException:
            if kubeconfig:
                raise
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except (config.ConfigException, yaml.YAMLError, OSError, TypeError, ValueError,
            AttributeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterUnreachable(
            f"{_where(kubeconfig)}: cannot load it ({reason}); pass a working kubeconfig "
            "(kubectl --kubeconfig FILE version must answer) or run inside the cluster") from exc
    return client.ApiClient(cfg)


def check_api_server(api: Any, kubeconfig: str | None = None, wait_seconds: float = 10.0,
                     request_timeout_seconds: float = 5.0) -> str:
    """The server's version once it answers; ClusterUnreachable after ``wait_seconds``."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    host = api.configuration.host
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            info = client.VersionApi(api).get_code(_request_timeout=request_timeout_seconds)
            return str(info.git_version)
        except ApiException as exc:
            if exc.status in (401, 403):
                raise ClusterUnreachable(
                    f"{_where(kubeconfig)}: the API server at {host} refused the credentials "
                    f"({exc.status} {exc.reason}); refresh them") from exc
            problem = f"{exc.status} {exc.reason}"
        except Exception as exc:  # urllib3's connection, TLS and timeout errors
            problem = _reason(exc)
        if time.monotonic() >= deadline:
            raise ClusterUnreachable(
                f"{_where(kubeconfig)}: the API server at {host} did not answer within "
                f"{wait_seconds:g} s ({problem}); check the address and that it is running")
        time.sleep(1.0)
