"""kvtune's images built here and run here (issue 21, item 3).

kvtune.e2e.images makes the Dockerfiles' bases from Debian's own packages (mmdebstrap), builds
runtime_images/Dockerfile.operator and Dockerfile.h200 unchanged with buildah, and runs them
with podman and crun. The operator image runs its mypyc-compiled simulator with the checkout's
Python results, and reconciles an InferenceDeployment on the local control plane, as a
non-root user on a read-only root (the chart's pod security context); the
runtime image's entrypoint checks a plan against a fake NVML and execs the stand-in ``vllm``
with the planned flags, or refuses a GPU the plan was not made for.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from op_cluster_helpers import (
    OperatorProcess,
    condition,
    create_infd,
    get_infd,
    prepare_namespaces,
    wait_for,
)
from op_samples import SAMPLE_SPEC, make_pool_plan

from kvtune.e2e.images import STANDINS, Built, ensure_images, run_argv
from kvtune.e2e.traces import TRACES_DIR
from kvtune.runtime import decisions, gpus
from kvtune.runtime.runtime_plan import parse_plan

pytestmark = [pytest.mark.image, pytest.mark.slow]
MIB = 1024**2
H200_TOTAL = 143771 * MIB


@pytest.fixture(scope="module")
def images() -> Built:
    return ensure_images()


# --- the runtime image: kvtune's layer on the stand-in vLLM base ------------------------------

def _run_runtime(images: Built, out: Path, plan_json: str,
                 devices: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    out.mkdir(mode=0o777, exist_ok=True)
    out.chmod(0o777)  # whatever user the image runs as may write the reports there
    env = {"KVTUNE_PLAN": plan_json, "KVTUNE_FAKE_NVML": json.dumps(devices),
           # The fake NVML shadows the nvidia-ml-py the Dockerfile installed.
           "PYTHONPATH": "/fake-nvml", "VLLM_STANDIN_ARGV": "/out/vllm-argv.json",
           "KVTUNE_STATUS_FILE": "/out/status.json"}
    argv = run_argv(images.store, images.runtime, ["meta-llama/Llama-3.1-8B-Instruct",
                                                   "--port", "8000"],
                    env=env, volumes=[f"{STANDINS}:/fake-nvml:ro", f"{out}:/out"])
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def _h200(free_bytes: int) -> dict[str, Any]:
    return {"name": "NVIDIA H200", "total_bytes": H200_TOTAL, "free_bytes": free_bytes,
            "compute_capability": [9, 0]}


def test_runtime_image_execs_vllm_with_the_planned_flags(images: Built, tmp_path: Path) -> None:
    plan_json = make_pool_plan().model_dump_json()
    free = H200_TOTAL - 600 * MIB
    result = _run_runtime(images, tmp_path / "out", plan_json, [_h200(free)])
    assert result.returncode == 0, result.stderr
    assert "found GPU 0 'NVIDIA H200' (SM 9.0" in result.stderr
    # What the entrypoint exec'd is what it decides in-process for the same plan and GPU.
    plan = parse_plan(plan_json)
    gpu = gpus.GpuInfo(index=0, name="NVIDIA H200", total_bytes=H200_TOTAL, free_bytes=free,
                       compute_capability=(9, 0))
    expected = decisions.build_command(plan, decisions.decide(plan, [gpu]),
                                       ["meta-llama/Llama-3.1-8B-Instruct", "--port", "8000"])
    recorded = json.loads((tmp_path / "out" / "vllm-argv.json").read_text())
    assert recorded[0] == "/usr/local/bin/vllm"  # the stand-in, found on the image's PATH
    assert recorded[1:] == expected[1:]
    assert "--kv-cache-dtype=fp8" in recorded and "--block-size=32" in recorded
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    assert status["started"] is True and status["command"] == expected


def test_runtime_image_refuses_a_gpu_the_plan_was_not_made_for(images: Built,
                                                                tmp_path: Path) -> None:
    h100 = {"name": "NVIDIA H100 80GB HBM3", "total_bytes": 81559 * MIB,
            "free_bytes": 81000 * MIB, "compute_capability": [9, 0]}
    result = _run_runtime(images, tmp_path / "out", make_pool_plan().model_dump_json(), [h100])
    assert result.returncode == 3, result.stderr  # EXIT_REFUSED
    assert "refusing to start meta-llama/Llama-3.1-8B-Instruct on H200" in result.stderr
    assert not (tmp_path / "out" / "vllm-argv.json").exists()
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    assert status["started"] is False and status["reason"] == "WrongGpuClass"


def test_runtime_image_without_nvml_refuses_in_one_line(images: Built, tmp_path: Path) -> None:
    # The real nvidia-ml-py the Dockerfile installs, and no libnvidia-ml.so.1 (no GPU runtime).
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    argv = run_argv(images.store, images.runtime, ["meta-llama/Llama-3.1-8B-Instruct"],
                    env={"KVTUNE_PLAN": make_pool_plan().model_dump_json(),
                         "KVTUNE_STATUS_FILE": "/out/status.json"}, volumes=[f"{out}:/out"])
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert "NVMLError_LibraryNotFound" in result.stderr
    assert json.loads((out / "status.json").read_text())["reason"] == "NvmlUnavailable"


def test_runtime_image_refuses_a_plan_for_another_image_class(images: Built,
                                                               tmp_path: Path) -> None:
    # The image is Dockerfile.h200's: KVTUNE_IMAGE_GPU_CLASS=H200 is baked in.
    plan_json = make_pool_plan().model_copy(update={"gpu_class": "H100"}).model_dump_json()
    result = _run_runtime(images, tmp_path / "out", plan_json, [_h200(H200_TOTAL)])
    assert result.returncode == 3, result.stderr
    assert "this image is built for H200 (KVTUNE_IMAGE_GPU_CLASS)" in result.stderr


# --- the operator image: its simulator compiled, and against the local control plane ----------

PROBE = Path(__file__).resolve().parents[1] / "simulator" / "mypyc_probe.py"


def _probe_json(argv: list[str]) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_operator_image_runs_the_compiled_simulator_with_the_pythons_results(
        images: Built) -> None:
    """The search Jobs run in the operator image: its first stage compiled the scheduler with
    mypyc, and what runs there, as the chart runs it (user 65532, read-only root), is that
    build, with the checkout's Python results to the last bit on 16 configurations."""
    argv = run_argv(images.store, images.operator, ["/probe/mypyc_probe.py", "/traces"],
                    read_only=True, entrypoint="python3",
                    volumes=[f"{PROBE.parent}:/probe:ro", f"{TRACES_DIR}:/traces:ro"])
    in_image = _probe_json(argv)
    here = _probe_json([sys.executable, str(PROBE), str(TRACES_DIR)])
    assert in_image.pop("compiled") is True and here.pop("compiled") is False
    assert len(here) == 16 and here.keys() == in_image.keys()
    differ = [k for k in here if json.dumps(here[k]) != json.dumps(in_image[k])]
    assert not differ, differ



