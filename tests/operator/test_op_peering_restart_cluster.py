"""Issue 25 item 6: a restart under peering takes as long as a clean start.

A container that dies in its pod (a crash, an OOM kill, a failed liveness probe) is started
again in the same pod. kopf's default identity is new per process, so the new process found
its dead predecessor's record in the KopfPeering, a live peer of its own priority (both
derived from the pod's name), and paused every operator until that record's lifetime ran
out: 20 s measured, where a clean start takes about 5. ``kvtune operator`` now takes the
pod's name as its peering identity, so the record is its own and it resumes at once."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from op_cluster_helpers import PeeringReplica, create_infd, patch_spec, wait_for
from test_op_finalizer_cluster import _applied, _spec
from test_op_finalizer_cluster import peering_ns as peering_ns  # the fixture

from kvtune.cli.operator_cmd import peering_identity
from kvtune.operator.handlers import PEERING_LIFETIME_SECONDS

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# A clean start is about 5 s here; waiting out the dead record would take the lifetime.
RESTART_LIMIT_SECONDS = PEERING_LIFETIME_SECONDS / 2


def _pod(kubeconfig: Path, ns: str, log: Path) -> PeeringReplica:
    """One pod of the chart's Deployment: its name and namespace in the environment, as the
    chart sets them, and no --priority (derived from the name)."""
    return PeeringReplica([str(Path(sys.executable).parent / "kvtune"), "operator",
                           "--kubeconfig", str(kubeconfig), "--namespace", ns, "--peering",
                           "kvtune", "--metrics-port", "0"], log,
                          env={"POD_NAME": "kvtune-7d9f-x2x4q", "POD_NAMESPACE": ns})


def test_the_identity_is_the_pods_name() -> None:
    assert peering_identity({"POD_NAME": "kvtune-0", "POD_NAMESPACE": "ops"}) == "ops/kvtune-0"
    assert peering_identity({"POD_NAME": "kvtune-0"}) == "kvtune-0"
    assert peering_identity({}) is None  # outside a pod: kopf's own, new per process


def test_a_container_killed_in_its_pod_resumes_as_fast_as_a_clean_start(
        local_cluster: Any, peering_ns: tuple[Any, str], tmp_path: Path) -> None:
    api, ns = peering_ns
    kubeconfig = Path(local_cluster.kubeconfig_path)
    first = _pod(kubeconfig, ns, tmp_path / "first.log")
    second = None
    try:
        wait_for(first.active, "the pod's operator to become active", 90, first.log)
        create_infd(api, ns, "chat", _spec(1))
        wait_for(lambda: _applied(api, ns, "chat", 1), "chat applied", 120, first.log)
        first.proc.send_signal(signal.SIGKILL)  # no goodbye: its record stays in the peering
        first.proc.wait()
        started = time.monotonic()
        second = _pod(kubeconfig, ns, tmp_path / "second.log")
        wait_for(second.active, "the restarted operator to resume", 60, second.log)
        took = time.monotonic() - started
        assert "Possibly conflicting" not in second.text(), second.text()[-3000:]
        assert took < RESTART_LIMIT_SECONDS, (
            f"the restart took {took:.1f}s:\n{second.text()[-3000:]}")
        patch_spec(api, ns, "chat", {"pools": _spec(2)["pools"]})
        wait_for(lambda: _applied(api, ns, "chat", 2), "the restarted operator to reconcile",
                 120, second.log)
    finally:
        first.stop()
        if second is not None:
            second.stop()
