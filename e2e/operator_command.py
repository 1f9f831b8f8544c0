"""Which ``kvtune`` runs the operator in the demo and the tests.

``make test`` and ``make demo`` install the built wheel into a clean virtualenv
(scripts/wheel_check.py, ``build/wheel-check/venv``) and name its ``kvtune`` in
``KVTUNE_OPERATOR_BIN``, so the operator that meets the local control plane is the installed
artifact (what the operator image runs), not the editable checkout: a module the wheel lacks
fails there. Without the variable (one test file run by hand) it is this interpreter's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_VAR = "KVTUNE_OPERATOR_BIN"


def operator_executable() -> Path:
    """The ``kvtune`` executable to run ``kvtune operator`` with."""
    given = os.environ.get(ENV_VAR)
    if not given:
        return Path(sys.executable).parent / "kvtune"
    path = Path(given)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(
            f"{ENV_VAR}={given!r}: no executable there; run scripts/wheel_check.py (make test "
            f"does) or unset {ENV_VAR} to use {Path(sys.executable).parent / 'kvtune'}")
    return path
