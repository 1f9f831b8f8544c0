"""Can a prefill plan hand its KV cache to a decode plan over vLLM 0.33's NixlConnector?

vLLM finds out at the first request: the decode engine (the pull connector's reader) handshakes
with the prefill engine and raises, or asserts, when the two differ in what the KV bytes mean.
kvtune checks the same rules on the two plans before rollout and refuses a mismatch in one line
naming the field, the two values and the fix. The rules and where vLLM 0.33 states them
(paths under ``vllm/``; ``nixl/`` is ``distributed/kv_transfer/kv_connector/v1/nixl/``):

1. The compatibility hash (``nixl/metadata.py``, ``compute_nixl_compatibility_hash``; checked
   in ``nixl/base_worker.py``, ``_nixl_handshake``): the vLLM version, the model, its
   ``--dtype``, the KV cache dtype *as written* (``str(cache_config.cache_dtype)``: ``auto`` and
   ``bfloat16`` hash apart), the attention backend's name, whether the hybrid KV cache manager
   is on, and the transfer mode (pull ``NixlConnector`` vs ``NixlPushConnector``).
2. TP: one side's TP divides the other's (``kv_connector/utils.py``,
   ``TransferTopology.tp_ratio`` asserts both ways).
3. Block size: the decode (local) block size is a multiple of the prefill (remote) one
   (``TransferTopology.block_size_ratio``); it must be equal when prefill TP > decode TP on a
   non-MLA model (``_validate_remote_agent_handshake``: "Different local/remote block sizes
   are not supported when P TP > D TP"), and when the KV buffer is on the host
   ("Heterogeneous block sizes are not supported with host buffer").
4. Non-MLA, prefill TP > decode TP: the prefill TP must not exceed the KV heads (its KV would
   be replicated; ``assert not (tp_ratio < 0 and is_kv_replicated(...))``).
5. KV cache layout, non-MLA (``_validate_remote_agent_handshake``): the same on both sides
   (the connector asks for ``LBHNC``, ``NixlBaseConnector.get_required_kvcache_layout``, unless
   ``VLLM_KV_CACHE_LAYOUT`` says otherwise); under unequal TP without replicated KV it must be
   block-contiguous (``KVCacheLayout.is_block_contiguous``, ``v1/kv_cache_layout.py``).
6. Decode context parallel (``config/vllm.py``, ``VllmConfig.__post_init__`` for NIXL): DCP is
   1 or the TP on each side, and > 1 only for MLA; the two sides' DCPs divide one another
   (``_validate_remote_agent_handshake``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.kv_transfer import NIXL_CONNECTOR, NIXL_PUSH_CONNECTOR
from kvtune.tuner.plan import KVPlan

# The layouts whose [H, N, C] are contiguous within a block (KVCacheLayout.is_block_contiguous:
# the last three axes are H, N, C); NHD/HND are vLLM's legacy aliases of LBNHC/LBHNC
# (resolve_kv_cache_layout, v1/attention/backends/utils.py).
_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}
BLOCK_CONTIGUOUS_LAYOUTS = frozenset({"LBHNC", "BLHNC"})
KV_CACHE_LAYOUTS = frozenset({"LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", *_ALIASES})
# NixlBaseConnector.get_required_kvcache_layout: LBHNC for non-MLA models, None (the backend's
# default) for MLA, whose latent has no head axis to split.
NIXL_DEFAULT_LAYOUT = "LBHNC"


class RoleKV(BaseModel):
    """What one role's engine does with its KV cache, as the handshake sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: str  # "prefill" or "decode"
    plan: KVPlan
    tensor_parallel: int = Field(default=1, gt=0)
    decode_context_parallel: int = Field(default=1, gt=0)
    vllm_version: str = "0.33.0"
    connector: str = NIXL_CONNECTOR
    # --enable/--disable-hybrid-kv-cache-manager; None: vLLM decides (on with NIXL, which
    # implements SupportsHMA: VllmConfig.__post_init__ keeps it).
    hybrid_kv_cache_manager: bool | None = None
    # VLLM_KV_CACHE_LAYOUT; None: the connector's choice (LBHNC) or, for MLA, the backend's.
    kv_cache_layout: str | None = None
    # KVTransferConfig.kv_buffer_device: "cpu" stages the KV through host memory.
    kv_buffer_device: str = "cuda"
    # KVTransferConfig.enable_permute_local_kv (decode side: receive LBHNC into LBNHC).
    enable_permute_local_kv: bool = False

    @property
    def hma_enabled(self) -> bool:
        return self.hybrid_kv_cache_manager is not False

    def layout(self, model: ModelArchitecture) -> str | None:
        """The resolved KV cache layout; None for MLA (not compared, rule 5)."""
        if model.is_mla:
            return None
        name = self.kv_cache_layout or NIXL_DEFAULT_LAYOUT
        return _ALIASES.get(name, name)


