#!/usr/bin/env bash
# mypy --strict on every part: the tuner, quality, the operator, e2e, replay, the oracle, the cli
# and the runtime entrypoint. The folders are mapped
# to import names by setuptools (tuner/ -> kvtune.tuner), which mypy cannot follow through the
# editable-install hook, so it reads a tree of links that spells them (scripts/import_shim.py).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
shim=$(.venv/bin/python scripts/import_shim.py)
MYPYPATH="$shim" exec .venv/bin/mypy --config-file pyproject.toml -p kvtune.tuner -p kvtune.quality -p kvtune.operator -p kvtune.e2e -p kvtune.replay \
  -p kvtune.oracle -p kvtune.cli -p kvtune.runtime "$@"