class ImageOperator(OperatorProcess):
    """``kvtune operator`` from the operator image: podman runs it as the image's user on a
    read-only root, with the host's network (the API server is on loopback)."""

    def __init__(self, images: Built, kubeconfig: Path, namespaces: list[str], log: Path) -> None:
        super().__init__(kubeconfig, namespaces, log)
        self.images = images
        self.name = f"kvtune-operator-test-{uuid.uuid4().hex[:8]}"
        # The image runs as 65532; the test's kubeconfig is root's 0600.
        self.config_dir = log.parent / "kubeconfig"
        self.config_dir.mkdir(exist_ok=True)
        (self.config_dir / "kubeconfig").write_bytes(kubeconfig.read_bytes())
        (self.config_dir / "kubeconfig").chmod(0o644)

    def start(self) -> None:
        self.starts += 1
        args = ["operator", "--kubeconfig", "/etc/kvtune/kubeconfig", "--standalone",
                "--metrics-port", str(self.metrics_port)]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        argv = run_argv(self.images.store, self.images.operator, args, name=self.name,
                        read_only=True,
                        env={"KVTUNE_CONFIGMAP_RESYNC_SECONDS": "2",
                             "KVTUNE_PROMETHEUS_ALLOWED_URLS": "http://127.0.0.1:*"},
                        volumes=[f"{self.config_dir}:/etc/kvtune:ro"])
        with self.log.open("a") as out:
            out.write(f"\n=== start #{self.starts} ===\n")
        self.proc = subprocess.Popen(argv, stdout=self.log.open("a"), stderr=subprocess.STDOUT)

    def stop(self) -> None:
        super().stop()  # SIGTERM to podman, which passes it to the container
        subprocess.run(self.images.store.podman("rm", "--force", "--ignore", self.name),
                       capture_output=True, check=False, timeout=60)


@pytest.fixture(scope="module")
def image_operator(images: Built, local_cluster: Any,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageOperator]:
    prepare_namespaces(local_cluster, "img-operator")
    log = Path(tmp_path_factory.mktemp("image-operator")) / "operator.log"
    proc = ImageOperator(images, Path(local_cluster.kubeconfig_path), ["img-operator"], log)
    proc.start()
    yield proc
    proc.stop()


@pytest.mark.cluster
def test_operator_image_reconciles_an_inference_deployment(
        local_cluster: Any, image_operator: ImageOperator) -> None:
    api, ns = local_cluster.api_client(), "img-operator"
    create_infd(api, ns, "support-bot", copy.deepcopy(SAMPLE_SPEC))

    def ready() -> dict[str, Any] | None:
        obj = get_infd(api, ns, "support-bot")
        ok = condition(obj, "Ready")
        return obj if ok is not None and ok["status"] == "True" else None

    # The first start compiles the simulator's loops into the tmpfs /tmp (numba's cache).
    obj = wait_for(ready, "Ready=True from the operator image", 240, image_operator.log)
    assert condition(obj, "Ready")["reason"] == "AllPoolsApplied"  # type: ignore[index]
    deployments = client.AppsV1Api(api).list_namespaced_deployment(
        ns, label_selector="kvtune.io/deployment").items
    assert sorted(d.metadata.name for d in deployments) == ["support-bot-h100",
                                                             "support-bot-h200"]
    for dep in deployments:
        owner = dep.metadata.owner_references[0]
        assert (owner.kind, owner.name) == ("InferenceDeployment", "support-bot")
    with urllib.request.urlopen(image_operator.metrics_url, timeout=10) as resp:
        metrics = resp.read().decode()
    assert 'kvtune_pools{name="support-bot",namespace="img-operator",phase="Applied"} 2.0' \
        in metrics
    assert image_operator.proc is not None and image_operator.proc.poll() is None
