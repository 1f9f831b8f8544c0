"""A fixed corpus of plans and rendered Deployments, printed as one text, to check that a change
meant to keep behaviour (a move, a refactor) really does.

    .venv/bin/python scripts/plan_corpus.py > /tmp/before.txt      # on the old code
    .venv/bin/python scripts/plan_corpus.py > /tmp/after.txt       # on the new code
    diff /tmp/before.txt /tmp/after.txt && echo identical

It runs the real CLI (`kvtune plan -o json|args|yaml`, in process) over the cases below —
catalog models on every GPU class, pins of every knob, tensor parallelism, weights dtypes,
workload presets, SLOs, a shipped Azure trace and a small Mooncake trace written here, and
refusals (their one-line error and exit code) — and renders the Deployment, Service and PDB of
every pool of every example in examples/ the way the operator does (plan -> render), without a
cluster. It is a tool, not a golden test: plans change on purpose, and then the diff shows how.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
AZURE = REPO / "examples" / "traces" / "AzureLLMInferenceTrace_conv.csv"

L8 = "meta-llama/Llama-3.1-8B-Instruct"
L70 = "meta-llama/Llama-3.3-70B-Instruct"

# (name, arguments after `kvtune plan`)
CASES: list[tuple[str, list[str]]] = []


def _case(name: str, *args: str) -> None:
    CASES.append((name, list(args)))


# Every catalog model on one GPU class that holds it at its natural TP.
for _model, _gpu, _tp in [
    ("Qwen/Qwen2.5-72B-Instruct", "H200", "2"),
    ("Qwen/Qwen2.5-7B-Instruct", "H100", "1"),
    ("Qwen/Qwen3-235B-A22B", "H200", "4"),
    ("Qwen/Qwen3-32B", "H100", "1"),
    ("Qwen/Qwen3-8B", "H100", "1"),
    ("deepseek-ai/DeepSeek-R1", "B200", "8"),
    ("deepseek-ai/DeepSeek-V2-Lite", "H100", "1"),
    ("deepseek-ai/DeepSeek-V3", "H200", "8"),
    ("google/gemma-2-27b-it", "H100", "1"),
    ("google/gemma-3-27b-it", "H200", "1"),
    ("meta-llama/Llama-3.1-70B-Instruct", "H200", "2"),
    (L8, "H100", "1"),
    (L70, "H200", "2"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "H200", "2"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "H100", "1"),
    ("mistralai/Mistral-Small-24B-Instruct-2501", "H100", "1"),
]:
    _case(f"catalog {_model} {_gpu} tp{_tp}", "-m", _model, "-g", _gpu, "--tp", _tp)

# One model on every GPU class (names as `plan --list` prints them, and a label value).
for _gpu in ["H100", "H100-NVL", "H200", "B200", "A100-80GB", "L40S", "NVIDIA-H200"]:
    _case(f"gpu {_gpu}", "-m", L8, "-g", _gpu)

# Tensor parallelism.
for _tp in ["1", "2", "4", "8"]:
    _case(f"tp {_tp}", "-m", L70, "-g", "H100", "--tp", _tp, "--context-tokens", "8192")

# Weights dtypes.
for _w in ["auto", "bf16", "fp8", "int8", "int4", "awq", "gptq"]:
    _case(f"weights {_w}", "-m", L70, "-g", "H200", "--tp", "2", "--weights-dtype", _w)

# Workload presets, alone and rescaled.
for _wl in ["chat", "rag", "agent", "multi-tenant", "long-context"]:
    _case(f"workload {_wl}", "-m", L8, "-g", "H200", "--workload", _wl)
_case("workload rag 32k", "-m", L8, "-g", "H200", "--workload", "rag", "--context-tokens", "32768")
_case("the README example", "-m", L70, "-g", "H200", "--weights-dtype", "fp8",
      "--context-tokens", "4096", "--lowest-kv-precision", "int4")

# Pins: one per knob, and all at once.
_case("pin kv-cache-dtype auto", "-m", L8, "-g", "H100", "--kv-cache-dtype", "auto")
_case("pin kv-cache-dtype fp8_e5m2", "-m", L8, "-g", "H100", "--kv-cache-dtype", "fp8_e5m2")
_case("pin block-size 32", "-m", L8, "-g", "H100", "--block-size", "32")
_case("pin block-size 128", "-m", L8, "-g", "B200", "--block-size", "128")
_case("pin gpu-memory-utilization", "-m", L8, "-g", "H100", "--gpu-memory-utilization", "0.85")
_case("pin kv-cache-memory-bytes", "-m", L8, "-g", "H100",
      "--kv-cache-memory-bytes", str(20 * 2**30))
_case("pin max-model-len", "-m", L8, "-g", "H100", "--max-model-len", "16384")
_case("pin max-num-seqs", "-m", L8, "-g", "H100", "--max-num-seqs", "64")
_case("pin max-num-batched-tokens", "-m", L8, "-g", "H100", "--max-num-batched-tokens", "4096")
_case("pin prefix caching off", "-m", L8, "-g", "H100", "--no-enable-prefix-caching")
_case("pin prefix caching on", "-m", L8, "-g", "H100", "--enable-prefix-caching")
_case("pin kv-offloading-size", "-m", L8, "-g", "H100", "--kv-offloading-size", "32")
_case("pin attention-backend", "-m", L8, "-g", "H100", "--attention-backend", "FLASHINFER")
_case("pin all", "-m", L8, "-g", "H200", "--kv-cache-dtype", "fp8", "--block-size", "16",
      "--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--max-num-seqs", "128",
      "--max-num-batched-tokens", "8192", "--enable-prefix-caching",
      "--attention-backend", "FLASH_ATTN")

# Policy: SLOs, precision floor, targets, CPU offload budget.
_case("slo tight", "-m", L70, "-g", "H200", "--weights-dtype", "fp8", "--ttft-p95", "0.5",
      "--tpot-p95", "0.03")
_case("slo loose", "-m", L8, "-g", "H100", "--ttft-p95", "5", "--tpot-p95", "0.2")
_case("lowest precision bf16", "-m", L70, "-g", "H200", "--tp", "2",
      "--lowest-kv-precision", "bf16")
_case("lowest precision fp4", "-m", L70, "-g", "B200", "--lowest-kv-precision", "fp4")
_case("target sequences", "-m", L70, "-g", "H200", "--weights-dtype", "fp8",
      "--target-sequences", "200")
_case("min max-model-len", "-m", L8, "-g", "H100", "--min-max-model-len", "65536")
_case("cpu offload budget", "-m", L8, "-g", "H100", "--cpu-offload-gib", "64",
      "--workload", "long-context")

# Traces: the shipped Azure trace, and a small Mooncake trace (prefix ids) written below.
_case("trace azure", "-m", L8, "-g", "H100", "--trace", str(AZURE))
_case("trace azure 70b", "-m", L70, "-g", "H200", "--tp", "2", "--trace", str(AZURE))
_case("trace mooncake", "-m", L8, "-g", "H200", "--trace", "{MOONCAKE}")

# Other output formats.
_case("args tp1", "-m", L8, "-g", "H100", "-o", "args")
_case("args tp4", "-m", L70, "-g", "H100", "--tp", "4", "-o", "args")
_case("yaml", "-m", L8, "-g", "H200", "--workload", "agent", "-o", "yaml")

# Refusals: the one-line error and the exit code.
_case("refuse unknown model", "-m", "no-such/model", "-g", "H100")
_case("refuse unknown gpu", "-m", L8, "-g", "Z9000")
_case("refuse does not fit", "-m", "deepseek-ai/DeepSeek-V3", "-g", "H100")
_case("refuse bad block size", "-m", L8, "-g", "H100", "--block-size", "7")
_case("refuse bad kv dtype", "-m", L8, "-g", "H100", "--kv-cache-dtype", "fp3")
_case("refuse trace with workload", "-m", L8, "-g", "H100", "--trace", str(AZURE),
      "--workload", "chat")


def _mooncake_lines() -> str:
    """Deterministic Mooncake-format requests: 3 system prompts shared across 60 requests."""
    rows = []
    for i in range(60):
        shared = [1000 * (i % 3) + k for k in range(4)]
        own = [100_000 + 10 * i + k for k in range(1 + i % 5)]
        rows.append({"timestamp": 500 * i, "input_length": 512 * (len(shared) + len(own)) - 100,
                     "output_length": 50 + 7 * (i % 11), "hash_ids": shared + own})
    return "".join(json.dumps(r) + "\n" for r in rows)


def run_plans(out: list[str]) -> None:
    from kvtune.cli.main import cli

    runner = CliRunner()
    with tempfile.TemporaryDirectory() as tmp:
        mooncake = Path(tmp) / "mooncake.jsonl"
        mooncake.write_text(_mooncake_lines())
        for name, args in CASES:
            args = [str(mooncake) if a == "{MOONCAKE}" else a for a in args]
            if "-o" not in args:
                args = [*args, "-o", "json"]
            result = runner.invoke(cli, ["plan", *args], catch_exceptions=True)
            text = result.stdout.replace(str(mooncake), "MOONCAKE").replace(str(REPO), "REPO")
            out.append(f"### plan {name}: exit {result.exit_code}\n{text}")
            if result.exit_code != 0:
                crash = result.exception
                kind = "" if crash is None or isinstance(crash, SystemExit) else (
                    f" TRACEBACK {type(crash).__name__}: {crash}")
                out.append(f"--- stderr{kind}\n{result.stderr}")


def run_examples(out: list[str]) -> None:
    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.api.workloads import declared_profile
    from kvtune.operator.render.objects import RenderInput, object_name, plan_hash, render_pool
    from kvtune.operator.rollout import plan as rec  # the rollout's plan stage

    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kvtune.io/corpus", "operator": "Exists"}]}]}}
    for path in sorted((REPO / "examples").glob("*.yaml")):
        doc: dict[str, Any] = yaml.safe_load(path.read_text())
        meta = doc["metadata"]
        spec = InferenceDeploymentSpec.model_validate(doc["spec"])
        model = rec.resolve_model(spec, meta["namespace"], None)
        profile, policy = declared_profile(spec.workload), rec.policy_for(spec)
        for pool in spec.pools:
            pool_plan = rec.plan_one_pool(spec, pool, model, profile, policy)
            inp = RenderInput(
                name=meta["name"], namespace=meta["namespace"], pool=pool.pool_name,
                pool_plan=pool_plan, model_name=spec.model.name, image=spec.runtime.image,
                replicas=pool.replicas, revision=1, entrypoint=spec.runtime.entrypoint,
                node_selector=dict(pool.node_selector or {}),
                tolerations=[t.model_dump(by_alias=True, exclude_none=True)
                             for t in pool.tolerations or []],
                affinity=affinity,
            )
            objects = render_pool(inp)
            out.append(f"### example {path.name} pool {pool.pool_name} "
                       f"({object_name(meta['name'], pool.pool_name)}, plan hash "
                       f"{plan_hash(pool_plan, spec.runtime.image)})\n"
                       + yaml.safe_dump_all(objects, sort_keys=True))


def main() -> int:
    out: list[str] = []
    run_plans(out)
    run_examples(out)
    sys.stdout.write("\n".join(out))
    print(f"# {len(CASES)} plan cases, {sum(o.startswith('### example') for o in out)} "
          f"example pools", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
