#!/usr/bin/env bash
# Makes the real csi-addons sidecar available for the end-to-end tests that run it beside the
# healer sidecar.
#
#   hack/csi-addons-sidecar.sh     build the sidecar if missing, print the path of the binary
#
# The sidecar is the main package github.com/csi-addons/kubernetes-csi-addons/sidecar at the
# version go.mod requires, the module whose CSIAddonsNode CRD the tests' control plane installs.
# It is built from the Go module proxy as its release is (without cgo, version and commit stamped
# in), with the dependency versions its own go.mod pins, in a throwaway module that requires only
# kubernetes-csi-addons: its go.mod lists every dependency and has no replace directives, so the
# throwaway module selects exactly those versions, and this project's go.mod and go.sum stay as
# they are. (`go install pkg@version` would build the same, but it also asks the proxy for the
# module's list of versions, to look for a deprecation notice, which a restricted proxy refuses.)
# The binary lands in .cache/bin/csi-addons-sidecar, which git ignores, next to a stamp holding its
# version: a second run finds both and returns at once. The first build takes about four minutes
# of CPU time, and some 20 seconds to download the modules.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${root}/.cache/bin"
module=github.com/csi-addons/kubernetes-csi-addons
target="${bin}/csi-addons-sidecar"

cd "${root}"
version="$(go list -m -f '{{.Version}}' "${module}")"
if [ -x "${target}" ] && [ "$(cat "${target}.version" 2>/dev/null)" = "${version}" ]; then
  echo "${target}"
  exit 0
fi

mkdir -p "${bin}"
# One build at a time per checkout: the test packages that go test runs in parallel may ask at once.
if command -v flock >/dev/null 2>&1; then
  exec 9>"${bin}/.csi-addons-sidecar.lock"
  flock 9
  if [ -x "${target}" ] && [ "$(cat "${target}.version" 2>/dev/null)" = "${version}" ]; then
    echo "${target}"
    exit 0
  fi
fi

log() { echo "csi-addons-sidecar: $*" >&2; }
log "building ${module}/sidecar ${version} from the Go module proxy (a few minutes the first time)"
# A throwaway module beside the target, whose binary is renamed into place: a concurrent run never
# executes a half-written binary.
work="$(mktemp -d "${bin}/.build-csi-addons-sidecar.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
(
  cd "${work}"
  export GOFLAGS=-buildvcs=false CGO_ENABLED=0
  go mod init build-csi-addons-sidecar >/dev/null 2>&1
  echo "require ${module} ${version}" >> go.mod
  cat > tools.go <<GO
//go:build tools

package tools

import _ "${module}/sidecar"
GO
  go mod tidy >&2
  # The commit of the tag, from the proxy's .info file of the version.
  info="$(go mod download -json "${module}" | sed -n 's/.*"Info": "\(.*\)",/\1/p')"
  commit="$(sed -n 's/.*"Hash":"\([0-9a-f]*\)".*/\1/p' "${info}")"
  go build -trimpath -o csi-addons-sidecar \
    -ldflags "-X ${module}/internal/version.Version=${version} -X ${module}/internal/version.GitCommit=${commit}" \
    "${module}/sidecar" >&2
) || { log "building ${module}/sidecar@${version} failed (the go output above says why)"; exit 1; }
mv -f "${work}/csi-addons-sidecar" "${target}"
echo "${version}" > "${target}.version"
echo "${target}"
