#!/usr/bin/env bash
# Copy the generated CRDs (crds/ at the repo root, written by `kvtune crds --write`) into the
# chart. tests/chart/test_chart.py fails while the two differ.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
dest="$repo/charts/kvtune/files/crds"
mkdir -p "$dest"
rm -f "$dest"/*.yaml
cp "$repo"/crds/*.yaml "$dest"/
echo "copied $(ls "$repo"/crds/*.yaml | wc -l) CRD file(s) into $dest"
