"""LeaderWorkerSet's CRD (sigs.k8s.io/lws), from the Go module proxy, for the local cluster.

The version is the one kvtune renders for (``operator/render/leader_worker_set.py``:
``LWS_VERSION``); ``go mod download`` fetches the module into Go's module cache once and the CRD
is the release's own ``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml``, so
the API server validates the rendered objects against the real schema. The LWS controller,
which makes the groups' pods, is built and run by ``e2e/lws_controller.py``; it also watches
the release's other kind (DisaggregatedSet), whose CRD ``controller_crd_paths`` adds.
"""

from __future__ import annotations

from pathlib import Path

from kvtune.e2e.errors import ClusterError
from kvtune.e2e.inference_extension import module_dir
from kvtune.operator.render.leader_worker_set import LWS_MODULE, LWS_VERSION

CRD_FILE = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
# LWS v0.9.0's controller manager also reconciles DisaggregatedSets; without their CRD its
# watch never syncs and the manager gives up after controller-runtime's cache-sync timeout.
DISAGGREGATED_SET_CRD_FILE = "disaggregatedset.x-k8s.io_disaggregatedsets.yaml"


def crd_path(version: str = LWS_VERSION, name: str = CRD_FILE) -> Path:
    """The release's LeaderWorkerSet CRD manifest (or its CRD file ``name``)."""
    path = module_dir(version, LWS_MODULE) / "config" / "crd" / "bases" / name
    if not path.is_file():
        raise ClusterError("lws", f"{LWS_MODULE}@{version}: no {name} under "
                           f"config/crd/bases")
    return path


def controller_crd_paths(version: str = LWS_VERSION) -> list[Path]:
    """The CRDs the release's controller manager watches: install them before starting it."""
    return [crd_path(version), crd_path(version, DISAGGREGATED_SET_CRD_FILE)]
