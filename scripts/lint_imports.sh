#!/usr/bin/env bash
# import-linter's contracts ([tool.importlinter] in pyproject.toml: what each part may import;
# docs/architecture.md) over the import names, read through scripts/import_shim.py's tree.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
shim=$(.venv/bin/python scripts/import_shim.py)
PYTHONPATH="$shim" exec .venv/bin/lint-imports --no-cache "$@"
