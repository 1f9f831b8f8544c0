"""The InferenceDeployment API (``kvtune.io/v1alpha1``): spec and status as pydantic models.

These types are the one source of the CRD: ``crdgen`` turns them into the openAPIV3Schema in
``crds/``. Field names are snake_case here and camelCase in YAML (aliases). Rules the API
server can check itself (cross-field, valid pins) are written twice: as CEL
(``x-kubernetes-validations`` in ``json_schema_extra``, enforced at admission) and as pydantic
validators (so the operator never trusts an object that bypassed the CRD, e.g. an older CRD).
"""

from __future__ import annotations

from kvtune.operator.api.deployment_spec import InferenceDeploymentSpec as InferenceDeploymentSpec
from kvtune.operator.api.deployment_status import (
    InferenceDeploymentStatus as InferenceDeploymentStatus,
)
from kvtune.operator.api.model_spec import IMAGE_PATTERN as IMAGE_PATTERN
from kvtune.operator.api.model_spec import MODEL_NAME_PATTERN as MODEL_NAME_PATTERN
from kvtune.operator.api.model_spec import CalibrationSpec as CalibrationSpec
from kvtune.operator.api.model_spec import ConfigMapRef as ConfigMapRef
from kvtune.operator.api.model_spec import DeclaredTokens as DeclaredTokens
from kvtune.operator.api.model_spec import ModelConfigSource as ModelConfigSource
from kvtune.operator.api.model_spec import ModelSpec as ModelSpec
from kvtune.operator.api.model_spec import PodTemplateRef as PodTemplateRef
from kvtune.operator.api.model_spec import PodTemplateSource as PodTemplateSource
from kvtune.operator.api.model_spec import QualitySpec as QualitySpec
from kvtune.operator.api.model_spec import RuntimeSpec as RuntimeSpec
from kvtune.operator.api.model_spec import SecretName as SecretName
from kvtune.operator.api.model_spec import SLOSpec as SLOSpec
from kvtune.operator.api.model_spec import WorkloadSpec as WorkloadSpec
from kvtune.operator.api.monitoring_spec import MonitoringSpec as MonitoringSpec
from kvtune.operator.api.monitoring_spec import PrometheusRuleSpec as PrometheusRuleSpec
from kvtune.operator.api.monitoring_spec import ScrapeSpec as ScrapeSpec
from kvtune.operator.api.pool_roles import pair_of as pair_of
from kvtune.operator.api.pool_spec import CustomGPUSpec as CustomGPUSpec
from kvtune.operator.api.pool_spec import PoolSpec as PoolSpec
from kvtune.operator.api.pool_spec import Role as Role
from kvtune.operator.api.pool_spec import TensorParallel as TensorParallel
from kvtune.operator.api.pool_spec import Toleration as Toleration
from kvtune.operator.api.pool_status import CanaryAnalysisStatus as CanaryAnalysisStatus
from kvtune.operator.api.pool_status import CanaryStatus as CanaryStatus
from kvtune.operator.api.pool_status import Condition as Condition
from kvtune.operator.api.pool_status import CostStatus as CostStatus
from kvtune.operator.api.pool_status import ExpectedStatus as ExpectedStatus
from kvtune.operator.api.pool_status import LayoutOptionStatus as LayoutOptionStatus
from kvtune.operator.api.pool_status import ObservedSLOStatus as ObservedSLOStatus
from kvtune.operator.api.pool_status import PlanStatus as PlanStatus
from kvtune.operator.api.pool_status import PoolPhase as PoolPhase
from kvtune.operator.api.pool_status import PoolRoutingStatus as PoolRoutingStatus
from kvtune.operator.api.pool_status import PoolStatus as PoolStatus
from kvtune.operator.api.pool_status import RevisionFiguresStatus as RevisionFiguresStatus
from kvtune.operator.api.pool_status import RuntimeStatus as RuntimeStatus
from kvtune.operator.api.pool_status import TokensStatus as TokensStatus
from kvtune.operator.api.pool_status import UtilizationStatus as UtilizationStatus
from kvtune.operator.api.profile_status import CandidateProfileStatus as CandidateProfileStatus
from kvtune.operator.api.profile_status import DeploymentProfileStatus as DeploymentProfileStatus
from kvtune.operator.api.profile_status import KVQualityDtypeStatus as KVQualityDtypeStatus
from kvtune.operator.api.profile_status import KVQualityPhase as KVQualityPhase
from kvtune.operator.api.profile_status import KVQualityStatus as KVQualityStatus
from kvtune.operator.api.profile_status import ObservedStatus as ObservedStatus
from kvtune.operator.api.profile_status import ProfileScope as ProfileScope
from kvtune.operator.api.profile_status import ProfileStatus as ProfileStatus
from kvtune.operator.api.profile_status import QuantileEstimateStatus as QuantileEstimateStatus
from kvtune.operator.api.profile_status import RetunePoolStatus as RetunePoolStatus
from kvtune.operator.api.profile_status import RetuneStateStatus as RetuneStateStatus
from kvtune.operator.api.profile_status import RetuneStatus as RetuneStatus
from kvtune.operator.api.profile_status import SecondsQuantilesStatus as SecondsQuantilesStatus
from kvtune.operator.api.profile_status import TokenQuantilesStatus as TokenQuantilesStatus
from kvtune.operator.api.profile_status import UnverifiedCause as UnverifiedCause
from kvtune.operator.api.reuse_status import KVTierStatus as KVTierStatus
from kvtune.operator.api.reuse_status import ObservedReuseStatus as ObservedReuseStatus
from kvtune.operator.api.reuse_status import ReuseStatus as ReuseStatus
from kvtune.operator.api.reuse_status import TierHitRatesStatus as TierHitRatesStatus
from kvtune.operator.api.reuse_status import TierSizeStatus as TierSizeStatus
from kvtune.operator.api.routing_spec import HEADER_NAME_PATTERN as HEADER_NAME_PATTERN
from kvtune.operator.api.routing_spec import GatewayRef as GatewayRef
from kvtune.operator.api.routing_spec import RoutingSpec as RoutingSpec
from kvtune.operator.api.schema_base import GROUP as GROUP
from kvtune.operator.api.schema_base import KIND as KIND
from kvtune.operator.api.schema_base import KV_DTYPE_BITS as KV_DTYPE_BITS
from kvtune.operator.api.schema_base import OBJECT_NAME_PATTERN as OBJECT_NAME_PATTERN
from kvtune.operator.api.schema_base import OBJECT_NAME_RULE as OBJECT_NAME_RULE
from kvtune.operator.api.schema_base import PLURAL as PLURAL
from kvtune.operator.api.schema_base import SHORT_NAMES as SHORT_NAMES
from kvtune.operator.api.schema_base import SINGULAR as SINGULAR
from kvtune.operator.api.schema_base import VERSION as VERSION
from kvtune.operator.api.schema_base import VLLM_ATTENTION_BACKENDS as VLLM_ATTENTION_BACKENDS
from kvtune.operator.api.schema_base import VLLM_KV_CACHE_DTYPES as VLLM_KV_CACHE_DTYPES
from kvtune.operator.api.schema_base import AttentionBackend as AttentionBackend
from kvtune.operator.api.schema_base import KVCacheDtype as KVCacheDtype
from kvtune.operator.api.schema_base import Mode as Mode
from kvtune.operator.api.schema_base import WeightsDtype as WeightsDtype
from kvtune.operator.api.schema_base import WorkloadPreset as WorkloadPreset
from kvtune.operator.api.schema_base import _Model as _Model
from kvtune.operator.api.schema_base import _Status as _Status
from kvtune.operator.api.tuning_spec import PIN_PATH as PIN_PATH
from kvtune.operator.api.tuning_spec import KVTiersSpec as KVTiersSpec
from kvtune.operator.api.tuning_spec import PinSpec as PinSpec
from kvtune.operator.api.tuning_spec import PoolSelectorKind as PoolSelectorKind
from kvtune.operator.api.tuning_spec import PrometheusSpec as PrometheusSpec
from kvtune.operator.api.tuning_spec import RetuneSpec as RetuneSpec
from kvtune.operator.api.tuning_spec import RolloutSpec as RolloutSpec
from kvtune.operator.api.tuning_spec import TuningSpec as TuningSpec
from kvtune.operator.api.tuning_spec import pin_path as pin_path
