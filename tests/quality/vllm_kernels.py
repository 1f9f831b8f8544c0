"""vLLM 0.33.0's own cache-write kernels, run on the CPU under Triton's interpreter.

The Triton functions are taken from the pinned wheel's source (``~/.cache/kvtune/vllm-src-
0.33.0``) with ``ast`` and executed as written; nothing of vLLM is imported (it needs a GPU
platform). Triton's interpreter is chosen when triton is first imported
(``TRITON_INTERPRET=1``), so the kernels run in a child process (``run_cases``): the test
session's own triton, and anything else that uses it, is left alone.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pickle
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
OPS = "vllm/v1/attention/ops"


@cache
def vllm_source_dir() -> Path:
    """The unpacked pinned wheel (scripts/fetch_vllm_source.py downloads it once)."""
    spec = importlib.util.spec_from_file_location(
        "fetch_vllm_source", REPO / "scripts" / "fetch_vllm_source.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root: Path = module.fetch("0.33.0")
    return root


def _load(relpath: str, names: set[str], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    path = vllm_source_dir() / relpath
    tree = ast.parse(path.read_text())
    ns: dict[str, Any] = {"triton": triton, "tl": tl, "torch": torch, **(extra or {})}
    found = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(compile(ast.Module([node], []), str(path), "exec"), ns)
            found.add(node.name)
    assert found == names, f"{relpath}: missing {names - found} (vLLM moved them?)"
    return ns


def _per_token_head(key: torch.Tensor, value: torch.Tensor, kind: str
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_reshape_cache_per_token_head`` into one block: (k, k scales, v, v scales).

    ``kind="int8"``: the int8 codes, as the GPU stores them. ``kind="fp8"``: the float32
    values the kernel hands to its fp8 store (the kernel run into a float32 cache), because
    the interpreter's own fp32->fp8 conversion is not the GPU's (it rounds ties up, flushes
    subnormals to zero and mis-saturates), while torch's ``.to(torch.float8_e4m3fn)`` rounds
    like the GPU's ``cvt.rn.satfinite`` for values within ±448 (the kernel clamps first).
    """
    ns = _load(f"{OPS}/triton_reshape_and_cache_flash.py", {"_reshape_cache_per_token_head"})
    tokens, heads, dim = key.shape
    cache_dtype = torch.int8 if kind == "int8" else torch.float32
    kc = torch.zeros(1, tokens, heads, dim, dtype=cache_dtype)
    vc = torch.zeros_like(kc)
    ks = torch.zeros(1, tokens, heads)
    vs = torch.zeros_like(ks)
    # The wrapper's _PER_TOKEN_HEAD_QUANT_PARAMS: int8 (127, -128), fp8 (FP8_MAX, FP8_MIN).
    qmax, qmin = (127.0, -128.0) if kind == "int8" else (448.0, -448.0)
    ns["_reshape_cache_per_token_head"][(tokens, heads)](
        key, value, kc, vc, ks, vs, torch.arange(tokens),
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        ks.stride(0), ks.stride(1), ks.stride(2), vs.stride(0), vs.stride(1), vs.stride(2),
        block_size=tokens, head_size=dim, head_size_v=dim,
        HEAD_SIZE_PADDED=triton.next_power_of_2(dim), QUANT_MAX=qmax, QUANT_MIN=qmin,
        IS_INT_QUANT=kind == "int8")
    return kc[0].numpy(), ks[0].numpy(), vc[0].numpy(), vs[0].numpy()