def check_pair(model: ModelArchitecture, prefill: RoleKV, decode: RoleKV) -> None:
    """Raise ``InvalidInput`` (one line: field, values, fix) on the first rule the pair breaks
    (module doc); return None when vLLM 0.33's NixlConnector would accept it."""
    for side in (prefill, decode):
        _check_side(model, side)
    _check_hash(prefill, decode)
    _check_tp(model, prefill, decode)
    _check_block_size(model, prefill, decode)
    _check_layout(model, prefill, decode)
    p_dcp, d_dcp = prefill.decode_context_parallel, decode.decode_context_parallel
    if p_dcp % d_dcp and d_dcp % p_dcp:
        raise InvalidInput("decode_context_parallel", f"prefill {p_dcp}, decode {d_dcp}",
                           "NixlConnector needs DCP sizes that divide one another; pin the "
                           "same --decode-context-parallel-size on both roles")


def _check_side(model: ModelArchitecture, side: RoleKV) -> None:
    dcp, tp = side.decode_context_parallel, side.tensor_parallel
    if dcp > 1 and not model.is_mla:
        raise InvalidInput("decode_context_parallel", dcp,
                           f"{side.role}: NixlConnector takes DCP > 1 only for MLA models "
                           f"({model.hf_id} is not); drop --decode-context-parallel-size")
    if dcp not in (1, tp):
        raise InvalidInput("decode_context_parallel", dcp,
                           f"{side.role}: with NixlConnector DCP must be 1 or the TP ({tp}); "
                           f"pin --decode-context-parallel-size 1 or {tp}")
    if side.kv_cache_layout is not None and side.kv_cache_layout not in KV_CACHE_LAYOUTS:
        raise InvalidInput("kv_cache_layout", side.kv_cache_layout,
                           f"{side.role}: not a VLLM_KV_CACHE_LAYOUT vLLM 0.33 knows; use one "
                           f"of {', '.join(sorted(KV_CACHE_LAYOUTS))}")


def _mismatch(field: str, p: object, d: object, fix: str) -> InvalidInput:
    return InvalidInput(field, f"prefill {p}, decode {d}",
                        f"NixlConnector's handshake refuses the pair; {fix}")


def _check_hash(p: RoleKV, d: RoleKV) -> None:
    """Rule 1: the factors of compute_nixl_compatibility_hash (nixl/metadata.py)."""
    pairs: tuple[tuple[str, object, object, str], ...] = (
        ("vllm_version", p.vllm_version, d.vllm_version, "run one vLLM version on both roles"),
        ("connector", p.connector, d.connector,
         f"use one of {NIXL_CONNECTOR} (pull) or {NIXL_PUSH_CONNECTOR} on both roles"),
        ("dtype", p.plan.dtype or "auto", d.plan.dtype or "auto",
         "pin the same --dtype on both roles"),
        ("kv_cache_dtype", p.plan.kv_cache_dtype, d.plan.kv_cache_dtype,
         "pin the same --kv-cache-dtype, spelled the same, on both roles (vLLM hashes the "
         "string: auto and bfloat16 differ)"),
        ("attention_backend", p.plan.attention_backend or "auto",
         d.plan.attention_backend or "auto",
         "pin the same --attention-backend on both roles (or leave both to vLLM on one GPU "
         "class)"),
        ("hybrid_kv_cache_manager", "on" if p.hma_enabled else "off",
         "on" if d.hma_enabled else "off",
         "pass the same --enable/--disable-hybrid-kv-cache-manager on both roles"),
    )
    for field, pv, dv, fix in pairs:
        if pv != dv:
            raise _mismatch(field, pv, dv, fix)


