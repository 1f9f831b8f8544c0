"""kvtune's images built here from their Dockerfiles, and run here, without a registry.

No registry is reachable from CI, so the Dockerfiles' bases are made on this machine:

- a Debian bookworm root filesystem from Debian's own packages (``mmdebstrap``: python3 3.11,
  pip, CA certificates), imported into podman's storage under the name Dockerfile.operator
  starts ``FROM`` (a stand-in for ``python:3.11-slim-bookworm``);
- the same root filesystem plus pydantic and a stand-in ``vllm`` executable that records its
  argv (``e2e/standins/vllm``), under the name the runtime Dockerfiles start ``FROM`` (a
  stand-in for ``vllm/vllm-openai``: no vLLM, no CUDA).

The Dockerfiles in ``runtime_images/`` are then built unchanged by buildah (chroot
isolation); their ``pip install`` steps read a wheelhouse downloaded once from PyPI, pinned to
the versions of the running virtualenv, instead of the index. Each piece is cached under
``~/.cache/kvtune/images`` by the digest of its inputs, so a rerun on the same sources takes
seconds.

Running a container here needs three settings podman does not make by default; each is
explained where it is made (``run_argv``) and in docs/images.md with podman's exact errors.

    python -m kvtune.e2e.images [--oci-dir DIR]   builds both images, prints their tags
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kvtune.e2e.binaries import cache_dir
from kvtune.e2e.errors import ClusterError

REPO = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).resolve().parent / "standins"
SUITE = "bookworm"
# python3-pip because the Dockerfiles run `python3 -m pip install`; PEP 668's marker is removed
# because the python:slim base the operator image names has none (pip installs system-wide).
MMDEBSTRAP_ARGS = (
    "--variant=minbase",
    "--include=python3,python3-pip,ca-certificates",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
)
OPERATOR_DOCKERFILE = "Dockerfile.operator"
RUNTIME_DOCKERFILE = "Dockerfile.h200"
# What the operator's compile stage needs beyond the Debian base (the full python image has
# them): mypyc's C compiler, Python's headers, and venv (Debian ships it apart).
COMPILE_PACKAGES = ("gcc", "libc6-dev", "python3-dev", "python3-venv")
# The Debian packages the build and the run need (scripts/setup.sh packages installs them).
DEBIAN_PACKAGES = ("mmdebstrap", "podman", "buildah", "crun")
# A container may lower its limits but not raise them: this machine's root lacks
# CAP_SYS_RESOURCE, and podman's defaults (nofile 1048576, nproc 4194304) are higher.
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")


def images_dir() -> Path:
    return cache_dir() / "images"


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _run(argv: Sequence[str], what: str, log: Path, env: dict[str, str] | None = None) -> None:
    """Run one build step; its output goes to ``log``; a failure names the step and the log."""
    with log.open("a") as out:
        out.write(f"# {' '.join(argv)}\n")
        out.flush()
        result = subprocess.run(list(argv), stdout=out, stderr=subprocess.STDOUT, check=False,
                                env={**os.environ, **(env or {})})
    if result.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-6:])
        raise ClusterError(what, f"exit {result.returncode}: {tail}", log)


@dataclass(frozen=True)
class Store:
    """podman's and buildah's storage for these images only (not the machine's default)."""

    root: Path

    def flags(self) -> list[str]:
        return ["--root", str(self.root / "storage"), "--runroot", str(self.root / "run"),
                "--storage-driver", "overlay"]

    def podman(self, *args: str) -> list[str]:
        return ["podman", *self.flags(), *args]

    def buildah(self, *args: str) -> list[str]:
        return ["buildah", *self.flags(), *args]

    def exists(self, tag: str) -> bool:
        return subprocess.run(self.podman("image", "exists", tag), check=False,
                              capture_output=True).returncode == 0


@dataclass
class Built:
    """The two images' tags and how long each step took this time (0 when cached)."""

    operator: str
    runtime: str
    store: Store
    seconds: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build at a time per cache (two test processes may ask at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def require_tools() -> None:
    missing = [t for t in ("mmdebstrap", "podman", "buildah", "unshare") if not shutil.which(t)]
    if missing:
        raise ClusterError("images", f"{', '.join(missing)} not on PATH. Fix: run "
                           "`scripts/setup.sh packages` (apt-get install "
                           f"{' '.join(DEBIAN_PACKAGES)})")
    if os.geteuid() != 0:
        raise ClusterError("images", "building the base with mmdebstrap and running podman needs "
                           "root here. Fix: run as root (as CI does)")


# --- the wheel -----------------------------------------------------------------------------

def _pyproject(repo: Path) -> dict[str, object]:
    return tomllib.loads((repo / "pyproject.toml").read_text())


def _package_dirs(repo: Path) -> dict[str, str]:
    tool = _pyproject(repo).get("tool", {})
    assert isinstance(tool, dict)
    mapping: dict[str, str] = tool.get("setuptools", {}).get("package-dir", {})
    return mapping


def _source_files(repo: Path) -> list[str]:
    """What goes into the wheel: pyproject, setup.py (which finds the packages under the
    package-dir folders), the README pyproject names, the package folders."""
    folders = sorted(set(_package_dirs(repo).values()))
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
         "--", *folders], capture_output=True, check=True).stdout.decode()
    files = [p for p in listed.split("\0") if p and (repo / p).is_file()]
    top = [p for p in ("pyproject.toml", "setup.py", "README.md") if (repo / p).is_file()]
    return sorted({*top, *files})


