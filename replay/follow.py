"""``kvtune replay --follow-deployment NS/NAME``: the replayed instance follows a rollout.

The operator renders the plan as ``vllm serve`` flags in the Deployment's pod template
(``operator/render/objects.py``: container ``vllm``, ``args``). The follower polls that Deployment
and, when the container's args differ from the ones it applied last, restarts the replayed
instance with them (``Replay.reconfigure``), as the rollout would restart vLLM. A poll that
fails (API server away, Deployment not created yet) is logged and retried at the next one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kvtune.replay.exporter import Replay, changes_from_vllm_args

log = logging.getLogger("kvtune.replay")

CONTAINER = "vllm"


def vllm_container_args(deployment: Any) -> list[str] | None:
    """The args of the vLLM container (named ``vllm``, else the first) of a Deployment."""
    containers = deployment.spec.template.spec.containers or []
    if not containers:
        return None
    chosen = next((c for c in containers if c.name == CONTAINER), containers[0])
    return list(chosen.args or [])


class DeploymentFollower:
    def __init__(self, replay: Replay, namespace: str, name: str, kubeconfig: str | None,
                 interval_seconds: float = 2.0) -> None:
        self.replay = replay
        self.namespace = namespace
        self.name = name
        self.interval_seconds = interval_seconds
        self._api = client.AppsV1Api(
            config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
        self.applied_args: list[str] | None = None
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> bool:
        """Read the Deployment; apply its args if they changed. True if it restarted."""
        try:
            dep = self._api.read_namespaced_deployment(self.name, self.namespace)
        except ApiException as exc:
            self.last_error = f"read deployment {self.namespace}/{self.name}: {exc.status}"
            log.warning("%s", self.last_error)
            return False
        args = vllm_container_args(dep)
        if args is None or args == self.applied_args:
            return False
        try:
            self.replay.reconfigure(changes_from_vllm_args(args))
        except ValueError as exc:
            # vLLM would not start with it: the replay keeps its configuration (the old
            # ReplicaSet keeps serving while the new pods crash-loop).
            self.last_error = f"{self.namespace}/{self.name}: {exc}"
            log.warning("not applying %s", self.last_error)
            self.applied_args = args
            return False
        self.applied_args = args
        self.last_error = ""
        log.info("replay restarted with %s/%s's args: %s", self.namespace, self.name,
                 " ".join(args))
        return True

    def start(self) -> None:
        def loop() -> None:
            while True:
                self.poll_once()
                if self._stop.wait(self.interval_seconds):
                    return

        self._thread = threading.Thread(target=loop, name="kvtune-replay-follow", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def parse_target(value: str) -> tuple[str, str]:
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name:
        raise ValueError(f"--follow-deployment {value!r}: expected NAMESPACE/NAME")
    return namespace, name
