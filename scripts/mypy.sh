#!/usr/bin/env bash
# mypy --strict on kvtune.tuner and kvtune.quality. The folders are mapped to import names by
# setuptools (tuner/ -> kvtune.tuner), which mypy cannot follow through the editable-install
# hook, so it reads a small tree of links that spells the import names (scripts/import_shim.py).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
shim=$(.venv/bin/python scripts/import_shim.py)
MYPYPATH="$shim" exec .venv/bin/mypy --config-file pyproject.toml -p kvtune.tuner -p kvtune.quality "$@"