def source_digest(repo: Path) -> str:
    return _digest(*(part for p in _source_files(repo) for part in (p, (repo / p).read_bytes())))


def build_wheel(repo: Path, out_dir: Path, log: Path) -> Path:
    """kvtune's wheel from a copy of the sources (what git tracks, plus files not ignored)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvtune-wheel-") as tmp:
        src = Path(tmp)
        for rel in _source_files(repo):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, src / rel)
        uv = Path(sys.executable).parent / "uv"
        argv = ([str(uv), "build", "--wheel", "--out-dir", str(out_dir), str(src)] if uv.exists()
                else [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out_dir),
                      str(src)])
        _run(argv, "building kvtune's wheel", log)
    (wheel,) = out_dir.glob("kvtune-*-py3-none-any.whl")
    return wheel


# --- the wheelhouse the Dockerfiles' pip installs read ----------------------------------------

def _dockerfile_pins(repo: Path) -> list[str]:
    """The ``name==version`` pins the Dockerfiles install besides the wheel."""
    pins: set[str] = set()
    for name in (OPERATOR_DOCKERFILE, RUNTIME_DOCKERFILE):
        text = (repo / "runtime_images" / name).read_text()
        pins.update(re.findall(r'"([A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+)"', text))
    return sorted(pins)


def _constraints(pins: Sequence[str] = ()) -> str:
    """The running virtualenv's versions: the images get what the tests ran against, except
    where a Dockerfile pins its own (``pins``: the dev extra's mypy may be newer than the one
    the operator image compiles with)."""
    own = {"kvtune", *(pin.split("==")[0].lower() for pin in pins)}
    lines = {f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
             if d.metadata["Name"] and d.metadata["Name"].lower() not in own}
    return "\n".join(sorted(lines, key=str.lower)) + "\n"


def ensure_wheelhouse(repo: Path, wheel: Path, log: Path) -> tuple[Path, float]:
    project = _pyproject(repo).get("project", {})
    assert isinstance(project, dict)
    pins = _dockerfile_pins(repo)
    constraints = _constraints(pins)
    extra = ["pydantic"]  # the stand-in vLLM base's (the real one ships it)
    key = _digest(repr(project.get("dependencies")), constraints, *pins, *extra)
    house = images_dir() / f"wheels-{key}"
    if (house / ".complete").exists():
        return house, 0.0
    start = time.monotonic()
    house.mkdir(parents=True, exist_ok=True)
    (house / "constraints.txt").write_text(constraints)
    _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--dest",
          str(house), "-c", str(house / "constraints.txt"), str(wheel), *pins, *extra],
         "downloading the images' wheels from PyPI", log)
    # Not the kvtune wheel itself: each build context carries its own.
    for own in house.glob("kvtune-*.whl"):
        own.unlink()
    (house / "pip.conf").write_text("[global]\nno-index = true\nfind-links = /wheels\n")
    (house / ".complete").write_text("")
    return house, time.monotonic() - start


# --- the bases -----------------------------------------------------------------------------

def _from_names(repo: Path, dockerfile: str) -> list[str]:
    """The images a Dockerfile's stages start ``FROM``, in order."""
    text = (repo / "runtime_images" / dockerfile).read_text()
    return [str(name) for name in re.findall(r"^FROM (\S+)", text, re.M)]


