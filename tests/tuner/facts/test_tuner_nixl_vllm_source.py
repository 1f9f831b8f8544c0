"""The facts planner/disagg_compat.py and tuner/kv_transfer.py rely on still hold in the pinned
vLLM 0.33.0 source (read with ast and text; vLLM is never imported: it takes a minute)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from kvtune.tuner.kv_transfer import KV_ROLE, NIXL_CONNECTOR, NIXL_PUSH_CONNECTOR
from kvtune.tuner.planner.disagg_compat import (
    BLOCK_CONTIGUOUS_LAYOUTS,
    KV_CACHE_LAYOUTS,
    NIXL_DEFAULT_LAYOUT,
)

pytestmark = pytest.mark.vllm_source
VLLM_VERSION = "0.33.0"
NIXL = "distributed/kv_transfer/kv_connector/v1/nixl"


def _root() -> Path:
    cache = Path(os.environ.get("KVTUNE_CACHE", Path.home() / ".cache" / "kvtune"))
    root = cache / f"vllm-src-{VLLM_VERSION}" / "vllm"
    if not (root / NIXL / "base_worker.py").is_file():
        pytest.fail(f"{root} missing: run `python scripts/fetch_vllm_source.py` (or setup.sh)")
    return root


def _text(rel: str) -> str:
    return (_root() / rel).read_text()


def _function(rel: str, name: str) -> str:
    tree = ast.parse(_text(rel))
    node = next(n for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name)
    return ast.unparse(node)


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_compatibility_hash_factors() -> None:
    """Rule 1: the hash covers exactly what kvtune compares (plus model facts it shares)."""
    body = _function(f"{NIXL}/metadata.py", "compute_nixl_compatibility_hash")
    tree = ast.parse(body)
    factors = next(n for n in ast.walk(tree) if isinstance(n, ast.Dict)
                   and any(isinstance(k, ast.Constant) and k.value == "cache_dtype"
                           for k in n.keys))
    keys = {k.value for k in factors.keys if isinstance(k, ast.Constant)}
    assert {"vllm_version", "model", "dtype", "attn_backend_name", "cache_dtype",
            "is_hma_enabled", "transfer_mode"} <= keys
    # The KV dtype is hashed as the string the user wrote, not as what auto resolves to.
    assert "str(cache_config.cache_dtype)" in body
    # And block size, TP and layout are not in it (checked at the handshake instead).
    assert not keys & {"block_size", "tensor_parallel_size", "kv_cache_layout"}
    handshake = _function(f"{NIXL}/base_worker.py", "_nixl_handshake")
    assert "handshake_payload.compatibility_hash != self.compat_hash" in handshake


def test_tp_and_block_size_ratios() -> None:
    """Rules 2 and 3: TransferTopology asserts both ways for TP, decode % prefill for blocks."""
    tp = _function("distributed/kv_transfer/kv_connector/utils.py", "tp_ratio")
    assert "self.tp_size % remote_tp_size == 0" in tp
    assert "remote_tp_size % self.tp_size == 0" in tp
    bs = _function("distributed/kv_transfer/kv_connector/utils.py", "block_size_ratio")
    assert "self.block_size % remote_block_size == 0" in bs


def test_handshake_rules() -> None:
    """Rules 3-6 as _validate_remote_agent_handshake states them (local = decode: the pull
    connector's reader)."""
    body = _squash(_function(f"{NIXL}/base_worker.py", "_validate_remote_agent_handshake"))
    assert "Different local/remote block sizes are not supported when P TP > D TP" in body
    assert "Heterogeneous block sizes are not supported with host buffer" in body
    assert ("not (tp_ratio < 0 and self.transfer_topo.is_kv_replicated(remote_engine_id))"
            in body)
    assert ("if not self.use_mla and nixl_agent_meta.kv_cache_layout != kv_cache_layout"
            in body)
    assert ("enable_permute_local_kv and nixl_agent_meta.kv_cache_layout == 'LBHNC' and "
            "(kv_cache_layout == 'LBNHC')" in body)
    assert "not KVCacheLayout[kv_cache_layout].is_block_contiguous" in body
    assert ("self.dcp_size % remote_dcp_size == 0 or remote_dcp_size % self.dcp_size == 0"
            in body)


def test_kv_cache_layouts() -> None:
    """Rule 5's vocabulary: the layouts, which are block-contiguous, NIXL's default."""
    src = _text("v1/kv_cache_layout.py")
    members = dict(re.findall(r"^    (\w+) = \(([\d, ]+)\)", src, re.M))
    assert set(members) == KV_CACHE_LAYOUTS - {"NHD", "HND"}
    # is_block_contiguous: the last three axes are H, N, C (2, 3, 4).
    contiguous = {name for name, axes in members.items() if axes.endswith("2, 3, 4")}
    assert contiguous == BLOCK_CONTIGUOUS_LAYOUTS
    required = _function(f"{NIXL}/connector.py", "get_required_kvcache_layout")
    assert f"return '{NIXL_DEFAULT_LAYOUT}'" in required and "if use_mla:" in required
    env = _text("envs.py")
    assert all(name in env for name in KV_CACHE_LAYOUTS)


def test_nixl_dcp_and_hma_rules() -> None:
    """Rule 6 (config/vllm.py) and the hybrid manager staying on with NIXL (SupportsHMA)."""
    config = _squash(_text("config/vllm.py"))
    assert "assert dcp_size in (1, transfer_tp_size)" in config
    assert "self.model_config.use_mla or dcp_size == 1" in config
    assert "if not KVConnectorFactory.supports_hma_config(self.kv_transfer_config):" in config
    connector = _text(f"{NIXL}/connector.py")
    assert re.search(r"class NixlBaseConnector\(KVConnectorBase_V1, SupportsHMA\)", connector)
    assert re.search(r"class NixlPushConnector\(NixlBaseConnector\)", connector)
    assert re.search(rf"^{NIXL_CONNECTOR} = NixlPullConnector", connector, re.M)
    assert NIXL_PUSH_CONNECTOR in _text("distributed/kv_transfer/kv_connector/factory.py")


def test_kv_transfer_config_flag_and_roles() -> None:
    """The flag exists, is parsed into KVTransferConfig, and the roles kvtune renders are its
    literals; kv_both is deprecated for NIXL."""
    args = _text("engine/arg_utils.py")
    assert '"--kv-transfer-config", **vllm_kwargs["kv_transfer_config"]' in args
    assert "kv_transfer_config: KVTransferConfig | None = None" in args
    cfg = _text("config/kv_transfer.py")
    assert 'KVProducer = Literal["kv_producer", "kv_both"]' in cfg
    assert 'KVConsumer = Literal["kv_consumer", "kv_both"]' in cfg
    for field in ("kv_connector: str | None", "kv_role: KVRole | None",
                  "kv_buffer_device: str", "enable_permute_local_kv: bool"):
        assert field in cfg
    assert set(KV_ROLE.values()) == {"kv_producer", "kv_consumer"}
    assert "Using kv_role='kv_both' with NixlConnector is deprecated" in _squash(
        _text(f"{NIXL}/connector.py")).replace('" "', "")
