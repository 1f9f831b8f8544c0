"""The runtime entrypoint's decisions, through a fake NVML boundary (no GPU here)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvtune.runtime import decisions, gpus, report
from kvtune.runtime.__main__ import EXIT_BAD_PLAN, EXIT_REFUSED, run
from kvtune.runtime.runtime_plan import parse_plan
from kvtune.tuner.plan import ExpectedFigures, KVPlan, PoolPlan

GIB = 1024**3
MIB = 1024**2

H100 = ("NVIDIA H100 80GB HBM3", 81559 * MIB, (9, 0))
H200 = ("NVIDIA H200", 143771 * MIB, (9, 0))
B200 = ("NVIDIA B200", 183359 * MIB, (10, 0))


def pool_plan(gpu_class: str = "H200", tp: int = 1, util: float = 0.92,
              kv_memory: int | None = None, max_model_len: int = 32768) -> PoolPlan:
    total = {"H100": H100, "H200": H200, "B200": B200}[gpu_class][1]
    non_kv = 40 * GIB
    kv_bytes = int(total * util) - non_kv
    per_token = 160 * 1024  # 160 KiB per token per GPU: a 70B-class GQA model in fp8 at TP 2
    return PoolPlan(
        model_id="meta-llama/Llama-3.3-70B-Instruct",
        gpu_class=gpu_class,
        tensor_parallel=tp,
        vllm_version="0.33.0",
        plan=KVPlan(block_size=32, kv_cache_dtype="fp8", gpu_memory_utilization=util,
                    kv_cache_memory_bytes=kv_memory, max_model_len=max_model_len,
                    max_num_seqs=128, max_num_batched_tokens=8192, enable_prefix_caching=True),
        expected=ExpectedFigures(
            kv_bytes_per_token=per_token, kv_cache_bytes=kv_bytes,
            kv_cache_tokens=kv_bytes // per_token // 32 * 32,
            num_gpu_blocks=kv_bytes // per_token // 32,
            weights_bytes_per_gpu=35 * GIB, non_kv_bytes_per_gpu=non_kv,
            concurrent_sequences=40, concurrent_sequences_context_tokens=10000),
        reasons=(),
    )


def gpu(spec: tuple[str, int, tuple[int, int]], free_bytes: int | None = None,
        index: int = 0) -> gpus.GpuInfo:
    name, total, cc = spec
    return gpus.GpuInfo(index=index, name=name, total_bytes=total,
                        free_bytes=total - 600 * MIB if free_bytes is None else free_bytes,
                        compute_capability=cc)


# --- the fake NVML boundary: the same calls read_gpus() makes on pynvml ----------------------

class FakeNvml:
    def __init__(self, devices: list[tuple[str, int, int, tuple[int, int]]]) -> None:
        self.devices = devices
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.devices[h][0].encode()  # old bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        _, total, free, _ = self.devices[h]
        return SimpleNamespace(total=total, free=free, used=total - free)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self.devices[h][3]

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        raise RuntimeError("NVMLError_NotSupported")


def test_read_gpus_through_the_nvml_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeNvml([("NVIDIA H200", 150 * GIB, 140 * GIB, (9, 0)),
                     ("NVIDIA H200", 150 * GIB, 100 * GIB, (9, 0))])
    found = gpus.read_gpus(fake)
    assert [(g.index, g.name, g.free_bytes, g.compute_capability) for g in found] == [
        (0, "NVIDIA H200", 140 * GIB, (9, 0)), (1, "NVIDIA H200", 100 * GIB, (9, 0))]
    assert fake.calls == ["init", "shutdown"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g.index for g in gpus.read_gpus(fake)] == [1]


@pytest.mark.parametrize(("name", "cls"), [
    # NVML product names as nvmlDeviceGetName returns them on the real parts.
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200-NVL"), ("NVIDIA GH200 480GB", None), ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"), ("NVIDIA B300 SXM6 AC", "B300"), ("NVIDIA L4", "L4"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA H20", "H20"), ("NVIDIA H800", "H800"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_gpu_class_from_the_nvml_product_name(name: str, cls: str | None) -> None:
    assert gpus.class_of(gpu((name, 80 * GIB, (9, 0)))) == cls


@pytest.mark.parametrize(("planned", "nvml", "mib"), [
    ("H100-NVL", "NVIDIA H100 NVL", 95830), ("H200-NVL", "NVIDIA H200 NVL", 143771)])
def test_nvl_parts_run_their_own_plans(planned: str, nvml: str, mib: int) -> None:
    # The plan's class name against the real NVML product name (before: refused, because
    # "NVIDIA H100 NVL" was classed as H100 and no NVL class was known to the runtime).
    plan = parse_plan(pool_plan("H200").model_copy(
        update={"gpu_class": planned}).model_dump_json())
    assert decisions.check_gpus(plan, [gpu((nvml, mib * MIB, (9, 0)))])
    with pytest.raises(decisions.PlanDoesNotFit, match=f"made for {planned.upper()}"):
        decisions.check_gpus(plan, [gpu(H100)])


# --- the decision table ---------------------------------------------------------------------

def test_right_gpu_keeps_the_plan() -> None:
    plan = parse_plan(pool_plan("H200").model_dump_json())
    d = decisions.decide(plan, [gpu(H200)])
    assert not d.recomputed
    assert d.gpu_memory_utilization == 0.92
    assert d.kv_cache_bytes == pytest.approx(plan.expected.kv_cache_bytes, abs=1)
    assert d.notes == ()


@pytest.mark.parametrize(("planned", "found", "reason", "words"), [
    ("H200", H100, "WrongGpuClass", ["made for H200", "NVIDIA H100 80GB HBM3"]),
    ("B200", H200, "WrongGpuClass", ["made for B200", "'NVIDIA H200'"]),
    ("H100", ("NVIDIA H100 80GB HBM3", 81559 * MIB, (8, 0)), "WrongComputeCapability",
     ["SM 9.x", "SM 8.0"]),
])
def test_wrong_gpu_refuses_saying_expected_and_found(
    planned: str, found: Any, reason: str, words: list[str]
) -> None:
    plan = parse_plan(pool_plan(planned).model_dump_json())
    with pytest.raises(decisions.PlanDoesNotFit) as err:
        decisions.decide(plan, [gpu(found)])
    assert err.value.reason == reason
    for word in words:
        assert word in err.value.message


def test_too_few_gpus_for_tensor_parallel() -> None:
    plan = parse_plan(pool_plan("H100", tp=2).model_dump_json())
    with pytest.raises(decisions.PlanDoesNotFit, match=r"needs 2 x H100 .* found 1 visible"):
        decisions.decide(plan, [gpu(H100)])


def test_less_free_memory_lowers_the_fraction_to_what_is_free() -> None:
    # A shared GPU: another process holds 20 GiB of the H200's 140.4 GiB.
    plan = parse_plan(pool_plan("H200").model_dump_json())
    free = H200[1] - 20 * GIB
    d = decisions.decide(plan, [gpu(H200, free_bytes=free)])
    assert d.recomputed
    expected_util = int((free - GIB) / H200[1] * 1000) / 1000
    assert d.gpu_memory_utilization == pytest.approx(expected_util)
    assert d.gpu_memory_utilization < 0.92
    # vLLM's check (free >= ceil(total * util)) now passes with the context reserve kept.
    assert H200[1] * d.gpu_memory_utilization <= free - GIB
    assert d.kv_cache_tokens < d.planned_kv_cache_tokens
    assert any("lowered from 0.92" in n for n in d.notes)


def test_tightest_rank_decides_under_tensor_parallel() -> None:
    plan = parse_plan(pool_plan("H100", tp=2, util=0.9).model_dump_json())
    d = decisions.decide(plan, [gpu(H100, index=0), gpu(H100, free_bytes=70 * GIB, index=1)])
    assert d.gpu_memory_utilization == pytest.approx(int(69 * GIB / H100[1] * 1000) / 1000)


def test_kv_cache_memory_bytes_is_shrunk_instead_of_the_fraction() -> None:
    plan = parse_plan(pool_plan("H100", kv_memory=30 * GIB, util=0.9).model_dump_json())
    d = decisions.decide(plan, [gpu(H100, free_bytes=60 * GIB)])
    assert d.kv_cache_memory_bytes == 60 * GIB - GIB - 40 * GIB
    cmd = decisions.build_command(plan, d, [])
    assert f"--kv-cache-memory-bytes={19 * GIB}" in cmd
    assert not any(a.startswith("--gpu-memory-utilization") for a in cmd)


def test_cannot_fit_refuses_with_the_figures_and_the_fix() -> None:
    # A MIG 3g.40gb slice: 40 GiB cannot hold 40 GiB of non-KV plus one 32k sequence.
    plan = parse_plan(pool_plan("H100").model_dump_json())
    mig = gpus.GpuInfo(0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40 * GIB, 39 * GIB, (9, 0),
                       mig=True)
    with pytest.raises(decisions.PlanDoesNotFit) as err:
        decisions.decide(plan, [mig])
    msg = err.value.message
    assert err.value.reason == "InsufficientGpuMemory"
    assert ("needs 45.0 GiB per GPU (non-KV 40.0 GiB + KV for one 32768-token sequence "
            "5.0 GiB)") in msg
    assert "MIG" in msg and "lower max-model-len" in msg


def test_command_has_the_plan_flags_and_refuses_overrides() -> None:
    pool = pool_plan("H200")
    plan = parse_plan(pool.model_dump_json())
    d = decisions.decide(plan, [gpu(H200)])
    cmd = decisions.build_command(plan, d, ["--port=8000", "--served-model-name=bot"])
    assert cmd[:5] == ["vllm", "serve", pool.model_id, "--port=8000", "--served-model-name=bot"]
    assert cmd[5:] == ["--tensor-parallel-size=1", *pool.plan.vllm_args()]
    with pytest.raises(decisions.PlanDoesNotFit, match="'--max-model-len=4096' disagrees"):
        decisions.build_command(plan, d, ["--max-model-len=4096"])
    with pytest.raises(decisions.PlanDoesNotFit, match="--no-enable-prefix-caching"):
        decisions.build_command(plan, d, ["--no-enable-prefix-caching"])


def test_command_from_the_operators_rendered_args_replaces_only_the_memory_flag() -> None:
    from kvtune.operator.render.objects import RenderInput, vllm_args

    pool = pool_plan("H200")
    rendered = vllm_args(RenderInput(name="bot", namespace="llm", pool="h200", pool_plan=pool,
                                     model_name=pool.model_id, image="i", replicas=1,
                                     revision=1, ttft_slo_seconds=2.0, tpot_slo_seconds=0.08))
    # The SLO buckets flag (operator/prometheus/slo_buckets.py) passes through to vllm unchanged.
    assert any(a.startswith("--custom-histogram-buckets=") for a in rendered)
    plan = parse_plan(pool.model_dump_json())
    d = decisions.decide(plan, [gpu(H200, free_bytes=100 * GIB)])
    cmd = decisions.build_command(plan, d, rendered)
    util_flag = f"--gpu-memory-utilization={d.gpu_memory_utilization:.4g}"
    assert cmd[2:] == [a if not a.startswith("--gpu-memory-utilization") else util_flag
                       for a in rendered]
    assert d.gpu_memory_utilization < 0.92
    # "--flag value" spelling is understood too.
    spaced = [pool.model_id, "--max-model-len", "32768", "--block-size", "32"]
    assert decisions.build_command(plan, d, spaced)[3:5] == [
        "--max-model-len=32768", "--block-size=32"]


@pytest.mark.parametrize("kv_memory", [None, 12 * GIB])
@pytest.mark.parametrize("offload", [None, 64.0])
@pytest.mark.parametrize("weights", [{}, {"quantization": "fp8_per_tensor"},
                                     {"dtype": "float16", "allow_deprecated_quantization": True}])
def test_runtime_flags_agree_with_the_tuner(kv_memory: int | None, offload: float | None,
                                            weights: dict[str, Any]) -> None:
    # The weights flags too: without them the pod would load 16-bit weights the plan sized
    # at 8 bits.
    knobs = KVPlan(block_size=16, kv_cache_dtype="auto", gpu_memory_utilization=0.875,
                   kv_cache_memory_bytes=kv_memory, max_model_len=8192, max_num_seqs=64,
                   max_num_batched_tokens=4096, enable_prefix_caching=False,
                   kv_offloading_size_gib=offload,
                   kv_offloading_backend="native" if offload else None,
                   attention_backend="FLASHINFER", **weights)
    pool = pool_plan().model_copy(update={"plan": knobs})
    assert parse_plan(pool.model_dump_json()).plan.vllm_args() == knobs.vllm_args()


def test_plan_in_camel_case_is_accepted() -> None:
    camel = {"modelId": "m", "gpuClass": "H100", "tensorParallel": 1,
             "plan": {"blockSize": 16, "kvCacheDtype": "fp8", "gpuMemoryUtilization": 0.9,
                      "maxModelLen": 4096, "maxNumSeqs": 8, "maxNumBatchedTokens": 4096,
                      "enablePrefixCaching": True},
             "expected": {"kvBytesPerToken": 1024, "kvCacheBytes": 1, "kvCacheTokens": 1,
                          "nonKvBytesPerGpu": GIB, "futureField": 1}}
    assert parse_plan(json.dumps(camel)).plan.max_model_len == 4096


# --- the whole entrypoint: refuse, report, exec ---------------------------------------------

def test_entrypoint_execs_vllm_and_reports_to_a_file(tmp_path: Path) -> None:
    execs: list[tuple[str, list[str]]] = []
    env = {"KVTUNE_PLAN": pool_plan("H200").model_dump_json(),
           "KVTUNE_STATUS_FILE": str(tmp_path / "report.json")}
    rc = run(["--port=8000"], env, [gpu(H200, free_bytes=100 * GIB)],
             exec_fn=lambda f, a: execs.append((f, a)))
    assert rc == 0
    assert execs and execs[0][0] == "vllm" and execs[0][1][3] == "--port=8000"
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["started"] is True and written["recomputed"] is True
    assert written["gpuMemoryUtilization"]["planned"] == 0.92
    assert written["gpuMemoryUtilization"]["actual"] < 0.92
    assert written["command"] == execs[0][1]


def test_entrypoint_refuses_without_exec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    execs: list[Any] = []
    env = {"KVTUNE_PLAN": pool_plan("B200").model_dump_json(),
           "KVTUNE_STATUS_FILE": str(tmp_path / "report.json")}
    rc = run([], env, [gpu(H100)], exec_fn=lambda f, a: execs.append(a))
    assert rc == EXIT_REFUSED and execs == []
    assert "refusing to start" in capsys.readouterr().err
    assert json.loads((tmp_path / "report.json").read_text())["reason"] == "WrongGpuClass"
    assert run([], {}, [gpu(H100)]) == EXIT_BAD_PLAN


def test_report_goes_under_the_pods_name_into_the_reports_config_map(tmp_path: Path) -> None:
    seen: dict[str, Any] = {"methods": []}
    # 200 reports already there (MAX_REPORTS): the oldest one is dropped to make room.
    old = {f"pod-{i:03d}": json.dumps({"time": f"2026-11-30T01:{i // 60:02d}:{i % 60:02d}"})
           for i in range(report.MAX_REPORTS)}

    class Api(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen["methods"].append("GET")
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"data": old}).encode())

        def do_PATCH(self) -> None:
            seen["methods"].append("PATCH")
            seen["path"] = self.path
            seen["auth"] = self.headers["Authorization"]
            seen["type"] = self.headers["Content-Type"]
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sa = tmp_path / "sa"
        sa.mkdir()
        (sa / "token").write_text("tok\n")
        (sa / "namespace").write_text("llm")
        env = {"POD_NAME": "bot-0", "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KVTUNE_SERVICEACCOUNT_DIR": str(sa),
               "KVTUNE_API_URL": f"http://127.0.0.1:{server.server_port}",
               "KVTUNE_STATUS_FILE": str(tmp_path / "r.json")}
        where = report.publish({"started": True}, env)
    finally:
        server.shutdown()
    assert where == "ConfigMap llm/kvtune-runtime-reports key bot-0"
    assert seen["methods"] == ["GET", "PATCH"]
    assert seen["path"] == "/api/v1/namespaces/llm/configmaps/kvtune-runtime-reports"
    assert seen["auth"] == "Bearer tok" and seen["type"] == "application/merge-patch+json"
    data = seen["body"]["data"]
    assert json.loads(data["bot-0"]) == {"started": True}
    assert {k for k, v in data.items() if v is None} == {"pod-000"}  # the oldest
    assert not (tmp_path / "r.json").exists()
    # API unreachable: falls back to the file and says why.
    env["KVTUNE_API_URL"] = "http://127.0.0.1:1"
    assert report.publish({"started": True}, env).startswith(f"file {tmp_path / 'r.json'}")


def test_entrypoint_refuses_a_plan_for_another_images_gpu_class(tmp_path: Path) -> None:
    env = {"KVTUNE_PLAN": pool_plan("H200").model_dump_json(),
           "KVTUNE_IMAGE_GPU_CLASS": "B200", "KVTUNE_STATUS_FILE": str(tmp_path / "r.json")}
    assert run([], env, [gpu(H200)], exec_fn=lambda f, a: None) == EXIT_REFUSED
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["reason"] == "WrongRuntimeImage"
    assert "kvtune-vllm-h200 image" in written["message"]


def test_gpu_check_script_prints_nvml_next_to_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    monkeypatch.delenv("KVTUNE_PLAN", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec = importlib.util.spec_from_file_location(
        "gpu_check", Path(__file__).resolve().parents[2] / "runtime_images/gpu_check.py")
    assert spec and spec.loader
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    busy = FakeNvml([("NVIDIA H200", H200[1], 100 * GIB, (9, 0))])
    assert gpu_check.main([], nvml=busy) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "100.00 GiB" in out and '"recomputed": true' in out
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(pool_plan("B200").model_dump_json())
    assert gpu_check.main(["--plan", str(plan_file)], nvml=busy) == 3
    assert "REFUSED (WrongGpuClass)" in capsys.readouterr().out


class FakeMigNvml(FakeNvml):
    """One H100 in MIG mode with a 3g.40gb instance: the instance's memory is what counts."""

    def nvmlDeviceGetMigMode(self, h: Any) -> tuple[int, int]:
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, i: int) -> Any:
        if i == 1:
            raise RuntimeError("NVMLError_NotFound")  # an empty slot
        return ("mig", h, i)

    def nvmlDeviceGetName(self, h: Any) -> bytes:
        if isinstance(h, tuple):
            return b"NVIDIA H100 80GB HBM3 MIG 3g.40gb"
        return super().nvmlDeviceGetName(h)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> SimpleNamespace:
        if isinstance(h, tuple):
            return SimpleNamespace(total=40 * GIB, free=39 * GIB, used=GIB)
        return super().nvmlDeviceGetMemoryInfo(h)