def _qualified(name: str) -> str:
    """podman's spelling of a short name (python:3.11 is docker.io/library/python:3.11)."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def debian_base_tag() -> str:
    return f"localhost/kvtune-debian-base:{_digest(SUITE, *MMDEBSTRAP_ARGS)}"


def ensure_debian_base(store: Store, log: Path) -> tuple[str, float]:
    tag = debian_base_tag()
    key = tag.rsplit(":", 1)[1]
    if store.exists(tag):
        return tag, 0.0
    start = time.monotonic()
    tar = images_dir() / f"debian-{SUITE}-{key}.tar"
    if not tar.exists():
        partial = tar.with_suffix(".partial.tar")
        _run(["mmdebstrap", *MMDEBSTRAP_ARGS, SUITE, str(partial)],
             f"mmdebstrap {SUITE} (the Debian base)", log)
        partial.rename(tar)
    _run(store.podman("import", "--change", 'CMD ["python3"]', str(tar), tag),
         "podman import of the Debian base", log)
    return tag, time.monotonic() - start


def _tag_as(store: Store, tag: str, name: str, log: Path) -> None:
    """The Dockerfile's FROM name points at our base (``--pull=never``: nothing is fetched)."""
    _run(store.podman("tag", tag, _qualified(name)), f"podman tag {name}", log)


def _bud(store: Store, dockerfile: Path, context: Path, tag: str, house: Path | None,
         build_args: dict[str, str], log: Path) -> None:
    args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
    # chroot isolation: the RUN steps need no OCI runtime (see run_argv for why crun needs
    # help here). The wheelhouse and a pip.conf that points at it are mounted into RUN steps
    # only; they are not in the image.
    volumes = ([] if house is None else
               [f"--volume={house}:/wheels:ro", f"--volume={house / 'pip.conf'}:/etc/pip.conf:ro"])
    _run(store.buildah("bud", "--isolation=chroot", "--pull-never", *ULIMITS, *args, *volumes,
                       "--file", str(dockerfile), "--tag", tag, str(context)),
         f"buildah bud {dockerfile.name}", log)


def _ensure_base(store: Store, family: str, key: str, containerfile: str, log: Path, *,
                 house: Path | None = None, files: Sequence[Path] = ()) -> tuple[str, float]:
    """A stand-in base ``localhost/family:key``, built from ``containerfile`` (with ``files``
    in its context) unless the storage has it; (its tag, the seconds the build took)."""
    tag = f"localhost/{family}:{key}"
    if store.exists(tag):
        return tag, 0.0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"{family}-") as tmp:
        context = Path(tmp)
        for path in files:
            shutil.copy2(path, context / path.name)
        (context / "Containerfile").write_text(containerfile)
        _bud(store, context / "Containerfile", context, tag, house, {}, log)
    return tag, time.monotonic() - start


