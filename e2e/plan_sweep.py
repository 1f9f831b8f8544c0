"""The plan sweep: ``kvtune plan`` over models x GPU classes x tensor parallel x weights dtypes.
Every case must end one of two ways: a plan that passes vLLM's pre-flight with flags the pinned
vLLM's own argument parser accepts, or a refusal (``KVTuneError``) with its reason. Anything
else (a traceback, a plan vLLM would not start, a flag or value vLLM does not know) is a bug.

vLLM's command line is read from the pinned wheel's source with ``ast`` (as the contract tests
do; vLLM is never imported): the flags ``vllm serve`` accepts (``EngineArgs`` and the frontend
args' fields, ``--no-`` forms of booleans, explicit ``add_argument`` names) and the literal
value sets of the ones kvtune renders.
Used by tests/tuner/planner/test_tuner_plan_sweep.py (a sample) and bench/plan_sweep.py (all).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kvtune.tuner.errors import InvalidInput, KVTuneError, NoFeasiblePlan, UnknownName
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.facts.weights import weight_bits
from kvtune.tuner.planner.planning import PlanRequest, plan_pool, preflight
from kvtune.tuner.planner.presets import preset_profile

TENSOR_PARALLEL = (1, 2, 4, 8)
WEIGHTS_DTYPES = ("auto", "bfloat16", "float16", "fp8", "int8", "int4", "awq", "gptq")
VLLM_VERSION = "0.33.0"


def vllm_source_root(version: str = VLLM_VERSION) -> Path:
    cache = Path(os.environ.get("KVTUNE_CACHE", Path.home() / ".cache" / "kvtune"))
    return cache / f"vllm-src-{version}" / "vllm"


@dataclass
class VllmCli:
    """What the pinned ``vllm serve`` accepts, from its source."""

    root: Path = field(default_factory=vllm_source_root)

    def _tree(self, rel: str) -> ast.Module:
        return ast.parse((self.root / rel).read_text(encoding="utf-8"))

    def _literal(self, rel: str, name: str) -> set[str]:
        for node in self._tree(rel).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                value = node.value
                assert isinstance(value, ast.Subscript), f"{name} is not Literal[...]"
                elts = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
                return {e.value for e in elts
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        raise LookupError(f"{name} not found in {rel}")

    @cached_property
    def flags(self) -> set[str]:
        flags: set[str] = set()
        for rel, cls_name in (("engine/arg_utils.py", "EngineArgs"),
                              ("entrypoints/common/cli_args.py", "BaseFrontendArgs"),
                              ("entrypoints/common/cli_args.py", "FrontendArgs")):
            cls = next(n for n in ast.walk(self._tree(rel))
                       if isinstance(n, ast.ClassDef) and n.name == cls_name)
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    flag = "--" + node.target.id.replace("_", "-")
                    flags.add(flag)
                    if re.search(r"\bbool\b", ast.unparse(node.annotation)):
                        flags.add("--no-" + flag[2:])
        for rel in ("engine/arg_utils.py", "entrypoints/common/cli_args.py"):
            for found in ast.walk(self._tree(rel)):
                if isinstance(found, ast.Constant) and isinstance(found.value, str) \
                        and re.fullmatch(r"--[a-z0-9-]+", found.value):
                    flags.add(found.value)
        return flags

    @cached_property
    def value_checks(self) -> dict[str, Callable[[str], bool]]:
        kv_dtypes = self._literal("config/cache.py", "CacheDType")
        offload = self._literal("config/cache.py", "KVOffloadingBackend")
        quant = self._literal("model_executor/layers/quantization/__init__.py",
                              "QuantizationMethods")
        dtypes = self._literal("config/model.py", "ModelDType")
        backends = {t.id for n in next(
            n for n in ast.walk(self._tree("v1/attention/backends/registry.py"))
            if isinstance(n, ast.ClassDef) and n.name == "AttentionBackendEnum").body
            if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}

        def positive_int(v: str) -> bool:
            return v.isdigit() and int(v) > 0

        return {
            "--kv-cache-dtype": kv_dtypes.__contains__,
            "--kv-offloading-backend": offload.__contains__,
            "--attention-backend": backends.__contains__,
            "--quantization": quant.__contains__,
            "--dtype": dtypes.__contains__,
            "--gpu-memory-utilization": lambda v: 0.0 < float(v) <= 1.0,
            "--kv-offloading-size": lambda v: float(v) > 0,
            "--block-size": positive_int, "--max-model-len": positive_int,
            "--max-num-seqs": positive_int, "--max-num-batched-tokens": positive_int,
            "--tensor-parallel-size": positive_int, "--kv-cache-memory-bytes": positive_int,
        }

    def problems(self, args: list[str]) -> list[str]:
        """Each argument vLLM's parser (or its config validation of the value) would refuse."""
        out = []
        for arg in args:
            flag, _, value = arg.partition("=")
            if flag not in self.flags:
                out.append(f"{arg}: vLLM {VLLM_VERSION} has no flag {flag}")
            elif value and flag in self.value_checks and not self.value_checks[flag](value):
                out.append(f"{arg}: vLLM {VLLM_VERSION} does not accept {value!r} for {flag}")
        return out


