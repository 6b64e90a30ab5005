#!/usr/bin/env bash
# Makes the real `opa` binary available for the tests and benchmarks that compare the engine with it.
#
#   hack/opa.sh          build opa if missing, print the path of the binary
#
# opa is built from the Go module proxy at the version go.mod requires, so `opa test` and
# `opa run --server` run the same Rego as the controller. The binary lands in .cache/bin/, which git
# ignores, next to a stamp holding its version: a second run finds both and returns at once.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${root}/.cache/bin"
module=github.com/open-policy-agent/opa

cd "${root}"
version="$(go list -m -f '{{.Version}}' "${module}")"
if [ -x "${bin}/opa" ] && [ "$(cat "${bin}/opa.version" 2>/dev/null)" = "${version}" ]; then
  echo "${bin}/opa"
  exit 0
fi

mkdir -p "${bin}"
echo "opa: building ${module} ${version} (a few minutes the first time)" >&2
# go install module@version builds with opa's own go.mod, so this project's go.mod and go.sum (which
# hold only what the project imports) need no entry for the opa command's own dependencies. A
# throwaway GOBIN beside the target: a concurrent run never executes a half-written binary.
work="$(mktemp -d "${bin}/.build-opa.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
(cd "${work}" && GOBIN="${work}" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
  go install -trimpath "${module}@${version}" >&2)
mv -f "${work}/opa" "${bin}/opa"
echo "${version}" > "${bin}/opa.version"
echo "${bin}/opa"
