#!/usr/bin/env bash
# Builds the real control-plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok, helm) from the Go module proxy, pinned by the go.mod/go.sum files under
# e2e/gomod/, and caches them by version under ${KVTUNE_CACHE:-~/.cache/kvtune}/bin/<version>/.
# A cached binary is never rebuilt; a cold build takes 15-40 minutes on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVTUNE_CACHE:-$HOME/.cache/kvtune}
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -mod=mod"

# The version a go.mod requires, whether as `require M V` or inside a `require (...)` block.
required() { awk -v m="$2" '($1=="require" && $2==m) {print $3; exit} ($1==m && $2 ~ /^v/) {print $2; exit}' "$here/gomod/$1/go.mod"; }
k8s_version=$(required k8s k8s.io/kubernetes)
etcd_version=$(required etcd go.etcd.io/etcd/server/v3)
kwok_version=$(required kwok sigs.k8s.io/kwok)
helm_version=$(required helm helm.sh/helm/v3)

log() { printf '[build-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# build NAME VERSION MODULE_DIR LDFLAGS PACKAGE...
build() {
  local name=$1 version=$2 dir=$3 ldflags=$4; shift 4
  local out="$cache/bin/$name-$version"
  if [ -f "$out/.complete" ]; then log "$name $version: cached in $out"; return 0; fi
  log "$name $version: building into $out (cold builds take minutes) ..."
  mkdir -p "$out.tmp"
  local start=$SECONDS
  if ! (cd "$dir" && go build -ldflags "$ldflags" -o "$out.tmp/" "$@"); then
    log "$name $version: BUILD FAILED in $dir (go build $*); nothing was cached"
    rm -rf "$out.tmp"; return 1
  fi
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.complete"
  log "$name $version: built in $((SECONDS - start))s"
}

k8s_ld="-s -w"
minor=$(echo "$k8s_version" | cut -d. -f2)
for kv in "gitVersion=$k8s_version" gitMajor=1 "gitMinor=$minor" gitTreeState=clean; do
  k8s_ld="$k8s_ld -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done

want=${*:-etcd kube kwok helm}
for w in $want; do
  case $w in
    etcd) build etcd "$etcd_version" "$here/gomod/etcd" "-s -w" go.etcd.io/etcd/server/v3 ;;
    kube) build kube "$k8s_version" "$here/gomod/k8s" "$k8s_ld" \
            k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
            k8s.io/kubernetes/cmd/kube-scheduler ;;
    kwok) build kwok "$kwok_version" "$here/gomod/kwok" "-s -w" sigs.k8s.io/kwok/cmd/kwok ;;
    helm) build helm "$helm_version" "$here/gomod/helm" "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version" helm.sh/helm/v3/cmd/helm ;;
    *) log "unknown component '$w' (choose from: etcd kube kwok helm)"; exit 2 ;;
  esac
done
