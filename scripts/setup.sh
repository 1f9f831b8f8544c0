#!/usr/bin/env bash
# Installs everything kvtune's demo and tests need, idempotently: Debian packages
# (prometheus + promtool, lua5.1 for the Argo CD health check, mmdebstrap, buildah, podman and
# crun for the images built here), a virtualenv with kvtune, its
# dev tools and vLLM 0.33.0 itself (the kvtune[vllm] extra, for the differential tests), the
# pinned vLLM wheel's source files (for the contract tests), and the Go-built
# control-plane binaries (cached under ~/.cache/kvtune; a cold build takes a long time).
#   scripts/setup.sh            everything
#   scripts/setup.sh python     only the virtualenv
#   scripts/setup.sh packages   only the Debian packages
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
what=${1:-all}
log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v lua5.1 >/dev/null || need_apt+=(lua5.1)
# mypyc's C compiler (scripts/compile_simulator.py; tests/simulator/test_sim_mypyc.py).
command -v gcc >/dev/null || need_apt+=(gcc)
# The images built and run here (kvtune.e2e.images, docs/images.md): a Debian base from
# Debian's packages, the Dockerfiles built by buildah, run by podman with crun.
for tool in mmdebstrap podman buildah crun; do
  command -v "$tool" >/dev/null || need_apt+=("$tool")
done
# Debian's packages start their daemons (a system Prometheus on :9090, and its node exporter
# where that is installed too); the tests start their own Prometheus. Only what this install
# started is stopped: a daemon or unit that was running or enabled before is left as it was.
daemons=(prometheus prometheus-node-exporter)
# PIDs of processes whose executable is one of the daemons (not a name match on any command).
daemon_pids() {
  local d exe name
  for d in /proc/[0-9]*; do
    exe=$(readlink "$d/exe" 2>/dev/null) || continue
    for name in "${daemons[@]}"; do
      [ "${exe##*/}" = "$name" ] && echo "${d#/proc/}"
    done
  done
  return 0
}
unit_state() { systemctl "$1" "$2" 2>/dev/null || true; }
if { [ "$what" = all ] || [ "$what" = packages ]; } && [ ${#need_apt[@]} -gt 0 ]; then
  pids_before=$(daemon_pids)
  declare -A active_before enabled_before
  if command -v systemctl >/dev/null; then
    for unit in "${daemons[@]}"; do
      active_before[$unit]=$(unit_state is-active "$unit")
      enabled_before[$unit]=$(unit_state is-enabled "$unit")
    done
  fi
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  if command -v systemctl >/dev/null; then
    for unit in "${daemons[@]}"; do
      if [ "${active_before[$unit]}" != active ] && [ "$(unit_state is-active "$unit")" = active ]; then
        log "stopping $unit (started by this install)"
        systemctl stop "$unit" >/dev/null 2>&1 || true
      fi
      if [ "${enabled_before[$unit]}" != enabled ] && [ "$(unit_state is-enabled "$unit")" = enabled ]; then
        systemctl disable "$unit" >/dev/null 2>&1 || true
      fi
    done
  fi
  # Without systemd the maintainer scripts start the daemons directly.
  for pid in $(daemon_pids); do
    if ! grep -qx "$pid" <<<"$pids_before"; then
      log "stopping $(readlink "/proc/$pid/exe" 2>/dev/null || echo "pid $pid") (started by this install)"
      kill "$pid" 2>/dev/null || true
    fi
  done
fi
[ "$what" = packages ] && exit 0

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.kvtune-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # kvtune[vllm] brings vLLM 0.33.0 and torch (~9 GB installed): the differential tests drive
  # vLLM's own scheduler ([quality]'s torch and transformers come with it). uv unpacks each
  # wheel once into a shared cache and hardlinks it into every venv, so a second checkout
  # costs seconds and ~0.5 GB, not another 9 GB. A local wheel folder
  # (~/.cache/kvtune/wheels-vllm, from `pip download vllm==0.33.0`) is used first when
  # present; PyPI otherwise.
  log "installing kvtune[dev,quality,vllm] (cold: ~4 GB of wheels to download; warm: seconds)"
  .venv/bin/pip install -q 'uv>=0.9,<1'
  export UV_CACHE_DIR=${UV_CACHE_DIR:-$HOME/.cache/kvtune/uv}
  wheels=$HOME/.cache/kvtune/wheels-vllm
  links=()
  [ -d "$wheels" ] && links=(--find-links "$wheels")
  .venv/bin/uv pip install -q --python .venv/bin/python "${links[@]}" -e '.[dev,quality,vllm]'
  touch "$stamp"
fi
[ "$what" = python ] && exit 0

.venv/bin/python scripts/fetch_vllm_source.py || log "WARNING: could not fetch the vLLM wheel; the contract tests will fail"
log "building the control-plane binaries (cached after the first build)"
e2e/build-binaries.sh
log "ready"