@dataclass(frozen=True)
class Outcome:
    model: str
    gpu: str
    tensor_parallel: int
    weights_dtype: str
    kind: str  # "planned", "refused" or "bug"
    reason: str = ""  # refusal category or the bug
    detail: str = ""


def refusal_category(exc: KVTuneError) -> str:
    """A short name for the reason, for counting."""
    if isinstance(exc, NoFeasiblePlan):
        return "does not fit"
    if isinstance(exc, UnknownName):
        return f"unknown {exc.field}"
    if isinstance(exc, InvalidInput):
        return f"invalid {exc.field}"
    return type(exc).__name__


def run_case(cli: VllmCli, model_id: str, gpu_name: str, tensor_parallel: int,
             weights_dtype: str) -> Outcome:
    """One ``kvtune plan`` (the planner the CLI and the operator call) and its verdict."""
    case = (model_id, gpu_name, tensor_parallel, weights_dtype)
    try:
        request = PlanRequest(
            model=get_model(model_id), gpu=get_gpu_class(gpu_name),
            tensor_parallel=tensor_parallel, weights_dtype=weights_dtype,
            profile=preset_profile("chat"))
        pool = plan_pool(request)
    except KVTuneError as exc:
        return Outcome(*case, kind="refused", reason=refusal_category(exc), detail=str(exc))
    except Exception as exc:  # a traceback a user would see
        return Outcome(*case, kind="bug", reason="exception", detail=f"{type(exc).__name__}: "
                       f"{exc}")
    ok, need, available = preflight(request, pool.plan)
    if not ok:
        return Outcome(*case, kind="bug", reason="fails vLLM's pre-flight",
                       detail=f"one max-model-len request needs {need} B of KV, {available} B "
                       "available")
    args = [f"--tensor-parallel-size={pool.tensor_parallel}", *pool.plan.vllm_args()]
    rejected = cli.problems(args)
    if rejected:
        return Outcome(*case, kind="bug", reason="flags vLLM refuses", detail="; ".join(rejected))
    mismatch = _weights_mismatch(request, args)
    if mismatch:
        return Outcome(*case, kind="bug", reason="weights not loaded as sized", detail=mismatch)
    unsaid = _warning_that_says_nothing(pool.warnings)
    if unsaid:
        return Outcome(*case, kind="bug", reason="a warning that says nothing", detail=unsaid)
    return Outcome(*case, kind="planned")


_LOWERED = re.compile(r"lowered from (\d+) to (\d+)")


def _warning_that_says_nothing(warnings: Sequence[str]) -> str:
    """A warning that a value was lowered must name a lower value."""
    for w in warnings:
        m = _LOWERED.search(w)
        if m and int(m.group(2)) >= int(m.group(1)):
            return w
    return ""


def _weights_mismatch(request: PlanRequest, args: list[str]) -> str:
    """Whether vLLM, given these flags, loads the weights at the width the plan sized them:
    a 16-bit checkpoint stays 16-bit without --quantization; a quantized checkpoint's own
    method is detected by vLLM and any other --quantization is an error at start."""
    flag = next((a.split("=", 1)[1] for a in args if a.startswith("--quantization=")), None)
    bits = weight_bits(request.model, request.weights_dtype)
    checkpoint = request.model.quantization
    if checkpoint is None and bits < 16 and flag is None:
        return (f"weights sized at {bits} bits, but without --quantization vLLM loads this "
                f"{request.model.torch_dtype} checkpoint at 16 bits")
    if checkpoint is not None and checkpoint.config_file is not None and flag != \
            checkpoint.method:
        return (f"{checkpoint.method} settings only in {checkpoint.config_file}: vLLM reads "
                f"them only with --quantization={checkpoint.method}, not {flag}")
    if checkpoint is not None and checkpoint.config_file is None and flag is not None:
        return (f"--quantization={flag} on a {checkpoint.method} checkpoint: vLLM refuses a "
                "method other than the checkpoint's")
    return ""
