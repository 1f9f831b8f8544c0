"""Every flag the renderer emits exists in vLLM 0.33.0's argument parser, and every value is
one it accepts. Read from the pinned wheel's source with ast; vLLM is never imported."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import pytest
from op_samples import make_pool_plan

from kvtune.operator import api
from kvtune.operator.render.objects import RenderInput, render_pool

pytestmark = pytest.mark.vllm_source
VLLM_VERSION = "0.33.0"


def _root() -> Path:
    cache = Path(os.environ.get("KVTUNE_CACHE", Path.home() / ".cache" / "kvtune"))
    root = cache / f"vllm-src-{VLLM_VERSION}" / "vllm"
    if not (root / "engine" / "arg_utils.py").is_file():
        pytest.fail(f"{root} missing: run `python scripts/fetch_vllm_source.py` (or setup.sh)")
    return root


def _tree(rel: str) -> ast.Module:
    return ast.parse((_root() / rel).read_text())


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(cls: ast.ClassDef) -> dict[str, str]:
    """Annotated class attributes -> their annotation's source."""
    return {n.target.id: ast.unparse(n.annotation) for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _literal(tree: ast.Module, name: str) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            assert isinstance(value, ast.Subscript), f"{name} is not Literal[...]"
            elts = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
            return [e.value for e in elts if isinstance(e, ast.Constant)]
    raise AssertionError(f"{name} not found")


def _parser_flags() -> dict[str, str]:
    """Every ``--flag`` ``vllm serve`` accepts -> the annotation of its field ("" if explicit).

    vLLM builds most flags from dataclass fields (``EngineArgs``, the frontend args), adding
    ``--no-x`` for booleans (``argparse.BooleanOptionalAction``), and names a few explicitly
    (``add_argument("--block-size", ...)``)."""
    flags: dict[str, str] = {}
    sources = [("engine/arg_utils.py", "EngineArgs"),
               ("entrypoints/common/cli_args.py", "BaseFrontendArgs"),
               ("entrypoints/common/cli_args.py", "FrontendArgs")]
    for rel, cls_name in sources:
        for field, annotation in _fields(_class(_tree(rel), cls_name)).items():
            flag = "--" + field.replace("_", "-")
            flags[flag] = annotation
            if re.search(r"\bbool\b", annotation):
                flags["--no-" + field.replace("_", "-")] = annotation
    for rel in ("engine/arg_utils.py", "entrypoints/common/cli_args.py"):
        for node in ast.walk(_tree(rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"--[a-z0-9-]+", node.value):
                flags.setdefault(node.value, "")
    return flags


def _rendered_args() -> list[str]:
    """Args of pools covering every branch of KVPlan.vllm_args()."""
    plans = [
        make_pool_plan(),
        make_pool_plan(kv_cache_memory_bytes=80 * 2**30, enable_prefix_caching=False,
                       kv_cache_dtype="auto"),
        make_pool_plan(kv_offloading_size_gib=128.0, kv_offloading_backend="native",
                       attention_backend="FLASHINFER", kv_cache_dtype="nvfp4"),
    ]
    out: list[str] = []
    for i, pool_plan in enumerate(plans):
        objs = render_pool(RenderInput(
            name="x", namespace="y", pool="p", pool_plan=pool_plan.model_copy(
                update={"tensor_parallel": 2 ** i}),
            model_name="meta-llama/Llama-3.1-8B-Instruct", image="img", replicas=1,
            revision=1))
        dep: dict[str, Any] = next(o for o in objs if o["kind"] == "Deployment")
        out += dep["spec"]["template"]["spec"]["containers"][0]["args"][1:]  # [0]: the model
    return out


def test_every_rendered_flag_exists_in_the_parser() -> None:
    flags = _parser_flags()
    # Sanity: the parse found the flags this test is about, so a miss below is real.
    assert {"--block-size", "--kv-cache-dtype", "--port", "--host",
            "--tensor-parallel-size", "--enable-prefix-caching"} <= set(flags)
    rendered = {a.split("=", 1)[0] for a in _rendered_args()}
    assert rendered, "renderer emitted no flags"
    missing = sorted(rendered - set(flags))
    assert not missing, f"flags vLLM {VLLM_VERSION} does not know: {missing}"


def test_every_rendered_value_is_accepted() -> None:
    cache_tree = _tree("config/cache.py")
    dtypes = set(_literal(cache_tree, "CacheDType"))
    offload_backends = set(_literal(cache_tree, "KVOffloadingBackend"))
    backends = {t.id for n in _class(_tree("v1/attention/backends/registry.py"),
                                     "AttentionBackendEnum").body
                if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    checks = {
        "--kv-cache-dtype": lambda v: v in dtypes,
        "--kv-offloading-backend": lambda v: v in offload_backends,
        "--attention-backend": lambda v: v in backends,
        "--gpu-memory-utilization": lambda v: 0.0 < float(v) <= 1.0,
        "--kv-offloading-size": lambda v: float(v) > 0,
        "--port": lambda v: 0 < int(v) < 65536,
    }
    ints = {"--block-size", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
            "--tensor-parallel-size", "--kv-cache-memory-bytes"}
    checked = 0
    for arg in _rendered_args():
        if "=" not in arg:
            continue
        flag, value = arg.split("=", 1)
        if flag in checks:
            assert checks[flag](value), f"{flag}={value} is not accepted by vLLM {VLLM_VERSION}"
            checked += 1
        elif flag in ints:
            assert int(value) > 0, arg
            checked += 1
    assert checked >= 15


def test_api_enums_match_the_pinned_vllm() -> None:
    assert set(api.VLLM_KV_CACHE_DTYPES) == set(_literal(_tree("config/cache.py"),
                                                         "CacheDType"))
    backends = {t.id for n in _class(_tree("v1/attention/backends/registry.py"),
                                     "AttentionBackendEnum").body
                if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert set(api.VLLM_ATTENTION_BACKENDS) <= backends


# --- one rendering path (issue 14 item 2): plan -o json, -o args, the Deployment, the runtime --
_PLAN_CASES = [
    ["-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100"],
    ["-m", "meta-llama/Llama-3.3-70B-Instruct", "-g", "H200", "--tp", "2",
     "--weights-dtype", "fp8"],
    ["-m", "meta-llama/Llama-3.3-70B-Instruct", "-g", "H100", "--tp", "4",
     "--kv-offloading-size", "64", "--no-enable-prefix-caching"],
    ["-m", "Qwen/Qwen3-8B", "-g", "B200", "--kv-cache-memory-bytes", str(40 * 2**30),
     "--attention-backend", "FLASHINFER"],
    ["-m", "deepseek-ai/DeepSeek-V3", "-g", "H200", "--tp", "8"],
]


def _cli(args: list[str]) -> str:
    from click.testing import CliRunner

    from kvtune.cli.main import cli

    result = CliRunner().invoke(cli, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("case", _PLAN_CASES, ids=lambda c: " ".join(c[1::2][:3]))
def test_plan_json_args_deployment_and_runtime_render_the_same_flags(case: list[str]) -> None:
    import json

    from kvtune.operator.render.objects import plan_env_json
    from kvtune.runtime.decisions import Decision, build_command
    from kvtune.runtime.runtime_plan import parse_plan
    from kvtune.tuner.plan import PoolPlan

    doc = json.loads(_cli([*case, "-o", "json"]))
    from_json: list[str] = doc["vllm_args"]
    # `-o args`: "vllm serve MODEL \\\n  --flag \\\n  ..."
    words = _cli([*case, "-o", "args"]).replace("\\\n", " ").split()
    assert words[:3] == ["vllm", "serve", doc["model"]]
    from_args = words[3:]
    pool_plan = PoolPlan.model_validate({
        **{k: doc[k] for k in ("vllm_version", "plan", "expected")},
        "model_id": doc["model"], "gpu_class": doc["gpu_class"],
        "tensor_parallel": doc["tensor_parallel"], "reasons": doc["reasons"],
        "warnings": doc["warnings"]})
    objs = render_pool(RenderInput(
        name="x", namespace="y", pool="p", pool_plan=pool_plan, model_name=doc["model"],
        image="img", replicas=1, revision=1))
    dep: dict[str, Any] = next(o for o in objs if o["kind"] == "Deployment")
    container_args: list[str] = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    # The server's flags and the observability ones every pool gets (not the plan's).
    server = [a for a in container_args[1:] if a.split("=", 1)[0] in
              ("--host", "--port", "--served-model-name", "--kv-cache-metrics",
               "--kv-cache-metrics-sample")]
    from_deployment = [a for a in container_args[1:] if a not in server]
    runtime_plan = parse_plan(plan_env_json(pool_plan, plan_hash_="h", revision=1))
    decision = Decision.__new__(Decision)  # the node keeps the plan's memory knob
    object.__setattr__(decision, "gpu_memory_utilization", pool_plan.plan.gpu_memory_utilization)
    object.__setattr__(decision, "kv_cache_memory_bytes", pool_plan.plan.kv_cache_memory_bytes)
    command = build_command(runtime_plan, decision, container_args)
    from_runtime = [a for a in command[3:] if a not in server]

    assert from_json[0] == f"--tensor-parallel-size={doc['tensor_parallel']}"
    assert from_json == from_args == from_deployment, (from_json, from_args, from_deployment)
    assert sorted(from_runtime) == sorted(from_json), (from_runtime, from_json)
    parser = _parser_flags()
    unknown = [a for a in from_json if a.split("=", 1)[0] not in parser]
    assert not unknown, f"flags vLLM {VLLM_VERSION} does not know: {unknown}"


# --- issue 22 item 8: the SLO buckets flag parses in vLLM's own argument parser -------------

@pytest.mark.slow
def test_rendered_slo_buckets_parse_in_vllms_parser_and_validator() -> None:
    """``--custom-histogram-buckets`` as rendered for a 2 s TTFT and 80 ms TPOT target is
    parsed by vLLM 0.33's own ``EngineArgs`` parser into ``custom_histogram_buckets`` and
    passes ``ObservabilityConfig``'s validator; the families it sets are the ones vLLM's
    TTFT and TPOT histograms take their buckets from."""
    import json

    from vllm.config.observability import ObservabilityConfig
    from vllm.engine.arg_utils import get_kwargs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from kvtune.operator.prometheus import slo_buckets

    flag = slo_buckets.vllm_flag(2.0, 0.08)
    assert flag and flag[0].split("=", 1)[0] in _parser_flags()
    # EngineArgs.add_cli_args adds the flag exactly so (it needs a device for other groups):
    # observability_group.add_argument("--custom-histogram-buckets",
    #                                  **observability_kwargs["custom_histogram_buckets"])
    source = (_root() / "engine" / "arg_utils.py").read_text()
    assert re.search(r'add_argument\(\s*"--custom-histogram-buckets",\s*'
                     r'\*\*observability_kwargs\["custom_histogram_buckets"\]', source)
    parser = FlexibleArgumentParser()
    parser.add_argument(slo_buckets.FLAG,
                        **get_kwargs(ObservabilityConfig)["custom_histogram_buckets"])
    ns = parser.parse_args(flag)
    parsed = ns.custom_histogram_buckets
    assert parsed == json.loads(flag[0].split("=", 1)[1])
    assert 2.0 in parsed["time_to_first_token"] and 0.08 in parsed["inter_token_latency"]
    ObservabilityConfig(custom_histogram_buckets=parsed)  # raises on a refused list
    loggers = (_root() / "v1" / "metrics" / "loggers.py").read_text()
    for family, metric in (("time_to_first_token", "vllm:time_to_first_token_seconds"),
                           ("inter_token_latency", "vllm:request_time_per_output_token_seconds")):
        at = loggers.index(f'name="{metric}"')
        assert f"buckets={family}_buckets" in loggers[at:at + 400], (family, metric)


# --- issue 27: --kv-cache-metrics parses in vLLM's own argument parser -----------------------

@pytest.mark.slow
@pytest.mark.vllm
def test_rendered_kv_cache_metrics_flags_parse_in_vllms_parser() -> None:
    """The residency flags every pool renders are EngineArgs' ``kv_cache_metrics`` and
    ``kv_cache_metrics_sample``: vLLM 0.33's own parser turns them into an
    ``ObservabilityConfig`` with the metrics on at the rendered sample rate."""
    from vllm.config.observability import ObservabilityConfig
    from vllm.engine.arg_utils import get_kwargs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from kvtune.operator.prometheus import reuse_window

    flags = reuse_window.vllm_flags()
    known = _parser_flags()
    assert all(f.split("=", 1)[0] in known for f in flags)
    source = (_root() / "engine" / "arg_utils.py").read_text()
    for name in ("kv_cache_metrics", "kv_cache_metrics_sample"):
        flag = "--" + name.replace("_", "-")
        assert re.search(rf'add_argument\(\s*"{flag}",\s*'
                         rf'\*\*observability_kwargs\["{name}"\]', source), name
    kwargs = get_kwargs(ObservabilityConfig)
    parser = FlexibleArgumentParser()
    parser.add_argument("--kv-cache-metrics", **kwargs["kv_cache_metrics"])
    parser.add_argument("--kv-cache-metrics-sample", **kwargs["kv_cache_metrics_sample"])
    ns = parser.parse_args(flags)
    assert ns.kv_cache_metrics is True
    assert ns.kv_cache_metrics_sample == reuse_window.KV_CACHE_METRICS_SAMPLE
    config = ObservabilityConfig(kv_cache_metrics=ns.kv_cache_metrics,
                                 kv_cache_metrics_sample=ns.kv_cache_metrics_sample)
    assert config.kv_cache_metrics and config.kv_cache_metrics_sample == 0.01
    # Without the flag the metrics are off (vLLM's default): the render is what turns them on.
    assert parser.parse_args([]).kv_cache_metrics is False
