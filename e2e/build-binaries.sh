#!/usr/bin/env bash
# Builds the real control-plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok, helm, the Gateway API Inference Extension's endpoint picker, and the
# LeaderWorkerSet controller manager) from the Go module proxy, pinned by the go.mod/go.sum files under
# e2e/gomod/, and caches them by version under ${KVTUNE_CACHE:-~/.cache/kvtune}/bin/<name>-<version>/.
# A cached binary is never rebuilt; a cold build takes 15-40 minutes on 2 cores.
#
#   e2e/build-binaries.sh                 all components
#   e2e/build-binaries.sh etcd kwok       only these (etcd kube kwok helm epp lws)
#
# Each component's `go build -v` output goes to $cache/logs/build-<name>-<version>.log; on failure
# the last lines and that path are printed and the exit status is 1. Concurrent callers (the
# setup script and a test run, say) are serialised per component by flock, so a second caller
# waits for the first build and then finds it cached instead of building it twice.
# KVTUNE_GOMOD_DIR overrides the directory of the pinning modules (the tests use a broken one).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVTUNE_CACHE:-$HOME/.cache/kvtune}
gomod=${KVTUNE_GOMOD_DIR:-$here/gomod}
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -mod=mod"

log() { printf '[build-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if ! command -v go >/dev/null; then
  log "FAILED: 'go' is not on PATH; install Go 1.26 or newer (https://go.dev/dl/) and re-run $0"
  exit 1
fi

# The version a go.mod requires, whether as `require M V` or inside a `require (...)` block.
required() {
  local v
  v=$(awk -v m="$2" '($1=="require" && $2==m) {print $3; exit} ($1==m && $2 ~ /^v/) {print $2; exit}' "$gomod/$1/go.mod" 2>/dev/null || true)
  if [ -z "$v" ]; then log "FAILED: $gomod/$1/go.mod does not require $2; fix that go.mod"; exit 1; fi
  echo "$v"
}

# build NAME VERSION MODULE_DIR LDFLAGS PACKAGE...
build() {
  local name=$1 version=$2 dir=$3 ldflags=$4; shift 4
  local out="$cache/bin/$name-$version"
  local logfile="$cache/logs/build-$name-$version.log"
  mkdir -p "$cache/bin" "$cache/logs"
  exec {lock}>"$cache/bin/.$name-$version.lock"
  flock "$lock"
  # etcd's main package is go.etcd.io/etcd/server/v3, which `go build` names `server`.
  if [ -f "$out/.complete" ] && [ -f "$out/server" ] && [ ! -e "$out/etcd" ]; then mv "$out/server" "$out/etcd"; fi
  if [ -f "$out/.complete" ]; then log "$name $version: cached in $out"; exec {lock}>&-; return 0; fi
  log "$name $version: building into $out (cold builds take minutes; log: $logfile)"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  local start=$SECONDS rc=0
  # -v prints each package as it is compiled: a progress line every 100 packages.
  (cd "$dir" && go build -v -ldflags "$ldflags" -o "$out.tmp/" "$@") >"$logfile" 2>&1 &
  local pid=$!
  tail -n +1 -F --pid="$pid" "$logfile" 2>/dev/null \
    | awk -v n="$name" '{c++} c%100==0 {printf "[build-binaries] %s: %d packages compiled\n", n, c > "/dev/stderr"}' || true
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    log "FAILED: $name $version: go build exited with status $rc in $dir; nothing was cached. Last lines:"
    tail -n 15 "$logfile" | sed 's/^/    /' >&2
    log "FAILED: $name $version: full log: $logfile"
    rm -rf "$out.tmp"; exec {lock}>&-; return 1
  fi
  if [ -f "$out.tmp/server" ] && [ "$name" = etcd ]; then mv "$out.tmp/server" "$out.tmp/etcd"; fi
  # LWS's main package is sigs.k8s.io/lws/cmd, which `go build` names `cmd`.
  if [ -f "$out.tmp/cmd" ] && [ "$name" = lws ]; then mv "$out.tmp/cmd" "$out.tmp/lws-controller"; fi
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.complete"
  log "$name $version: built in $((SECONDS - start))s"
  exec {lock}>&-
}

want=${*:-etcd kube kwok helm epp lws}
for w in $want; do
  case $w in
    etcd) v=$(required etcd go.etcd.io/etcd/server/v3) || exit 1
      build etcd "$v" "$gomod/etcd" "-s -w" go.etcd.io/etcd/server/v3 ;;
    kube)
      k8s_version=$(required k8s k8s.io/kubernetes) || exit 1
      # Stamp the version so that clients and `/version` do not report v0.0.0.
      k8s_ld="-s -w"
      minor=$(echo "$k8s_version" | cut -d. -f2)
      for kv in "gitVersion=$k8s_version" gitMajor=1 "gitMinor=$minor" gitTreeState=clean; do
        k8s_ld="$k8s_ld -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
      done
      build kube "$k8s_version" "$gomod/k8s" "$k8s_ld" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler ;;
    kwok) v=$(required kwok sigs.k8s.io/kwok) || exit 1
      build kwok "$v" "$gomod/kwok" "-s -w" sigs.k8s.io/kwok/cmd/kwok ;;
    helm)
      helm_version=$(required helm helm.sh/helm/v3) || exit 1
      # As helm's own Makefile: the Kubernetes version that `helm template` and `helm lint`
      # assume without --kube-version is stamped from client-go (v0.34 -> 1.34); unstamped it is
      # 1.20, below the chart's kubeVersion. The cache key names it, so an unstamped build
      # cached before is not reused (e2e/binaries.py computes the same key).
      client_go=$(required helm k8s.io/client-go) || exit 1
      kube_minor=$(echo "$client_go" | cut -d. -f2)
      kube_major=$(( $(echo "${client_go#v}" | cut -d. -f1) + 1 ))
      helm_ld="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
      for pkg in pkg/chartutil pkg/lint/rules; do
        helm_ld="$helm_ld -X helm.sh/helm/v3/$pkg.k8sVersionMajor=$kube_major -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$kube_minor"
      done
      build helm "$helm_version-kube$kube_major.$kube_minor" "$gomod/helm" "$helm_ld" helm.sh/helm/v3/cmd/helm ;;
    epp) v=$(required gie sigs.k8s.io/gateway-api-inference-extension) || exit 1
      # The endpoint picker that reads the routing configuration kvtune renders (tests run it).
      build epp "$v" "$gomod/gie" "-s -w" sigs.k8s.io/gateway-api-inference-extension/cmd/epp ;;
    lws) v=$(required lws sigs.k8s.io/lws) || exit 1
      # The LeaderWorkerSet controller manager: the multi-node tests run it against the
      # local API server, so the leader and worker pods and the LWS status are its own.
      build lws "$v" "$gomod/lws" "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$v" sigs.k8s.io/lws/cmd ;;
    *) log "FAILED: unknown component '$w' (choose from: etcd kube kwok helm epp lws)"; exit 2 ;;
  esac
done
