#!/usr/bin/env bash
# Makes a real Kubernetes node available for the real-cluster suite (test/cluster) and the demo:
# kubelet, kube-controller-manager and kube-scheduler next to the kube-apiserver and etcd of
# hack/control-plane.sh, containerd with its runc shim, and the CSI sidecars the reference
# driver's controller plugin runs (external-provisioner, external-attacher).
#
#   hack/node.sh            build or install what is missing, print the folder that holds it all
#   hack/node.sh --check    say why this machine cannot run a node (exit 1), or nothing (exit 0)
#
# Where each piece comes from:
#
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy
#       k8s.io/kubernetes at KUBE_VERSION, every staging module replaced by its published version,
#       as hack/control-plane.sh builds kube-apiserver (all four in one build).
#   containerd, ctr, containerd-shim-runc-v2
#       github.com/containerd/containerd/v2 at CONTAINERD_VERSION, static (CGO off), without the
#       btrfs, devmapper and zfs snapshotters.
#   csi-provisioner, csi-attacher
#       github.com/kubernetes-csi/external-provisioner/v6 and external-attacher/v4, put into
#       images by hack/images (no registry can be reached to pull them).
#   runc, the CNI plugins bridge, host-local and loopback
#       Debian's runc and containernetworking-plugins packages (apt-get).
#
# Everything built lands in .cache/node/<KUBE_VERSION>/ (git ignored), each binary next to a stamp
# of its version: a second run finds them and returns at once. A cold run takes about 15 minutes
# on 2 cores; the kubelet build shares most of its packages with kube-apiserver's.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
PROVISIONER_VERSION="${PROVISIONER_VERSION:-v6.4.0}"
ATTACHER_VERSION="${ATTACHER_VERSION:-v4.13.0}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${root}/.cache/node/${KUBE_VERSION}"
mkdir -p "${out}"

log() { echo "node: $*" >&2; }

# shellcheck source=hack/lib/kubernetes.sh
. "${root}/hack/lib/kubernetes.sh"

# check says why a node cannot run here, on stdout, and fails; it prints nothing when one can.
check() {
  local why=()
  [ "$(id -u)" = 0 ] || why+=("not root")
  [ -c /dev/fuse ] || why+=("no /dev/fuse")
  [ -d /sys/fs/cgroup ] || why+=("no /sys/fs/cgroup")
  command -v unshare >/dev/null 2>&1 || why+=("no unshare")
  if [ "${#why[@]}" -gt 0 ]; then
    local IFS=,
    echo "${why[*]}"
    return 1
  fi
}

if [ "${1:-}" = --check ]; then
  check
  exit $?
fi

fresh() { # fresh <binary> <version>: the binary exists and was built at version
  [ -x "${out}/$1" ] && [ "$(cat "${out}/$1.version" 2>/dev/null)" = "$2" ]
}
stamp() { echo "$2" > "${out}/$1.version"; }

# new_module <work>: a throwaway module in the folder work, so that this project's go.mod and go.sum
# stay as they are.
new_module() {
  local work="$1"
  rm -rf "${work}" && mkdir -p "${work}"
  local name; name="$(basename "${work}")"
  (cd "${work}" && GOFLAGS= go mod init "build-${name#.build-}" >/dev/null 2>&1)
}

build_kube() {
  local cmds=(kubelet kube-controller-manager kube-scheduler kube-proxy) missing=0
  for c in "${cmds[@]}"; do fresh "${c}" "${KUBE_VERSION}" || missing=1; done
  [ "${missing}" = 1 ] || return 0
  local work="${out}/.build-kube"
  new_module "${work}"
  log "building ${cmds[*]} ${KUBE_VERSION} from the Go module proxy (about 10 minutes cold)"
  (cd "${work}" && kubernetes_build "${work}/bin" "${KUBE_VERSION}" "${cmds[@]/#/k8s.io/kubernetes/cmd/}")
  for c in "${cmds[@]}"; do
    mv -f "${work}/bin/${c}" "${out}/${c}"
    stamp "${c}" "${KUBE_VERSION}"
  done
  rm -rf "${work}"
}

