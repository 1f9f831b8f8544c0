#!/usr/bin/env bash
# mypy --strict on every part: the tuner, quality, the operator, e2e, replay, the oracle, the cli
# and the runtime entrypoint. The folders are mapped
# to import names by setuptools (tuner/ -> kvtune.tuner), which mypy cannot follow through the
# editable-install hook, so it reads a tree of links that spells them (scripts/import_shim.py).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
shim=$(.venv/bin/python scripts/import_shim.py)
# mypy's incremental cache, shared by every checkout on this machine (a CI run's clean clone
# too): a module whose source hash, options and mypy version match its entry is not checked
# again, whatever its path or mtime (mypy's own rule), so a warm run checks only what changed.
# SQLite, so two checkouts checking at once do not interleave their entries.
cache=${KVTUNE_MYPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtune/mypy}
mkdir -p "$cache"
MYPYPATH="$shim" exec .venv/bin/mypy --config-file pyproject.toml --sqlite-cache --cache-dir "$cache" -p kvtune.tuner -p kvtune.quality -p kvtune.operator -p kvtune.e2e -p kvtune.replay \
  -p kvtune.oracle -p kvtune.cli -p kvtune.runtime "$@"
