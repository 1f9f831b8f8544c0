"""The spec's tuning (mode, Prometheus, retune, pins) and rollout parts.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from kvtune.operator.api.durations import DURATION_PATTERN, parse_duration
from kvtune.operator.api.pin_spec_fields import PinSpecFields
from kvtune.operator.api.schema_base import (
    Mode,
    _knob_docs,
    _Model,
    _rules,
)
from kvtune.operator.api.spec_bounds import check_durations, duration_rules
from kvtune.tuner.facts import kv_tiers
from kvtune.tuner.knobs import BY_NAME, PINNABLE, camel_name
from kvtune.tuner.planner.policy import Pins

_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
PoolSelectorKind = Literal["pod", "labels", "none"]


class PrometheusSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.tuning.prometheus", "window")))

    url: str = Field(min_length=1, max_length=512, pattern=r"^https?://")
    window: str = Field(default="6h", pattern=DURATION_PATTERN, max_length=32)
    pool_selector: PoolSelectorKind = Field(
        default="pod",
        description="How a pool's series are found. pod: namespaceLabel=<namespace>, "
                    "podLabel=~<name>-<pool>-<rs>-<pod> (Kubernetes service discovery's "
                    "target labels); labels: the pod labels kvtune.io/deployment and "
                    "kvtune.io/pool copied onto the series (deploymentLabel, poolLabel); "
                    "none: every pool is planned on the deployment-wide profile "
                    "(model_name).",
    )
    namespace_label: str = Field(default="namespace", pattern=_LABEL_NAME, max_length=128)
    pod_label: str = Field(default="pod", pattern=_LABEL_NAME, max_length=128)
    deployment_label: str = Field(default="kvtune_io_deployment", pattern=_LABEL_NAME,
                                  max_length=128)
    pool_label: str = Field(default="kvtune_io_pool", pattern=_LABEL_NAME, max_length=128)

    @model_validator(mode="after")
    def _bounded(self) -> PrometheusSpec:
        check_durations(self, "spec.tuning.prometheus", "window")
        return self

    def window_seconds(self) -> float:
        return parse_duration(self.window, field="spec.tuning.prometheus.window")


class RetuneSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.tuning.retune", "minInterval", "dwell")))

    min_interval: str = Field(default="6h", pattern=DURATION_PATTERN, max_length=32)
    drift_threshold: float = Field(default=0.2, gt=0.0, le=1.0)
    dwell: str | None = Field(
        default=None, pattern=DURATION_PATTERN, max_length=32,
        description="How long a drift must persist, with the new traffic holding still, "
                    "before the pool is planned again. Default: tuning.prometheus.window. "
                    "At least the window: a shift fills the window only after one window, "
                    "and a shorter dwell would plan for a mix of old and new traffic.",
    )

    @model_validator(mode="after")
    def _bounded(self) -> RetuneSpec:
        check_durations(self, "spec.tuning.retune", "min_interval", "dwell")
        return self

    def dwell_seconds(self, window_seconds: float) -> float:
        """The dwell time; the window when the spec leaves it out."""
        if self.dwell is None:
            return window_seconds
        return parse_duration(self.dwell, field="spec.tuning.retune.dwell")


PIN_PATH = "spec.tuning.pin"


def pin_path(name: str, where: str = PIN_PATH) -> str:
    """Where the user writes the pin of knob ``name`` (``kv_offloading_size_gib`` ->
    ``spec.tuning.pin.kvOffloadingSizeGiB``): the one spelling, from the knob table.
    ``where`` is the pin's object (a prefill/decode pool's own ``spec.pools[].pin``)."""
    return f"{where}.{camel_name(BY_NAME[name])}"


class PinSpec(PinSpecFields):
    """Knobs a human wants fixed (vLLM's flags, camelCase)."""

    # (The docstring is the CRD's description.) The fields and their bounds are the knob
    # table's (kvtune.tuner.knobs), generated into pin_spec_fields.py.

    model_config = ConfigDict(
        json_schema_extra=_knob_docs(_rules(
            ("!has(self.blockSize) || self.blockSize % 16 == 0",
             "blockSize must be a multiple of 16 (vLLM's attention backends need it); "
             "use 16, 32, 64 or 128"),
            ("!(has(self.gpuMemoryUtilization) && has(self.kvCacheMemoryBytes))",
             "pin gpuMemoryUtilization or kvCacheMemoryBytes, not both: vLLM ignores the "
             "fraction when the bytes are set"),
        ))
    )

    @model_validator(mode="after")
    def _valid(self) -> PinSpec:
        if self.block_size is not None and self.block_size % 16:
            raise ValueError(
                f"{pin_path('block_size')}={self.block_size} is not a multiple of 16; "
                f"use 16, 32, 64 or 128"
            )
        if self.gpu_memory_utilization is not None and self.kv_cache_memory_bytes is not None:
            raise ValueError("pin gpuMemoryUtilization or kvCacheMemoryBytes, not both")
        return self

    def to_pins(self) -> Pins:
        """The planner's pins: every pinnable knob of the table (``kvtune.tuner.knobs``)."""
        return Pins(**{k.name: getattr(self, k.name) for k in PINNABLE})


_DWELL_RULE = (
    "!has(self.retune) || !has(self.retune.dwell) || !has(self.prometheus) || "
    "duration(self.retune.dwell) >= "
    "duration(has(self.prometheus.window) ? self.prometheus.window : '6h')",
    "tuning.retune.dwell must be at least tuning.prometheus.window: a traffic shift fills "
    "the window only after one window; raise dwell or shorten the window",
)


_KV_TIERS = "spec.tuning.kvTiers"


class KVTiersSpec(_Model):
    """What a platform team lets a pool use for KV beyond the GPU besides host memory
    (``cpuOffloadGiB``): LMCache's local-disk tier and a remote LMCache store. The plan weighs
    none, the native and LMCache CPU tiers and these by capacity at SLO, the cheaper within
    the tie (docs/kv-tiers.md), as ``kvtune plan --kv-tier-*`` does."""

    model_config = ConfigDict(json_schema_extra=_rules(
        ("!has(self.remoteGiB) || has(self.remoteUrl)",
         "tuning.kvTiers.remoteGiB sizes the remote store: set tuning.kvTiers.remoteUrl "
         "(lm://host:port) or drop remoteGiB"),
        ("!has(self.remoteUrl) || self.remoteUrl.matches('"
         + kv_tiers.LMCACHE_REMOTE_URL_PATTERN + "')",
         "tuning.kvTiers.remoteUrl: " + kv_tiers.LMCACHE_REMOTE_URL_FIX),
    ))

    disk_gib: float | None = Field(
        default=None, gt=0.0, le=1048576.0, alias="diskGiB",
        description="Node disk (GiB per replica) LMCache's disk tier may fill: an emptyDir "
                    "with this sizeLimit and a matching ephemeral-storage request and limit.",
    )
    remote_url: str | None = Field(
        default=None, max_length=256,
        description="A remote LMCache store, as lmcache 0.5.6 names it: lm://host:port "
                    "(LMCache's server), redis://host:port or mooncakestore://host:port.",
    )
    remote_gib: float | None = Field(
        default=None, gt=0.0, le=1048576.0, alias="remoteGiB",
        description="GiB of the remote store one replica may fill (default "
                    f"{kv_tiers.LMCACHE_REMOTE_DEFAULT_GIB:g}).",
    )

    @model_validator(mode="after")
    def _valid(self) -> KVTiersSpec:
        url = self.remote_url
        if url is not None and not re.match(kv_tiers.LMCACHE_REMOTE_URL_PATTERN, url):
            raise ValueError(f"{_KV_TIERS}.remoteUrl={url!r}: {kv_tiers.LMCACHE_REMOTE_URL_FIX}")
        if self.remote_gib is not None and url is None:
            raise ValueError(f"{_KV_TIERS}.remoteGiB={self.remote_gib:g} sizes the remote "
                             f"store: set {_KV_TIERS}.remoteUrl (lm://host:port) or drop "
                             "remoteGiB")
        return self

    def remote_size_gib(self) -> float:
        return (self.remote_gib if self.remote_gib is not None
                else kv_tiers.LMCACHE_REMOTE_DEFAULT_GIB)


class TuningSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(_DWELL_RULE))

    mode: Mode = Field(
        default="auto",
        description="auto: apply plans; recommend: write plans to status only; off: hands off.",
    )
    prometheus: PrometheusSpec | None = None
    retune: RetuneSpec | None = None
    pin: PinSpec | None = None
    cpu_offload_gib: float = Field(
        default=0.0, ge=0.0, le=65536.0, alias="cpuOffloadGiB",
        description="CPU memory per GPU (GiB) that may hold offloaded KV blocks; kvtune turns "
                    "KV offloading on when blocks are read back and this is at least 1 GiB. "
                    "0: no KV offload (as `kvtune plan --cpu-offload-gib`).",
    )
    kv_tiers: KVTiersSpec | None = Field(
        default=None, alias="kvTiers",
        description="LMCache's disk and remote tiers a pool may use beside cpuOffloadGiB; "
                    "the plan weighs each kind allowed (as `kvtune plan --kv-tier-*`).",
    )

    @model_validator(mode="after")
    def _dwell_covers_the_window(self) -> TuningSpec:
        if self.retune is None or self.retune.dwell is None or self.prometheus is None:
            return self
        window = self.prometheus.window_seconds()
        dwell = self.retune.dwell_seconds(window)
        if dwell < window:
            raise ValueError(
                f"spec.tuning.retune.dwell={self.retune.dwell!r} ({dwell:g}s) is shorter "
                f"than spec.tuning.prometheus.window={self.prometheus.window!r} "
                f"({window:g}s): a traffic shift fills the window only after one window; "
                f"raise dwell or shorten the window"
            )
        return self


class RolloutSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_rules(
        *duration_rules("spec.rollout", "analysis", "progressDeadline")))

    canary_replicas: int = Field(default=0, ge=0, le=512)
    analysis: str = Field(default="10m", pattern=DURATION_PATTERN, max_length=32)
    progress_deadline: str = Field(
        default="30m", pattern=DURATION_PATTERN, max_length=32,
        description="A pool whose new pods are not ready by then is Degraded/RolloutStuck "
                    "(the Deployment's progressDeadlineSeconds; loading a large model takes "
                    "minutes).",
    )

    min_requests: int = Field(
        default=100, ge=1, le=10_000_000,
        description="Finished requests each revision (canary and stable) needs in the analysis "
                    "window before the canary is judged on TTFT/TPOT attainment, preemptions "
                    "and queue length from vLLM's histograms (spec.tuning.prometheus).",
    )
    on_inconclusive: Literal["promote", "rollback"] = Field(
        default="promote",
        description="What a canary that stayed available but never reached minRequests in "
                    "analysis + progressDeadline becomes: promote (availability held, no "
                    "evidence against it; said in status and an Event) or rollback.",
    )

    @model_validator(mode="after")
    def _bounded(self) -> RolloutSpec:
        check_durations(self, "spec.rollout", "analysis", "progress_deadline")
        return self

    def progress_deadline_seconds(self) -> int:
        seconds = parse_duration(self.progress_deadline, field="spec.rollout.progressDeadline")
        return max(1, round(seconds))