def test_mig_instances_are_read_instead_of_the_whole_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeMigNvml([("NVIDIA H100 80GB HBM3", 80 * GIB, 79 * GIB, (9, 0))])
    (found,) = gpus.read_gpus(fake)
    assert found == gpus.GpuInfo(0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40 * GIB, 39 * GIB,
                                 (9, 0), mig=True)
    assert gpus.class_of(found) == "H100"


def test_operator_render_to_runtime_entrypoint_end_to_end(tmp_path: Path) -> None:
    """runtime_images/pod-template.yaml.j2 rendered by the operator's real renderer, then
    the rendered container (its env and args) run through the entrypoint on a busy H200."""
    from kvtune.operator.render.objects import RenderInput, render_pool

    pool = pool_plan("H200")
    template = (Path(__file__).resolve().parents[2] / "runtime_images/pod-template.yaml.j2")
    objects = render_pool(RenderInput(
        name="bot", namespace="llm", pool="h200", pool_plan=pool, model_name=pool.model_id,
        image="unused", replicas=1, revision=3, pod_template=template.read_text(),
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"}))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/kvtune/kvtune-vllm-h200:0.1.0-vllm0.33.0"
    assert container["command"] == ["python3", "-m", "kvtune.runtime"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    execs: list[list[str]] = []
    rc = run(container["args"],
             {"KVTUNE_PLAN": env["KVTUNE_PLAN"]["value"], "KVTUNE_IMAGE_GPU_CLASS": "H200",
              "KVTUNE_STATUS_FILE": str(tmp_path / "r.json")},
             [gpu(H200, free_bytes=110 * GIB)], exec_fn=lambda f, a: execs.append(a))
    assert rc == 0
    (command,) = execs
    assert command[:3] == ["vllm", "serve", pool.model_id]
    assert "--port=8000" in command and "--tensor-parallel-size=1" in command
    util = [a for a in command if a.startswith("--gpu-memory-utilization=")]
    assert len(util) == 1 and float(util[0].split("=")[1]) < 0.92
    # Everything else is exactly what the operator rendered.
    assert [a for a in command[2:] if a not in util] == [
        a for a in container["args"] if not a.startswith("--gpu-memory-utilization=")]


def test_a_driver_that_reserves_more_shrinks_the_kv_cache_not_the_fraction() -> None:
    # The plan assumed the H100's 79.6 GiB; this driver/ECC setting leaves 77 GiB total.
    plan = parse_plan(pool_plan("H100", util=0.9).model_dump_json())
    smaller = ("NVIDIA H100 80GB HBM3", 77 * GIB, (9, 0))
    d = decisions.decide(plan, [gpu(smaller, free_bytes=76 * GIB)])
    assert not d.recomputed and d.gpu_memory_utilization == 0.9
    assert d.kv_cache_bytes == int(77 * GIB * 0.9) - 40 * GIB
    assert d.kv_cache_bytes < plan.expected.kv_cache_bytes
    assert any("of the" in n and "planned" in n for n in d.notes)


def test_a_bad_reserve_setting_is_a_clear_error(tmp_path: Path) -> None:
    env = {"KVTUNE_PLAN": pool_plan("H200").model_dump_json(),
           "KVTUNE_CONTEXT_RESERVE_BYTES": "1GiB", "KVTUNE_STATUS_FILE": str(tmp_path / "r")}
    assert run([], env, [gpu(H200)], exec_fn=lambda f, a: None) == EXIT_BAD_PLAN


def test_an_unwritable_report_does_not_stop_vllm(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {"KVTUNE_PLAN": pool_plan("H200").model_dump_json(),
           "KVTUNE_STATUS_FILE": str(blocker / "report.json")}  # a file as the parent dir
    execs: list[Any] = []
    assert run([], env, [gpu(H200)], exec_fn=lambda f, a: execs.append(a)) == 0
    assert execs, "vLLM must still be exec'd"


def test_no_nvml_is_a_refusal_not_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    # What nvidia-ml-py raises in a container without the driver library (seen in the runtime
    # image built by kvtune.e2e.images when no GPU runtime mounts libnvidia-ml.so.1).
    class NVMLError_LibraryNotFound(Exception):  # pynvml's own name
        pass

    def no_library() -> list[gpus.GpuInfo]:
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    import kvtune.runtime.__main__ as entry

    monkeypatch.setattr(entry, "read_gpus", no_library)
    monkeypatch.setattr(entry, "write_termination_message", lambda message: None)
    monkeypatch.setenv("KVTUNE_STATUS_FILE", str(tmp_path / "r.json"))
    monkeypatch.delenv("POD_NAME", raising=False)
    assert entry.main() == EXIT_REFUSED
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["started"] is False and written["reason"] == "NvmlUnavailable"
    assert "NVMLError_LibraryNotFound: NVML Shared Library Not Found" in written["message"]
    assert "NVIDIA container runtime" in written["message"]
