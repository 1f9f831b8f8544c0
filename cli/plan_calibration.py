"""``kvtune plan --calibration FILE``: the operator's model calibration, offline.

The file is the operator's ConfigMap ``kvtune-model-calibration`` as ``kubectl get configmap
-o yaml`` prints it, or the JSON set it holds (``tuner/model_calibration.py``). The request's
key (model, GPU class, vLLM version, layout) picks the entry, so the plan is the one the
operator makes with it (docs/calibration-loop.md).
"""

from __future__ import annotations

from pathlib import Path

import click
import yaml
from pydantic import ValidationError

from kvtune.tuner import model_calibration as mc
from kvtune.tuner.planner.calibration_predict import calibration_key
from kvtune.tuner.planner.planning import PlanRequest


def model_calibration_for(request: PlanRequest, path: Path | None
                          ) -> mc.ModelCalibration | None:
    """The entry of ``path`` for ``request``'s key; None without a file. A file without an
    entry for the key is an error (a plan silently uncalibrated would not reproduce the
    operator's)."""
    if path is None:
        return None
    try:
        found = mc.set_from_document(yaml.safe_load(path.read_text()))
    except (yaml.YAMLError, ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise click.BadParameter(
            f"{path}: not a model calibration ({first}); write one with `kubectl get configmap "
            "kvtune-model-calibration -o yaml`", param_hint="--calibration") from None
    key = calibration_key(request)
    entry = mc.find(found.calibrations, key)
    if entry is None:
        have = ", ".join(c.key.text for c in found.calibrations) or "none"
        raise click.BadParameter(
            f"{path} has no calibration for {key.text} (it has: {have}); plan without "
            "--calibration or pass the model, GPU class, vLLM version and layout of one",
            param_hint="--calibration")
    return entry