def _check_tp(model: ModelArchitecture, p: RoleKV, d: RoleKV) -> None:
    """Rules 2 and 4 (TransferTopology.tp_ratio; _validate_remote_agent_handshake)."""
    ptp, dtp = p.tensor_parallel, d.tensor_parallel
    if max(ptp, dtp) % min(ptp, dtp):
        raise _mismatch("tensor_parallel", ptp, dtp,
                        "pick TPs where one divides the other (e.g. prefill TP "
                        f"{_divisor_near(ptp, dtp)} with decode TP {dtp})")
    if not model.is_mla and ptp > dtp and ptp > model.num_kv_heads:
        raise _mismatch("tensor_parallel", ptp, dtp,
                        f"prefill TP above the {model.num_kv_heads} KV heads replicates its KV, "
                        "which a smaller decode TP cannot read; lower prefill TP to "
                        f"{model.num_kv_heads} or raise decode TP to {ptp}")


def _divisor_near(tp: int, other: int) -> int:
    """The divisor or multiple of ``other`` closest to ``tp`` (for the fix's example)."""
    options = [x for x in range(1, 2 * max(tp, other) + 1) if other % x == 0 or x % other == 0]
    return min(options, key=lambda x: (abs(x - tp), x))


def _check_block_size(model: ModelArchitecture, p: RoleKV, d: RoleKV) -> None:
    """Rule 3 (TransferTopology.block_size_ratio; _validate_remote_agent_handshake)."""
    pb, db = p.plan.block_size, d.plan.block_size
    if pb == db:
        return
    if db % pb:
        raise _mismatch("block_size", pb, db,
                        f"the decode block size must be a multiple of the prefill one; pin "
                        f"--block-size {pb} on both roles (or a decode block size that is a "
                        f"multiple of {pb})")
    if "cpu" in (p.kv_buffer_device, d.kv_buffer_device):
        raise _mismatch("block_size", pb, db, "unequal block sizes do not transfer through a "
                        f"host buffer (kv_buffer_device cpu); pin --block-size {pb} on both")
    if not model.is_mla and p.tensor_parallel > d.tensor_parallel:
        raise _mismatch("block_size", pb, db,
                        f"with prefill TP {p.tensor_parallel} > decode TP {d.tensor_parallel} "
                        f"the block sizes must be equal; pin --block-size {pb} on both roles")


def _check_layout(model: ModelArchitecture, p: RoleKV, d: RoleKV) -> None:
    """Rule 5 (_validate_remote_agent_handshake; v1/kv_cache_layout.py)."""
    pl, dl = p.layout(model), d.layout(model)
    if pl is None or dl is None:
        return  # MLA: the latent is copied whole, the layout is not compared
    permuted = d.enable_permute_local_kv and pl == "LBHNC" and dl == "LBNHC"
    if pl != dl and not permuted:
        raise _mismatch("kv_cache_layout", pl, dl,
                        "set the same VLLM_KV_CACHE_LAYOUT on both roles (or unset it: "
                        f"NixlConnector picks {NIXL_DEFAULT_LAYOUT})")
    replicated = p.tensor_parallel > model.num_kv_heads
    if (p.tensor_parallel != d.tensor_parallel and not replicated and not permuted
            and pl not in BLOCK_CONTIGUOUS_LAYOUTS):
        raise _mismatch("kv_cache_layout", pl, dl,
                        "unequal TPs split KV heads, which needs a block-contiguous layout; "
                        f"set VLLM_KV_CACHE_LAYOUT={NIXL_DEFAULT_LAYOUT} on both roles (or "
                        "equal TPs)")
