"""Fetch the pinned vLLM wheel (no deps, no GPU needed) and unpack its Python sources into the
cache, so contract tests can read ``vllm/config/cache.py`` & co. without importing vLLM.

    python scripts/fetch_vllm_source.py [VERSION]    # prints the unpacked root

The version defaults to the one kvtune pins (kvtune.tuner.facts.capabilities.PINNED_VLLM_VERSION
when it exists, else 0.33.0). Idempotent: a complete unpack is never redone.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from pathlib import Path

DEFAULT_VERSION = "0.33.0"


def cache_root() -> Path:
    return Path(os.environ.get("KVTUNE_CACHE", Path.home() / ".cache" / "kvtune"))


def source_dir(version: str) -> Path:
    return cache_root() / f"vllm-src-{version}"


def fetch(version: str) -> Path:
    out = source_dir(version)
    if (out / ".complete").exists():
        return out
    # Two test processes (pytest -n 2) may ask at once: one downloads and unpacks, the other
    # waits and finds the unpack complete (both would extract into the same .tmp otherwise).
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".vllm-src-{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / ".complete").exists():
            return out
        return _download_and_unpack(version, out)


def _download_and_unpack(version: str, out: Path) -> Path:
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    matches = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not matches:
        print(f"downloading vllm=={version} (about 340 MB, once) ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
             f"vllm=={version}"],
            check=True,
        )
        matches = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not matches:
        raise SystemExit(f"pip download vllm=={version} produced no wheel in {wheels}")
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(matches[0]) as zf:
        for name in zf.namelist():
            if name.endswith(".py"):
                zf.extract(name, tmp)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    (out / ".complete").touch()
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "fetch"]
    print(fetch(args[0] if args else DEFAULT_VERSION))
