"""LeaderWorkerSet's CRD (sigs.k8s.io/lws), from the Go module proxy, for the local cluster.

The version is the one kvtune renders for (``operator/render/leader_worker_set.py``:
``LWS_VERSION``); ``go mod download`` fetches the module into Go's module cache once and the CRD
is the release's own ``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml``, so
the API server validates the rendered objects against the real schema. The LWS controller
(which makes the groups' pods) is not built: kvtune's tests check what it is given.
"""

from __future__ import annotations

from pathlib import Path

from kvtune.e2e.errors import ClusterError
from kvtune.e2e.inference_extension import module_dir
from kvtune.operator.render.leader_worker_set import LWS_MODULE, LWS_VERSION

CRD_FILE = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def crd_path(version: str = LWS_VERSION) -> Path:
    """The release's LeaderWorkerSet CRD manifest."""
    path = module_dir(version, LWS_MODULE) / "config" / "crd" / "bases" / CRD_FILE
    if not path.is_file():
        raise ClusterError("lws", f"{LWS_MODULE}@{version}: no {CRD_FILE} under "
                           f"config/crd/bases")
    return path
