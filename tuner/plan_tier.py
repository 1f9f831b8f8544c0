"""An LMCache KV tier on a pool's plan (issue 27 item 1): what ``PoolPlan.kv_tier`` holds, the
``--kv-transfer-config`` flag it renders and the LMCache config file it needs
(``tuner/facts/kv_tiers.py`` says where each name comes from). vLLM's native CPU tier is not
here: it is the ``kv_offloading_size_gib`` knob of ``KVPlan``.

Sizes are GiB across the replica's TP ranks, like ``--kv-offloading-size``; LMCache's own
``max_local_cpu_size`` / ``max_local_disk_size`` are per rank, so the file divides by TP.
"""

from __future__ import annotations

import json

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvtune.tuner.facts import kv_tiers


class KVTier(BaseModel):
    """An LMCache tier: its kind and sizes, across TP ranks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str  # "lmcache-cpu", "lmcache-disk" or "lmcache-remote"
    # What the tier holds, GiB across TP ranks: pinned host memory (cpu), the node's disk
    # (disk), the remote store's share for this replica (remote; outside the pod).
    size_gib: float = Field(gt=0.0)
    # LMCache's CPU buffer in front of the disk or remote store, GiB across ranks (the cpu
    # tier's buffer is the tier itself).
    buffer_gib: float = Field(default=0.0, ge=0.0)
    chunk_size_tokens: int = Field(default=kv_tiers.LMCACHE_CHUNK_TOKENS, gt=0)
    remote_url: str | None = None  # "lm://host:port" (lmcache's lm_connector), remote only

    @model_validator(mode="after")
    def _kind_and_url(self) -> KVTier:
        if self.kind not in kv_tiers.TIER_KINDS:
            raise ValueError(f"kind={self.kind!r}: must be one of "
                             f"{', '.join(kv_tiers.LMCACHE_KINDS)}")
        kind = self.kind
        if kind == "native-cpu":
            raise ValueError("kind='native-cpu': vLLM's native tier is KVPlan."
                             "kv_offloading_size_gib; use an lmcache-* kind here")
        if (kind == "lmcache-remote") != (self.remote_url is not None):
            raise ValueError(f"remote_url={self.remote_url!r}: set it (lm://host:port) for "
                             "kind='lmcache-remote' and only for it")
        return self

    def cpu_gib(self) -> float:
        """The host memory LMCache pins in the pod, GiB across ranks."""
        return self.size_gib if self.kind == "lmcache-cpu" else self.buffer_gib

    def disk_gib(self) -> float:
        """The disk the pod writes, GiB across ranks (0 unless a disk tier)."""
        return self.size_gib if self.kind == "lmcache-disk" else 0.0


def transfer_config_flag() -> str:
    """``--kv-transfer-config`` for LMCache's in-process connector (vLLM's
    ``LMCacheConnectorV1``, both storing and loading)."""
    config = {"kv_connector": kv_tiers.LMCACHE_CONNECTOR, "kv_role": "kv_both"}
    return "--kv-transfer-config=" + json.dumps(config, separators=(",", ":"))


def _per_rank(gib: float, tensor_parallel: int) -> float:
    # LMCache reads GB as float and allocates int(size * 1024**3) bytes per rank.
    return round(gib / tensor_parallel, 3)


def lmcache_config(tier: KVTier, tensor_parallel: int) -> dict[str, object]:
    """The LMCache config file's keys (``lmcache/v1/config.py`` names) for one replica."""
    config: dict[str, object] = {
        "chunk_size": tier.chunk_size_tokens,
        "local_cpu": True,
        "max_local_cpu_size": _per_rank(tier.cpu_gib(), tensor_parallel),
    }
    if tier.kind == "lmcache-disk":
        config["local_disk"] = "file://" + kv_tiers.LMCACHE_DISK_PATH
        config["max_local_disk_size"] = _per_rank(tier.size_gib, tensor_parallel)
    if tier.kind == "lmcache-remote":
        config["remote_url"] = tier.remote_url
        config["remote_serde"] = kv_tiers.LMCACHE_REMOTE_SERDE
    return config


def lmcache_config_yaml(tier: KVTier, tensor_parallel: int) -> str:
    """The same keys as the file ``LMCACHE_CONFIG_FILE`` would name."""
    return yaml.safe_dump(lmcache_config(tier, tensor_parallel), sort_keys=False)


def lmcache_env(tier: KVTier, tensor_parallel: int) -> list[dict[str, str]]:
    """The container's ``LMCACHE_*`` variables: with no ``LMCACHE_CONFIG_FILE`` LMCache reads
    each key from ``LMCACHE_<KEY>`` (``lmcache/v1/config_base.py: _from_env``, prefix
    ``LMCACHE_``), so the pod needs no ConfigMap whose life the operator would manage."""
    env = []
    for key, value in lmcache_config(tier, tensor_parallel).items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        env.append({"name": f"LMCACHE_{key.upper()}", "value": text})
    return env
