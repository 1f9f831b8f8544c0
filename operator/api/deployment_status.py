"""The InferenceDeploymentStatus: conditions, the profile, the KV-quality evidence, the
pools.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from kvtune.operator.api.pool_status import Condition, PoolStatus
from kvtune.operator.api.profile_status import DeploymentProfileStatus, KVQualityStatus
from kvtune.operator.api.schema_base import _Status


class InferenceDeploymentStatus(_Status):
    observed_generation: int | None = None
    mode: str | None = None
    conditions: list[Condition] = []
    profile: DeploymentProfileStatus | None = None
    kv_quality: KVQualityStatus | None = None
    pools: list[PoolStatus] = []
    pool_summary: str | None = None  # "H200x2,H100x1", for the printer column