def ensure_standin_runtime_base(store: Store, debian: str, house: Path,
                                log: Path) -> tuple[str, float]:
    pydantic = importlib.metadata.version("pydantic")
    script = (STANDINS / "vllm").read_bytes()
    return _ensure_base(
        store, "kvtune-vllm-standin-base", _digest(debian, pydantic, script),
        f"FROM {debian}\n"
        f'RUN python3 -m pip install --no-cache-dir "pydantic=={pydantic}"\n'
        "COPY vllm /usr/local/bin/vllm\n"
        "RUN chmod 0755 /usr/local/bin/vllm\n", log, house=house, files=[STANDINS / "vllm"])


def ensure_standin_compile_base(store: Store, debian: str, log: Path) -> tuple[str, float]:
    """The stand-in for the full ``python`` image Dockerfile.operator compiles the simulator
    in: the Debian base with a C compiler, Python's headers and venv, from Debian's mirror."""
    return _ensure_base(
        store, "kvtune-python-compile-base", _digest(debian, *COMPILE_PACKAGES),
        f"FROM {debian}\n"
        "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        f"--no-install-recommends {' '.join(COMPILE_PACKAGES)} >/dev/null "
        "&& rm -rf /var/lib/apt/lists/*\n", log)


# --- the images ----------------------------------------------------------------------------

def _build_image(store: Store, repo: Path, dockerfile: str, tag: str, wheel: Path,
                 house: Path, log: Path) -> None:
    version = str(_pyproject(repo)["project"]["version"])  # type: ignore[index]
    with tempfile.TemporaryDirectory(prefix="kvtune-context-") as tmp:
        context = Path(tmp)
        (context / "dist").mkdir()
        # The Dockerfiles COPY dist/kvtune-${KVTUNE_VERSION}-py3-none-any.whl.
        shutil.copy2(wheel, context / "dist" / f"kvtune-{version}-py3-none-any.whl")
        _bud(store, repo / "runtime_images" / dockerfile, context, tag, house,
             {"KVTUNE_VERSION": version}, log)


def ensure_images(repo: Path = REPO) -> Built:
    """Both images, built when their inputs changed; a warm call costs a few seconds."""
    require_tools()
    root = images_dir()
    store = Store(root)
    log = root / "build.log"
    with _locked(root / ".lock"):
        debian = debian_base_tag()
        docker = [(repo / "runtime_images" / n).read_bytes()
                  for n in (OPERATOR_DOCKERFILE, RUNTIME_DOCKERFILE)]
        key = _digest(debian, source_digest(repo), _constraints(), *docker,
                      (STANDINS / "vllm").read_bytes(), *COMPILE_PACKAGES)
        built = Built(f"localhost/kvtune-operator:{key}",
                      f"localhost/kvtune-vllm-h200-standin:{key}", store)
        if store.exists(built.operator) and store.exists(built.runtime):
            return built
        # The Debian base (minutes when cold, mostly apt) while the wheel and the wheelhouse
        # are made: they do not depend on each other.
        with ThreadPoolExecutor(max_workers=1) as pool:
            base = pool.submit(ensure_debian_base, store, root / "mmdebstrap.log")
            start = time.monotonic()
            wheel = build_wheel(repo, root / "dist" / key, log)
            built.seconds["wheel"] = time.monotonic() - start
            house, built.seconds["wheelhouse"] = ensure_wheelhouse(repo, wheel, log)
            _, built.seconds["debian_base"] = base.result()
        standin, built.seconds["standin_base"] = ensure_standin_runtime_base(
            store, debian, house, log)
        compile_base, built.seconds["compile_base"] = ensure_standin_compile_base(
            store, debian, log)
        # Each stage's FROM names our stand-in: the operator's compile stage the Debian base
        # with a compiler, its last stage (python:slim) the Debian base itself.
        for name, tag, bases in ((OPERATOR_DOCKERFILE, built.operator, (compile_base, debian)),
                                 (RUNTIME_DOCKERFILE, built.runtime, (standin,))):
            start = time.monotonic()
            froms = _from_names(repo, name)
            if len(froms) != len(bases):
                raise ClusterError("images", f"runtime_images/{name} has {len(froms)} FROM "
                                   f"lines, kvtune.e2e.images makes {len(bases)} stand-in "
                                   "bases for it. Fix: give ensure_images a base per stage")
            for from_name, base_tag in zip(froms, bases, strict=True):
                _tag_as(store, base_tag, from_name, log)
            _build_image(store, repo, name, tag, wheel, house, log)
            built.seconds[name] = time.monotonic() - start
        shutil.rmtree(root / "dist" / key, ignore_errors=True)
        _prune(store, (debian, standin, compile_base, built.operator, built.runtime), log)
        return built


