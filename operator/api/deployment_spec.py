"""The InferenceDeployment's spec, with its cross-field rules.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from kvtune.operator.api.model_spec import (
    ModelSpec,
    QualitySpec,
    RuntimeSpec,
    SLOSpec,
    WorkloadSpec,
)
from kvtune.operator.api.monitoring_spec import MonitoringSpec
from kvtune.operator.api.pool_roles import ROLE_RULES, check_pairs
from kvtune.operator.api.pool_spec import _POOL_KEY, PoolSpec
from kvtune.operator.api.routing_spec import RoutingSpec
from kvtune.operator.api.schema_base import KV_DTYPE_BITS, Mode, _Model, _rules
from kvtune.operator.api.tuning_spec import RolloutSpec, TuningSpec
from kvtune.tuner.planner.kv_dtype_options import PRECISION_FLOOR_BITS


def _pin_floor_rule() -> tuple[str, str]:
    """CEL: a pinned KV dtype must not be narrower than quality.lowestKVPrecision."""
    clauses = []
    for floor, floor_bits in PRECISION_FLOOR_BITS.items():
        narrower = [d for d, bits in KV_DTYPE_BITS.items() if bits < floor_bits]
        if narrower:
            listed = ", ".join(f"'{d}'" for d in narrower)
            clauses.append(f"!(self.quality.lowestKVPrecision == '{floor}' && "
                           f"self.tuning.pin.kvCacheDtype in [{listed}])")
    guard = ("!has(self.quality) || !has(self.quality.lowestKVPrecision) || "
             "!has(self.tuning) || !has(self.tuning.pin) || !has(self.tuning.pin.kvCacheDtype)")
    return (f"{guard} || ({' && '.join(clauses)})",
            "tuning.pin.kvCacheDtype is narrower than quality.lowestKVPrecision; "
            "pin a wider dtype or lower the floor")


class InferenceDeploymentSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("!has(self.rollout) || self.pools.all(p, p.replicas >= self.rollout.canaryReplicas)",
             "every pool's replicas must be >= rollout.canaryReplicas; raise the replicas or "
             "lower canaryReplicas"),
            (f"self.pools.all(p, self.pools.exists_one(q, {_POOL_KEY.format(v='q')} == "
             f"{_POOL_KEY.format(v='p')}))",
             "pool names must be unique; give pools of the same gpuClass distinct names"),
            _pin_floor_rule(),
            ("!has(self.tuning) || !has(self.tuning.pin) || !has(self.tuning.pin.maxModelLen) "
             "|| !has(self.workload) || !has(self.workload.contextTokens) || "
             "!has(self.workload.contextTokens.max) || "
             "self.tuning.pin.maxModelLen >= self.workload.contextTokens.max",
             "tuning.pin.maxModelLen is below workload.contextTokens.max: vLLM would refuse "
             "the longest requests the spec promises; raise the pin or lower the max"),
            *ROLE_RULES,
        )
    )

    model: ModelSpec
    runtime: RuntimeSpec = RuntimeSpec()
    workload: WorkloadSpec = WorkloadSpec()
    slo: SLOSpec | None = None
    quality: QualitySpec | None = None
    pools: list[PoolSpec] = Field(min_length=1, max_length=8)
    tuning: TuningSpec = TuningSpec()
    rollout: RolloutSpec | None = None
    monitoring: MonitoringSpec = MonitoringSpec()
    routing: RoutingSpec = RoutingSpec()

    @model_validator(mode="after")
    def _cross_field(self) -> InferenceDeploymentSpec:
        if self.rollout is not None:
            for i, pool in enumerate(self.pools):
                if pool.replicas < self.rollout.canary_replicas:
                    raise ValueError(
                        f"spec.pools[{i}].replicas={pool.replicas} is below "
                        f"spec.rollout.canaryReplicas={self.rollout.canary_replicas}; raise "
                        f"the replicas or lower canaryReplicas"
                    )
        names = [p.pool_name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"spec.pools: pool name(s) {dupes} used twice; give each pool a distinct name"
            )
        check_pairs(self.pools)
        pin = self.tuning.pin
        ctx_max = self.workload.context_tokens.max if self.workload.context_tokens else None
        if pin is not None and pin.max_model_len is not None and ctx_max is not None \
                and pin.max_model_len < ctx_max:
            raise ValueError(
                f"spec.tuning.pin.maxModelLen={pin.max_model_len} is below "
                f"spec.workload.contextTokens.max={ctx_max}: vLLM would refuse the longest "
                f"requests the spec promises; raise the pin or lower the max")
        if pin is not None and pin.kv_cache_dtype is not None:
            floor = self.quality.lowest_kv_precision if self.quality else "fp8"
            if KV_DTYPE_BITS[pin.kv_cache_dtype] < PRECISION_FLOOR_BITS[floor]:
                raise ValueError(
                    f"spec.tuning.pin.kvCacheDtype={pin.kv_cache_dtype!r} is narrower than "
                    f"spec.quality.lowestKVPrecision={floor!r}; pin a wider dtype or lower "
                    f"the floor"
                )
        return self

    @property
    def mode(self) -> Mode:
        return self.tuning.mode