build_containerd() {
  local cmds=(containerd ctr containerd-shim-runc-v2) missing=0
  for c in "${cmds[@]}"; do fresh "${c}" "${CONTAINERD_VERSION}" || missing=1; done
  [ "${missing}" = 1 ] || return 0
  local work="${out}/.build-containerd"
  new_module "${work}"
  log "building containerd ${CONTAINERD_VERSION} from the Go module proxy (about 3 minutes cold)"
  (
    cd "${work}"
    export GOFLAGS=-buildvcs=false CGO_ENABLED=0
    local mod=github.com/containerd/containerd/v2
    local tags="no_btrfs no_devmapper no_zfs urfave_cli_no_docs osusergo netgo static_build"
    local ldflags="-s -w -X ${mod}/version.Version=${CONTAINERD_VERSION} -X ${mod}/version.Package=${mod}"
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/containerd"\n\t_ "%s/cmd/ctr"\n\t_ "%s/cmd/containerd-shim-runc-v2"\n)\n' "${mod}" "${mod}" "${mod}" > tools.go
    echo "require ${mod} ${CONTAINERD_VERSION}" >> go.mod
    go mod tidy >&2
    mkdir -p bin
    go build -trimpath -tags "${tags}" -ldflags "${ldflags}" -o bin/ "${mod}/cmd/containerd" "${mod}/cmd/ctr" >&2
    # The shim talks ttrpc only; no_grpc keeps gRPC out of it, as containerd's release does.
    go build -trimpath -tags "${tags} no_grpc" -ldflags "${ldflags}" -o bin/ "${mod}/cmd/containerd-shim-runc-v2" >&2
  )
  for c in "${cmds[@]}"; do
    mv -f "${work}/bin/${c}" "${out}/${c}"
    stamp "${c}" "${CONTAINERD_VERSION}"
  done
  rm -rf "${work}"
}

# build_sidecar <binary> <module> <version> <command package>
build_sidecar() {
  local name="$1" mod="$2" version="$3" pkg="$4"
  fresh "${name}" "${version}" && return 0
  local work="${out}/.build-${name}"
  new_module "${work}"
  log "building ${name} ${version} from the Go module proxy"
  (
    cd "${work}"
    export GOFLAGS=-buildvcs=false CGO_ENABLED=0
    # The sidecar's own go.mod pins its dependencies; its replace directives, if any, are copied.
    local modfile
    modfile="$(go mod download -json "${mod}@${version}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
    echo "require ${mod} ${version}" >> go.mod
    sed -n '/^replace (/,/^)/p; /^replace [^(]/p' "${modfile}" >> go.mod
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "${pkg}" > tools.go
    go mod tidy >/dev/null 2>&1 || true
    go build -trimpath -ldflags "-s -w -X main.version=${version}" -o "bin/${name}" "${pkg}" >&2
  )
  mv -f "${work}/bin/${name}" "${out}/${name}"
  stamp "${name}" "${version}"
  rm -rf "${work}"
}

install_packages() {
  local need=()
  command -v runc >/dev/null 2>&1 || need+=(runc)
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  command -v iptables >/dev/null 2>&1 || need+=(iptables)
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  [ "${#need[@]}" -gt 0 ] || return 0
  log "installing ${need[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
}

# One build at a time per checkout: several suites may ask at once.
if command -v flock >/dev/null 2>&1; then
  exec 9>"${out}/.lock"
  flock 9
fi
if [ "$(id -u)" = 0 ]; then
  install_packages
fi
build_containerd
build_sidecar csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 "${PROVISIONER_VERSION}" \
  github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
build_sidecar csi-attacher github.com/kubernetes-csi/external-attacher/v4 "${ATTACHER_VERSION}" \
  github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher
build_kube
echo "${out}"