def _prune(store: Store, keep: Sequence[str], log: Path) -> None:
    """Older builds of the same images (~0.5 GB each) go; the ones just built stay."""
    families = {tag.rsplit(":", 1)[0] for tag in keep}
    listed = subprocess.run(store.podman("images", "--format", "{{.Repository}}:{{.Tag}}"),
                            capture_output=True, text=True, check=False).stdout.split()
    stale = [ref for ref in listed if ref.rsplit(":", 1)[0] in families and ref not in keep]
    if stale:
        _run(store.podman("rmi", *stale), "podman rmi of older builds", log)


def run_argv(store: Store, image: str, args: Sequence[str], *,
             env: dict[str, str] | None = None, volumes: Sequence[str] = (),
             name: str | None = None, read_only: bool = False,
             entrypoint: str | None = None, user: str | None = None) -> list[str]:
    """The command that runs ``image`` here with podman and crun, attached (signals reach the
    container: podman proxies them).

    Three settings this machine needs (docs/images.md quotes the errors without them):
    ``--ulimit`` lowers the limits (root here lacks CAP_SYS_RESOURCE to keep podman's higher
    defaults); the hybrid cgroup layout (v1 controllers plus a cgroup2 mount at
    /sys/fs/cgroup/unified), which crun 1.8 refuses, is hidden by unmounting the cgroup2 mount
    in a private mount namespace of this command only; and ``--cgroups=disabled`` because no
    cgroup manager is usable. The network is the host's: the control plane is on loopback.
    """
    argv = store.podman("run", "--rm", "--network=host", "--cgroups=disabled", *ULIMITS)
    if name:
        argv.append(f"--name={name}")
    if read_only:
        argv += ["--read-only", "--tmpfs=/tmp"]
    if entrypoint:
        argv.append(f"--entrypoint={entrypoint}")
    if user:
        argv.append(f"--user={user}")
    for key, value in (env or {}).items():
        argv.append(f"--env={key}={value}")
    for volume in volumes:
        argv.append(f"--volume={volume}")
    argv += [image, *args]
    hide = ("mountpoint -q /sys/fs/cgroup/unified && umount /sys/fs/cgroup/unified; "
            'exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", hide, "sh",
            *argv]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtune.e2e.images", description=__doc__)
    parser.add_argument("--oci-dir", type=Path,
                        help="also write each image as an OCI image layout into this folder")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        built = ensure_images()
        if args.oci_dir:
            for tag in (built.operator, built.runtime):
                name = tag.split("/")[-1].replace(":", "-")
                _run(built.store.podman("save", "--format=oci-dir", "-o",
                                        str(args.oci_dir / name), tag),
                     f"podman save {tag}", images_dir() / "build.log")
    except ClusterError as err:
        print(f"kvtune images: {err}", file=sys.stderr)
        return 1
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in built.seconds.items())
    print(f"operator image: {built.operator}\nruntime image:  {built.runtime}\n"
          f"took {time.monotonic() - start:.0f} s ({steps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
