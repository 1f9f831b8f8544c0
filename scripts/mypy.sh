#!/usr/bin/env bash
# mypy --strict on kvtune.tuner and kvtune.quality. The folders are mapped to import names by setuptools
# (tuner/ -> kvtune.tuner), which mypy cannot follow through the editable-install hook, so give
# it a small tree of links that spells the import names.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
shim="$top/build/mypy-shim"
mkdir -p "$shim/kvtune"
ln -sfn "$top/kvtune_pkg/__init__.py" "$shim/kvtune/__init__.py"
for pair in tuner:tuner operator:operator cli:cli e2e:e2e replay:replay quality:quality; do
  ln -sfn "$top/${pair%%:*}" "$shim/kvtune/${pair##*:}"
done
cd "$top"
MYPYPATH="$shim" exec .venv/bin/mypy --config-file pyproject.toml -p kvtune.tuner -p kvtune.quality "$@"