def _per_tensor_fp8_prestore(key: torch.Tensor, value: torch.Tensor, k_scale: float,
                            v_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """``reshape_and_cache_kernel_flash`` (NHD layout, FP8_KV_CACHE) run into a float32
    cache: the values it hands to the fp8 store (``key / k_scale``), see ``per_token_head``."""
    ns = _load(f"{OPS}/triton_reshape_and_cache_flash.py", {"reshape_and_cache_kernel_flash"})
    tokens, heads, dim = key.shape
    kc = torch.zeros(1, tokens, heads, dim, dtype=torch.float32)
    vc = torch.zeros_like(kc)
    ns["reshape_and_cache_kernel_flash"][(tokens, 1)](
        key, value, kc, vc, torch.arange(tokens),
        torch.tensor(k_scale, dtype=torch.float32), torch.tensor(v_scale, dtype=torch.float32),
        key.stride(0), value.stride(0), kc.stride(0), kc.stride(2), 1, 1, kc.stride(1),
        num_heads=heads, head_size=dim, block_size=tokens, x=8, USE_HEAD_MAJOR_LAYOUT=False,
        INTERLEAVED_V_PACK_FACTOR=0, FP8_KV_CACHE=True,
        TILE_SIZE=triton.next_power_of_2(heads * dim))
    return kc[0].numpy(), vc[0].numpy()


def torch_fp8_store(prestore: np.ndarray) -> np.ndarray:
    """The GPU's saturating fp8 e4m3 store, with torch's own float8 type: clamp to ±448
    (``__NV_SATFINITE``), then ``.to(torch.float8_e4m3fn)`` (round to nearest even)."""
    t = torch.from_numpy(np.ascontiguousarray(prestore, dtype=np.float32)).clamp(-448.0, 448.0)
    return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def _rht_namespace() -> dict[str, Any]:
    ns = _load(f"{OPS}/int4_per_token_head.py",
               {"_get_rht_signs", "fast_hadamard_transform", "single_rht"},
               {"_RHT_SIGNS_CACHE": {}, "_hadacore_available": lambda: False,
                "largest_power_of_2_divisor": lambda n: n & -n,
                "_TRITON_HADAMARD_MIN_D": 16, "_TRITON_HADAMARD_MAX_D": 128})
    return ns


def single_rht(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """vLLM's ``single_rht`` (its CPU butterfly)."""
    out: torch.Tensor = _rht_namespace()["single_rht"](x, inverse)
    return out


def _int4(key: torch.Tensor, value: torch.Tensor
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``reshape_and_cache_int4``: vLLM's RHT then ``_reshape_cache_int4_kernel`` into one
    block: (k packed, k packed scales, v packed, v packed scales)."""
    rht = _rht_namespace()["single_rht"]
    ns = _load(f"{OPS}/int4_per_token_head.py", {"pack_int4_nibbles", "_reshape_cache_int4_kernel"})
    key_r = rht(key.float()).to(key.dtype)
    value_r = rht(value.float()).to(value.dtype)
    tokens, heads, dim = key.shape
    kc = torch.zeros(1, tokens, heads, dim // 2, dtype=torch.uint8)
    vc = torch.zeros_like(kc)
    ks = torch.zeros(1, tokens, heads)
    vs = torch.zeros_like(ks)
    ns["_reshape_cache_int4_kernel"][(tokens, heads)](
        key_r, value_r, kc, vc, ks, vs, torch.arange(tokens),
        key_r.stride(0), key_r.stride(1), value_r.stride(0), value_r.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        ks.stride(0), ks.stride(1), ks.stride(2), vs.stride(0), vs.stride(1), vs.stride(2),
        block_size=tokens, head_size=dim, head_size_v=dim,
        PACKED_HEAD_PADDED=triton.next_power_of_2(dim // 2))
    return kc[0].numpy(), ks[0].numpy(), vc[0].numpy(), vs[0].numpy()


# --- the child process -------------------------------------------------------------------------

Case = tuple[str, dict[str, Any]]  # (operation, arguments: numpy arrays and numbers)


def _bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)


def _run(op: str, a: dict[str, Any]) -> Any:
    if op == "per_token_head":
        return _per_token_head(_bf16(a["key"]), _bf16(a["value"]), a["kind"])
    if op == "per_tensor_fp8_prestore":
        return _per_tensor_fp8_prestore(_bf16(a["key"]), _bf16(a["value"]), a["k_scale"],
                                        a["v_scale"])
    if op == "single_rht":
        return single_rht(torch.from_numpy(a["x"]), a["inverse"]).numpy()
    if op == "int4":
        return _int4(_bf16(a["key"]), _bf16(a["value"]))
    raise ValueError(op)


def run_cases(cases: dict[str, Case], tmp: Path) -> dict[str, Any]:
    """Run vLLM's kernels on ``cases`` in a child Python with ``TRITON_INTERPRET=1``."""
    src, dst = tmp / "cases.pkl", tmp / "results.pkl"
    src.write_bytes(pickle.dumps(cases))
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "import vllm_kernels; vllm_kernels.child(sys.argv[2], sys.argv[3])", here,
         str(src), str(dst)],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    results: dict[str, Any] = pickle.loads(dst.read_bytes())
    return results


def child(src: str, dst: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    cases: dict[str, Case] = pickle.loads(Path(src).read_bytes())
    Path(dst).write_bytes(pickle.dumps({k: _run(op, a) for k, (op, a) in cases.items()}))
