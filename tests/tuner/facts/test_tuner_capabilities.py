"""The capability data of each vLLM version against the real wheel's source, read with
``ast`` (vLLM is never imported), plus the selection logic on top of it."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kvtune.tuner.errors import InvalidInput, UnknownName
from kvtune.tuner.facts.capabilities import PINNED_VLLM_VERSION, available_versions, get_runtime

REPO = Path(__file__).resolve().parents[3]


@cache
def vllm_source(version: str) -> Path:
    """The unpacked wheel (downloaded once by scripts/fetch_vllm_source.py)."""
    spec = importlib.util.spec_from_file_location(
        "fetch_vllm_source", REPO / "scripts" / "fetch_vllm_source.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root: Path = module.fetch(version)
    return root / "vllm"


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _cache_dtype_literal(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "CacheDType" for t in node.targets)
            and isinstance(node.value, ast.Subscript)
        ):
            elts = node.value.slice
            assert isinstance(elts, ast.Tuple)
            return [ast.literal_eval(e) for e in elts.elts]
    raise AssertionError("CacheDType literal not found in vllm/config/cache.py")


def _backend_class_facts(path: Path) -> dict[str, Any]:
    """get_name(), supported_kv_cache_dtypes and the literal list returned last by
    get_supported_kernel_block_sizes of the backend class defined in ``path``."""
    facts: dict[str, Any] = {}
    for node in ast.walk(_parse(path)):
        if not isinstance(node, ast.ClassDef) or not node.name.endswith("Backend"):
            continue
        for stmt in node.body:
            if (
                isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and stmt.target.id == "supported_kv_cache_dtypes" and stmt.value is not None
            ):
                facts["dtypes"] = ast.literal_eval(stmt.value)
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "get_name":
                ret = stmt.body[-1]
                assert isinstance(ret, ast.Return) and ret.value is not None
                facts["name"] = ast.literal_eval(ret.value)
            if (
                isinstance(stmt, ast.FunctionDef)
                and stmt.name == "get_supported_kernel_block_sizes"
            ):
                ret = stmt.body[-1]
                assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.List)
                sizes: list[Any] = []
                for elt in ret.value.elts:
                    if isinstance(elt, ast.Call):  # MultipleOf(16)
                        sizes.append(("multiple_of", ast.literal_eval(elt.args[0])))
                    else:
                        sizes.append(ast.literal_eval(elt))
                facts["block_sizes"] = sizes
        if "name" in facts:
            return facts
    raise AssertionError(f"no backend class in {path}")


@pytest.mark.vllm_source
@pytest.mark.parametrize("version", available_versions())
def test_kv_cache_dtypes_equal_the_cache_dtype_literal(version: str) -> None:
    src = vllm_source(version)
    literal = _cache_dtype_literal(_parse(src / "config" / "cache.py"))
    assert list(get_runtime(version).kv_cache_dtype_names) == literal


@pytest.mark.vllm_source
@pytest.mark.parametrize("version", available_versions())
def test_backends_equal_the_backend_classes(version: str) -> None:
    src = vllm_source(version)
    runtime = get_runtime(version)
    for backend in runtime.backends:
        rel = backend.source.removeprefix("vllm/")
        facts = _backend_class_facts(src / rel)
        assert facts["name"] == backend.name
        assert list(backend.kv_cache_dtypes) == facts["dtypes"], backend.name
        sizes = facts["block_sizes"]
        if backend.block_size_multiple_of is not None:
            assert sizes == [("multiple_of", backend.block_size_multiple_of)], backend.name
        else:
            # FlashInfer's last return is the large-page list (Blackwell GQA only).
            extra = backend.block_sizes_on_majors.get("10")
            assert sizes in (list(backend.block_sizes or ()), list(extra or ())), backend.name


@pytest.mark.vllm_source
@pytest.mark.parametrize("version", available_versions())
def test_backend_priorities_and_flags_exist(version: str) -> None:
    src = vllm_source(version)
    cuda = (src / "platforms" / "cuda.py").read_text(encoding="utf-8")
    runtime = get_runtime(version)
    for family in runtime.backend_priority.values():
        for names in family.values():
            for name in names:
                assert f"AttentionBackendEnum.{name}," in cuda, name
    # vLLM's own order on Hopper for standard attention.
    order = [
        line.strip().rstrip(",").removeprefix("AttentionBackendEnum.")
        for line in cuda.splitlines() if line.strip().startswith("AttentionBackendEnum.")
    ]
    hopper = list(runtime.backend_priority["standard"]["9"])
    assert any(order[i:i + len(hopper)] == hopper for i in range(len(order)))
    arg_utils = (src / "engine" / "arg_utils.py").read_text(encoding="utf-8")
    for flag in runtime.flags:
        if flag == "--enable-prefix-caching":
            assert "enable_prefix_caching" in arg_utils
            continue
        assert f'"{flag}"' in arg_utils, flag
    cache_py = (src / "config" / "cache.py").read_text(encoding="utf-8")
    util = runtime.default_gpu_memory_utilization
    assert f"gpu_memory_utilization: float = Field(default={util}" in cache_py
    assert f"DEFAULT_BLOCK_SIZE: ClassVar[int] = {runtime.default_block_size}" in cache_py
    for algo in runtime.prefix_caching_hash_algos:
        assert f'"{algo}"' in cache_py
    # The sparse-MLA rows kvmemory.py uses.
    mla = (src / "model_executor" / "layers" / "attention" / "mla_attention.py").read_text()
    assert '{"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}' in mla
    torch_utils = (src / "utils" / "torch_utils.py").read_text(encoding="utf-8")
    assert "return head_size // 2 + head_size // 16" in torch_utils
    # Per-token-head dtypes: one fp32 scale per K and per V side of each head (kvmemory.py).
    triton = (src / "v1" / "attention" / "backends" / "triton_attn.py").read_text()
    assert "content = (hs_k + hs_v) * get_dtype_size(spec.dtype) + 2 * scale_bytes" in triton
    assert "hs_k, hs_v = hs_k // 2, hs_v // 2" in triton  # int4 packs two per byte
    # The server's default batch per GPU memory tier (capabilities.defaults_for_memory).
    for tier in runtime.default_max_num_batched_tokens:
        if tier["min_memory_gib"]:
            assert f"device_memory >= {tier['min_memory_gib']} * GiB_bytes" in arg_utils
        assert f"UsageContext.OPENAI_API_SERVER: {tier['tokens']}," in arg_utils
        assert f"UsageContext.OPENAI_API_SERVER: {tier['seqs']}," in arg_utils
    assert '"a100" not in device_name' in arg_utils
    # Sliding-window admission cap and the in-flight batches (kvmemory.blocks_per_request).
    spec = (src / "v1" / "kv_cache_interface.py").read_text(encoding="utf-8")
    assert "return cdiv(num_tokens, self.block_size) + 1" in spec
    vllm_config = (src / "config" / "vllm.py").read_text(encoding="utf-8")
    assert "self.max_concurrent_batches * self.scheduler_config.max_num_batched_tokens" in (
        vllm_config)
    # Hybrid grouping (kvmemory.kv_cache_groups): the 1.5x rule.
    planning = (src / "v1" / "core" / "kv_cache_planning.py").read_text(encoding="utf-8")
    assert "if max_num_layers < min_num_layers * 1.5:" in planning


def test_selection_follows_vllm_priorities() -> None:
    rt = get_runtime(PINNED_VLLM_VERSION)
    hopper, blackwell, ampere = (9, 0), (10, 0), (8, 0)
    pick = rt.select_backend
    assert pick("auto", "standard", hopper).name == "FLASH_ATTN"  # type: ignore[union-attr]
    assert pick("fp8", "standard", hopper).name == "FLASH_ATTN"  # type: ignore[union-attr]
    # FA3 is Hopper only: FP8 KV on Blackwell goes to FlashInfer, on Ampere to Triton.
    assert pick("fp8", "standard", blackwell).name == "FLASHINFER"  # type: ignore[union-attr]
    assert pick("fp8", "standard", ampere).name == "FLASHINFER"  # type: ignore[union-attr]
    assert pick("int8_per_token_head", "standard", hopper).name == "TRITON_ATTN"  # type: ignore[union-attr]
    assert pick("nvfp4", "standard", hopper) is None
    assert pick("nvfp4", "standard", blackwell).name == "FLASHINFER"  # type: ignore[union-attr]
    assert pick("auto", "mla", hopper).name == "FLASH_ATTN_MLA"  # type: ignore[union-attr]
    assert pick("fp8", "mla", hopper).name == "FLASHMLA"  # type: ignore[union-attr]
    assert pick("fp8", "mla", blackwell).name == "FLASHINFER_MLA"  # type: ignore[union-attr]
    # A block size the first backend refuses moves the choice on.
    assert pick("fp8", "mla", blackwell, 128).name == "CUTLASS_MLA"  # type: ignore[union-attr]
    assert pick("fp8", "mla", hopper, 32).name == "TRITON_MLA"  # type: ignore[union-attr]


def test_unknown_version_and_dtype() -> None:
    with pytest.raises(UnknownName, match=r"0\.33\.0"):
        get_runtime("0.1.0")
    with pytest.raises(InvalidInput, match="nvfp4"):
        get_runtime().dtype("int2")


def test_default_batch_tiers() -> None:
    rt = get_runtime()
    gib = 1 << 30
    assert rt.defaults_for_memory(178 * gib, "B200") == (16384, 1024)
    assert rt.defaults_for_memory(139 * gib, "H200") == (8192, 1024)
    assert rt.defaults_for_memory(79 * gib, "A100-80GB") == (2048, 256)
    assert rt.defaults_for_memory(44 * gib, "L40S") == (2048, 256)
