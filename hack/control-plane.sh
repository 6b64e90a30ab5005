#!/usr/bin/env bash
# Makes a real kube-apiserver and etcd available for the tests and the demo.
#
#   hack/control-plane.sh          build or install what is missing, print the assets folder
#   KUBE_VERSION=v1.30.14 hack/control-plane.sh
#                                  the same for another release: make test-oldest builds the oldest
#                                  supported one (OLDEST_KUBE_VERSION of the Makefile) this way
#
# kube-apiserver is built from the Go module proxy (k8s.io/kubernetes at KUBE_VERSION, with every
# staging module replaced by its published version), and so is etcd (ETCD_VERSION, the etcd that
# Kubernetes ships with). Debian's etcd-server package (3.4.23) is not used: it cannot answer the
# watch progress requests that the apiserver needs to serve streaming lists, so every informer
# fell back to a full LIST, which current clusters no longer do. Both land in
# .cache/control-plane/<KUBE_VERSION>/, which git ignores: a second run finds them and returns at once.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# CONTROL_PLANE_CACHE: the folder holding one subfolder per version (default .cache/control-plane).
cache="${CONTROL_PLANE_CACHE:-${root}/.cache/control-plane}"
assets="${cache}/${KUBE_VERSION}"
mkdir -p "${assets}"

log() { echo "control-plane: $*" >&2; }

# shellcheck source=hack/lib/kubernetes.sh
. "${root}/hack/lib/kubernetes.sh"

staging_version() {
  # k8s.io/kubernetes v1.X.Y publishes its staging modules as v0.X.Y.
  echo "v0.${KUBE_VERSION#v1.}"
}

build_apiserver() {
  local work="${cache}/build-apiserver-${KUBE_VERSION}"
  rm -rf "${work}" && mkdir -p "${work}"
  log "building kube-apiserver ${KUBE_VERSION} from the Go module proxy (10 to 20 minutes on 2 cores)"
  (cd "${work}" && kubernetes_build "${work}/bin" "${KUBE_VERSION}" k8s.io/kubernetes/cmd/kube-apiserver)
  mv "${work}/bin/kube-apiserver" "${assets}/kube-apiserver"
  rm -rf "${work}"
}

build_etcd() {
  local work="${cache}/build-etcd-${KUBE_VERSION}"
  rm -rf "${work}" && mkdir -p "${work}"
  log "building etcd ${ETCD_VERSION} from the Go module proxy"
  (
    cd "${work}"
    go mod init build-etcd >/dev/null 2>&1
    cat >> go.mod <<MOD
require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 ${ETCD_VERSION}
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 ${ETCD_VERSION}
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 ${ETCD_VERSION}
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 ${ETCD_VERSION}
)
MOD
    cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
    go mod tidy >/dev/null 2>&1 || true
    CGO_ENABLED=0 go build -o "${assets}/etcd.tmp" go.etcd.io/etcd/server/v3
  )
  # Replace, not overwrite: a test may be running the old binary.
  mv -f "${assets}/etcd.tmp" "${assets}/etcd"
  echo "${ETCD_VERSION}" > "${assets}/etcd.version"
  rm -rf "${work}"
}

# The etcd of another release's folder, when it is the same ETCD_VERSION: etcd serves every
# kube-apiserver these scripts build, and its build takes minutes.
copy_etcd() {
  local stamp dir
  for stamp in "${cache}"/*/etcd.version; do
    dir="$(dirname "${stamp}")"
    [ "${dir}" != "${assets}" ] && [ -x "${dir}/etcd" ] && [ "$(cat "${stamp}")" = "${ETCD_VERSION}" ] || continue
    log "etcd ${ETCD_VERSION} from ${dir}"
    cp "${dir}/etcd" "${assets}/etcd.tmp"
    mv -f "${assets}/etcd.tmp" "${assets}/etcd"
    echo "${ETCD_VERSION}" > "${assets}/etcd.version"
    return 0
  done
  return 1
}

[ -x "${assets}/etcd" ] && [ "$(cat "${assets}/etcd.version" 2>/dev/null)" = "${ETCD_VERSION}" ] || copy_etcd || build_etcd
[ -x "${assets}/kube-apiserver" ] || build_apiserver
echo "${assets}"
