#!/usr/bin/env bash
# Build kvtune's vLLM runtime images, one per GPU class, on the pinned vllm/vllm-openai base.
#
#   runtime_images/build.sh [--registry REG] [--tag TAG] [--push] [--print] [h100 h200 b200 operator]
#
# Builds kvtune's wheel (dist/, no dependencies inside: the image uses vLLM's pydantic), then
# each image with docker, podman or buildah, whichever is installed, tagged
# REG/kvtune-vllm-<class>:TAG, and the operator image REG/kvtune-operator:VERSION (the chart's
# default image). --print only prints the commands (no engine needed).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
registry=ghcr.io/kvtune
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)
tag="$version-vllm0.33.0"
push=0
print=0
classes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --push) push=1; shift ;;
    --print) print=1; shift ;;
    h100|h200|b200|operator) classes+=("$1"); shift ;;
    *) echo "build.sh: unknown argument '$1' (expected --registry, --tag, --push, --print, h100, h200, b200 or operator)" >&2; exit 2 ;;
  esac
done
[ ${#classes[@]} -gt 0 ] || classes=(h100 h200 b200 operator)

engine=""
for candidate in docker podman buildah; do
  if command -v "$candidate" >/dev/null; then engine=$candidate; break; fi
done
if [ "$print" = 0 ] && [ -z "$engine" ]; then
  echo "build.sh: no container engine found (expected docker, podman or buildah on PATH); use --print to see the commands" >&2
  exit 1
fi
engine=${engine:-docker}
build_verb=build
[ "$engine" = buildah ] && build_verb=bud

run() {
  echo "+ $*"
  if [ "$print" = 0 ]; then "$@"; fi
}

run "$repo/.venv/bin/python" -m pip wheel --no-deps --wheel-dir "$repo/dist" "$repo"
for class in "${classes[@]}"; do
  image="$registry/kvtune-vllm-$class:$tag"
  [ "$class" = operator ] && image="$registry/kvtune-operator:$version"
  run "$engine" "$build_verb" --file "$repo/runtime_images/Dockerfile.$class" \
    --build-arg "KVTUNE_VERSION=$version" --tag "$image" "$repo"
  if [ "$push" = 1 ]; then run "$engine" push "$image"; fi
done
