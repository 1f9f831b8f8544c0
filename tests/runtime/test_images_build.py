"""kvtune.e2e.images' pure parts (no root, no podman): how a Dockerfile's FROM name is
spelled in podman's storage, which pins the wheelhouse must hold, and what decides a rebuild.
Building and running: test_images_run.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kvtune.e2e import images

REPO = Path(__file__).resolve().parents[2]


def _repo(tmp_path: Path, packages: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "1"\n'
        '[tool.setuptools.package-dir]\n"kvtune" = "pkg"\n"kvtune.operator" = "op"\n'
        f"[tool.setuptools]\n{packages}\n")
    for folder in ("pkg", "op", "op/rollout", "op/rollout/steps", "op/templates"):
        (tmp_path / folder).mkdir(parents=True)
    for init in ("pkg", "op", "op/rollout", "op/rollout/steps"):
        (tmp_path / init / "__init__.py").write_text("")
    return tmp_path


def test_from_names_as_podman_stores_them() -> None:
    assert images._qualified("python:3.11.14-slim-bookworm") == (
        "docker.io/library/python:3.11.14-slim-bookworm")
    assert images._qualified("vllm/vllm-openai:v0.33.0") == "docker.io/vllm/vllm-openai:v0.33.0"
    assert images._qualified("ghcr.io/kvtune/x:1") == "ghcr.io/kvtune/x:1"
    # The operator's compile stage, then the slim stage it ships.
    assert images._from_names(REPO, images.OPERATOR_DOCKERFILE) == [
        "python:3.11.14-bookworm", "python:3.11.14-slim-bookworm"]
    assert images._from_names(REPO, images.RUNTIME_DOCKERFILE) == ["vllm/vllm-openai:v0.33.0"]


def test_the_wheelhouse_holds_the_dockerfiles_pins() -> None:
    pins = images._dockerfile_pins(REPO)
    assert "nvidia-ml-py==13.615.71" in pins
    mypy = next(pin for pin in pins if pin.startswith("mypy=="))
    # A Dockerfile's own pin wins over the running venv's version of the same package (the
    # dev extra's mypy may be newer): the download would otherwise ask for both.
    constraints = images._constraints(pins).splitlines()
    assert not any(line.lower().startswith("mypy==") for line in constraints), mypy
    assert any(line.lower().startswith("mypy==") for line in images._constraints().splitlines())


def test_what_goes_into_the_wheel_decides_a_rebuild(tmp_path: Path) -> None:
    repo = _repo(tmp_path, 'packages = ["kvtune", "kvtune.operator"]')
    (repo / "README.md").write_text("x\n")
    (repo / "op" / "a.py").write_text("A = 1\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "x.md").write_text("x\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    before = images.source_digest(repo)
    (repo / "docs" / "x.md").write_text("changed\n")  # not in the wheel: no rebuild
    assert images.source_digest(repo) == before
    (repo / "op" / "a.py").write_text("A = 2\n")
    assert images.source_digest(repo) != before


def test_containers_run_with_the_settings_this_machine_needs() -> None:
    argv = images.run_argv(images.Store(Path("/s")), "img:1", ["operator"], read_only=True)
    # The cgroup2 mount is hidden only in the podman command's own mount namespace.
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert "umount /sys/fs/cgroup/unified" in argv[7]
    run = argv[argv.index("podman"):]
    assert run[-2:] == ["img:1", "operator"]
    for flag in ("--cgroups=disabled", "--network=host", "--read-only", "--tmpfs=/tmp"):
        assert flag in run
    assert run[run.index("--ulimit") + 1] == "nofile=1024:1024"
