"""Prefill/decode disaggregation's vocabulary: the roles, the connector and the
``--kv-transfer-config`` flag each role's ``vllm serve`` line carries, as vLLM 0.33 parses it.

vLLM 0.33 reads ``--kv-transfer-config`` as JSON into ``KVTransferConfig``
(``vllm/config/kv_transfer.py``; ``vllm/engine/arg_utils.py`` adds the flag from the
``kv_transfer_config`` field). ``kv_connector`` names the connector class (``NixlConnector`` is
the pull connector, ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/connector.py``: the
decode side reads the prefill side's blocks); ``kv_role`` must be set with a connector
(``KVTransferConfig.__post_init__``). ``kv_both`` on a NixlConnector is deprecated in 0.33
(``NixlBaseConnector.__init__`` warns and asks for ``kv_producer`` on prefill and
``kv_consumer`` on decode), so each role gets its own.

Plain data only; the compatibility rules are ``planner/disagg_compat.py``.
"""

from __future__ import annotations

import json
from typing import Literal

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")
KV_TRANSFER_CONFIG_FLAG = "--kv-transfer-config"
# The pull connector (vLLM's alias for NixlPullConnector); the one kvtune renders.
NIXL_CONNECTOR = "NixlConnector"
NIXL_PUSH_CONNECTOR = "NixlPushConnector"
# KVTransferConfig.kv_role per role (vllm/config/kv_transfer.py: KVProducer, KVConsumer).
KV_ROLE: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


def kv_transfer_config(role: Role, connector: str = NIXL_CONNECTOR,
                       kv_buffer_device: str | None = None) -> dict[str, object]:
    """The ``KVTransferConfig`` fields kvtune sets for ``role``; the rest keep vLLM's defaults
    (``engine_id``: a fresh UUID per engine; ``kv_buffer_device``: the GPU)."""
    config: dict[str, object] = {"kv_connector": connector, "kv_role": KV_ROLE[role]}
    if kv_buffer_device is not None:
        config["kv_buffer_device"] = kv_buffer_device
    return config


def kv_transfer_args(role: Role, connector: str = NIXL_CONNECTOR,
                     kv_buffer_device: str | None = None) -> list[str]:
    """``--kv-transfer-config=<json>`` for ``role``: one argv element, compact JSON (no shell
    quoting needed inside a container's args)."""
    value = json.dumps(kv_transfer_config(role, connector, kv_buffer_device),
                       separators=(",", ":"))
    return [f"{KV_TRANSFER_CONFIG_FLAG}={value}"]
